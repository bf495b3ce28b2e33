"""Padding: the tokens a step processes per example, and the time and cost that follow from them."""

from __future__ import annotations

import itertools
import math
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from services.estimator.estimate import estimate
from services.estimator.padding import (
    batch_row_tokens,
    data_tokens_per_processed_token,
    expected_longest,
    processed_tokens_per_example,
    run_samples,
)
from services.estimator.recipe import resolve_recipe
from tests.conftest import make_plan

DATA = {"examples": 10_000, "avg_tokens_per_example": 400}


def _monte_carlo_longest(mean: float, cap: int, batch: int, draws: int = 20_000) -> float:
    """E[max of ``batch``] by sampling the truncated exponential with the rate expected_longest solves for."""
    from services.estimator.padding import _rate_for_mean

    rate = _rate_for_mean(mean, cap)
    rng = random.Random(7)

    def draw() -> float:  # inverse CDF of exp(-rate x) on [0, cap]
        return -math.log1p(rng.random() * math.expm1(-rate * cap)) / rate

    return sum(max(draw() for _ in range(batch)) for _ in range(draws)) / draws


@pytest.mark.parametrize(("mean", "cap", "batch"), [(210, 768, 4), (100, 2048, 8), (1500, 2048, 4), (10, 100_000, 16)])
def test_expected_longest_matches_sampling(mean: float, cap: int, batch: int) -> None:
    assert expected_longest(mean, cap, batch) == pytest.approx(_monte_carlo_longest(mean, cap, batch), rel=0.02)


def test_expected_longest_limits() -> None:
    assert expected_longest(300.0, 2048, 1) == 300.0  # one sample: nothing to pad
    assert expected_longest(1024.0, 2048, 4) == pytest.approx(2048 * 4 / 5, rel=1e-6)  # mean cap/2: uniform
    assert expected_longest(5000.0, 2048, 4) == 2048.0  # every sample cut to the cap
    assert 300 < expected_longest(300.0, 2048, 2) < expected_longest(300.0, 2048, 8) < 2048


def test_processed_tokens_per_padding_mode() -> None:
    packed = make_plan(seq_len=2048, micro_batch_size=8, padding="packed", data=DATA)
    max_length = make_plan(seq_len=2048, micro_batch_size=8, padding="max-length", data=DATA)
    longest = make_plan(seq_len=2048, micro_batch_size=8, padding="longest", data=DATA)
    assert processed_tokens_per_example(packed, resolve_recipe(packed)) == 400
    assert processed_tokens_per_example(max_length, resolve_recipe(max_length)) == 2048
    row = processed_tokens_per_example(longest, resolve_recipe(longest))
    assert row == pytest.approx(expected_longest(400.0, 2048, 8))
    # Rows of a packed or max-length batch are seq_len long; under 'longest' they are the longest sample.
    assert batch_row_tokens(packed, resolve_recipe(packed)) == 2048
    assert batch_row_tokens(longest, resolve_recipe(longest)) == pytest.approx(row)
    assert data_tokens_per_processed_token(max_length, resolve_recipe(max_length)) == pytest.approx(400 / 2048)
    # Without a mean length the data set is taken to fill its rows (the behaviour before padding counted).
    no_mean = make_plan(seq_len=2048, micro_batch_size=8, padding="longest", data={"tokens": 4_000_000})
    assert processed_tokens_per_example(no_mean, resolve_recipe(no_mean)) is None
    assert data_tokens_per_processed_token(no_mean, resolve_recipe(no_mean)) == 1.0


def test_time_and_cost_count_the_padding() -> None:
    base = {"method": "lora", "lora": {"rank": 16}, "seq_len": 2048, "micro_batch_size": 8, "data": DATA}
    packed = estimate(make_plan(padding="packed", **base), "A100 80GB")
    padded = estimate(make_plan(padding="max-length", **base), "A100 80GB")
    longest = estimate(make_plan(padding="longest", **base), "A100 80GB")
    assert packed.throughput is not None and padded.throughput is not None and longest.throughput is not None
    assert packed.throughput.data_tokens_per_s == packed.throughput.tokens_per_s
    # Padding every sample to 2048 tokens processes 2048/400 tokens per data token at the same GPU rate.
    assert padded.throughput.data_tokens_per_s == pytest.approx(padded.throughput.tokens_per_s * 400 / 2048, rel=1e-3)
    # Shorter rows: the step is shorter, the data rate lies between the two.
    assert longest.throughput.step_seconds < padded.throughput.step_seconds
    rates = [e.throughput.data_tokens_per_s for e in (padded, longest, packed)]
    assert rates == sorted(rates) and len(set(rates)) == 3
    for e in (packed, padded, longest):
        cost = next(c for c in e.costs if c.gpu == "A100 80GB")
        assert cost.hours == pytest.approx(4_000_000 / cost.data_tokens_per_s / 3600, abs=1e-3)  # hours: 3 decimals
        assert cost.usd_per_million_tokens == pytest.approx(
            cost.on_demand_usd_per_hour / (cost.data_tokens_per_s * 3600) * 1e6, rel=2e-3
        )
    assert any("padding: every sample padded to seq_len 2048" in a for a in padded.assumptions)
    assert any("padded to its longest sample" in a for a in longest.assumptions)
    assert not any(a.startswith("padding:") for a in packed.assumptions)
    # Memory is sized on the longest batch, whatever the padding.
    assert longest.memory.peak_allocated_gib == padded.memory.peak_allocated_gib


def test_planner_hours_follow_the_data_rate() -> None:
    from services.planner.planner import plan_setups

    plan = make_plan(method="qlora", lora={"rank": 16}, seq_len=2048, padding="max-length", data=DATA)
    result = plan_setups(plan, top_n=1)
    best = result.recommendations[0]
    assert best.data_tokens_per_s == pytest.approx(best.tokens_per_s * 400 / 2048, rel=2e-3)


def test_cli_padding_flag_and_data_rate(tmp_path: Path) -> None:
    script = shutil.which("gpuplan", path=str(Path(sys.executable).parent))
    command = [script] if script else [sys.executable, "-m", "services.cli.main"]
    args = ["--model", "meta-llama/Llama-3.1-8B", "--method", "qlora", "--lora-rank", "16", "--seq-len", "2048"]
    args += ["--micro-batch-size", "4", "--gradient-checkpointing", "--gpu", "A100 80GB"]
    args += ["--examples", "10000", "--avg-tokens", "400", "--padding", "max-length"]
    run = subprocess.run([*command, "estimate", *args], capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "of which data tokens" in run.stdout and "padding: every sample padded to seq_len 2048" in run.stdout
    bad = subprocess.run([*command, "estimate", *args[:-1], "unpadded"], capture_output=True, text=True, cwd=tmp_path)
    assert bad.returncode == 2 and "--padding" in bad.stderr and "Traceback" not in bad.stderr


def test_planner_picks_a_smaller_micro_batch_when_padding_makes_it_faster() -> None:
    from services.planner.planner import plan_setups

    fields = {"method": "qlora", "lora": {"rank": 16}, "seq_len": 4096, "gradient_checkpointing": True}
    data = {"examples": 10_000, "avg_tokens_per_example": 300}
    plan = make_plan(micro_batch_size=8, data=data, **fields)  # hf-trainer: padded to the longest sample
    singles = [r for r in plan_setups(plan, top_n=30).recommendations if r.gpus == 1]
    assert singles and all(r.micro_batch_size * r.gradient_accumulation_steps == 8 for r in singles)
    assert any(r.micro_batch_size < 8 for r in singles)
    for r in singles:
        # The micro-batch the planner kept consumes the data at least as fast as the largest one would.
        largest = estimate(make_plan(micro_batch_size=8, data=data, **fields), r.gpu).throughput
        assert largest is not None
        assert r.data_tokens_per_s >= 0.98 * largest.data_tokens_per_s


def test_examples_longer_than_seq_len_are_cut_not_padded() -> None:
    e = estimate(make_plan(seq_len=1024, padding="max-length", data={"examples": 1000, "avg_tokens_per_example": 3000}))
    assert any("longer than seq_len 1024" in a for a in e.assumptions)
    plan = make_plan(seq_len=1024, padding="max-length", data={"examples": 1000, "avg_tokens_per_example": 3000})
    # Every example costs seq_len tokens of compute: the data (3000 tokens each) is consumed 3000/1024 faster.
    assert data_tokens_per_processed_token(plan, resolve_recipe(plan)) == pytest.approx(3000 / 1024)


def test_a_recommendation_stored_before_padding_was_counted_still_loads() -> None:
    from services.planner.models import Recommendation
    from services.planner.planner import plan_setups

    plan = make_plan(method="qlora", lora={"rank": 16}, seq_len=1024, data=DATA)
    stored = plan_setups(plan, top_n=1).recommendations[0].model_dump()
    del stored["data_tokens_per_s"]  # a plan result written by an earlier version
    loaded = Recommendation.model_validate(stored)
    assert loaded.data_tokens_per_s == loaded.tokens_per_s


PERCENTILES = {
    "p50_tokens_per_example": 200,
    "p90_tokens_per_example": 600,
    "p99_tokens_per_example": 1200,
    "max_tokens_per_example": 3000,
}


def test_the_longest_sample_from_a_data_sets_percentiles_matches_sampling() -> None:
    from services.estimator.padding import expected_longest_from_percentiles

    points = ((0.5, 200), (0.9, 600), (0.99, 1200), (1.0, 3000))
    knots = [(0.0, 0.0), *((float(t), q) for q, t in points)]
    rng = random.Random(3)

    def draw() -> float:  # inverse of the CDF linear between the knots, cut to the cap
        u = rng.random()
        for (x0, f0), (x1, f1) in itertools.pairwise(knots):
            if u <= f1:
                return min(2048.0, x0 + (u - f0) / (f1 - f0) * (x1 - x0))
        return 2048.0

    sampled = sum(max(draw() for _ in range(4)) for _ in range(40_000)) / 40_000
    assert expected_longest_from_percentiles(points, 2048, 4) == pytest.approx(sampled, rel=0.02)


def test_a_plan_with_length_percentiles_pads_by_them() -> None:
    data = {**DATA, **PERCENTILES}
    plan = make_plan(seq_len=2048, micro_batch_size=4, padding="longest", data=data)
    from services.estimator.padding import expected_longest_from_percentiles

    points = ((0.5, 200), (0.9, 600), (0.99, 1200), (1.0, 3000))
    assert processed_tokens_per_example(plan, resolve_recipe(plan)) == pytest.approx(
        expected_longest_from_percentiles(points, 2048, 4)
    )
    e = estimate(plan)
    assert any("from the data set's length percentiles" in a for a in e.assumptions)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"p90_tokens_per_example": None}, "p90_tokens_per_example"),
        ({"p99_tokens_per_example": 100}, "p99_tokens_per_example"),
    ],
)
def test_length_percentiles_are_all_given_and_never_decrease(change: dict[str, object], field: str) -> None:
    from services.estimator.validation import PlanError, parse_plan

    data = {**DATA, **PERCENTILES, **change}
    data = {k: v for k, v in data.items() if v is not None}
    with pytest.raises(PlanError) as err:
        parse_plan({"model": {"name": "meta-llama/Llama-3.1-8B"}, "data": data})
    assert field in str(err.value)


def test_a_run_with_fewer_samples_than_one_optimizer_step_is_warned_by_the_estimate_and_the_planner() -> None:
    from services.planner import plan_setups

    # 20 examples against micro-batch 4 x 8 accumulation steps: the run never completes a step.
    short = make_plan(
        method="lora",
        micro_batch_size=4,
        gradient_accumulation_steps=8,
        data={"examples": 20, "avg_tokens_per_example": 400},
    )
    assert run_samples(short, resolve_recipe(short)) == 20
    packed = short.model_copy(update={"padding": "packed"})  # 8,000 tokens in rows of 2,048
    assert run_samples(packed, resolve_recipe(packed)) == pytest.approx(8_000 / short.seq_len)
    wanted = "the run trains 20 samples in all, fewer than one optimizer step of 32"
    assert any(w.startswith(wanted) for w in estimate(short).warnings)
    assert any(w.startswith(wanted) for w in plan_setups(short).warnings)
    enough = short.model_copy(update={"gradient_accumulation_steps": 5})
    assert not any("optimizer step of" in w for w in estimate(enough).warnings)
