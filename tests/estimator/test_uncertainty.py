"""The uncertainty band: statistics, pooling of small categories, and the band in what users read."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.accuracy.band import residual_table, table_json
from benchmarks.accuracy.run import evaluate_case, load_cases
from services.estimator.estimate import estimate_dict
from services.estimator.uncertainty import (
    MIN_CASES,
    band_from_pools,
    build_pools,
    bundled_pools,
    category,
    parse_table,
    t_quantile,
)

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "services" / "estimator" / "data" / "residuals.json"


@pytest.mark.parametrize(
    ("dof", "expected"),
    # Student's t 0.90 quantiles from standard tables (e.g. NIST/SEMATECH e-Handbook, table 1.3.6.7.2).
    [(1, 3.078), (2, 1.886), (3, 1.638), (5, 1.476), (10, 1.372), (30, 1.310), (1000, 1.282)],
)
def test_t_quantile_matches_the_tables(dof: int, expected: float) -> None:
    assert t_quantile(0.9, dof) == pytest.approx(expected, abs=2e-3)


def test_a_small_category_borrows_its_parents_residuals() -> None:
    few = {("torchtune", "lora", "single", "reserved"): [0.01, 0.02]}
    many = {("litgpt", "lora", "single", "allocated"): [0.1 * i for i in range(-5, 6)]}
    pools = build_pools({**few, **many})
    band = band_from_pools(pools, ("torchtune", "lora", "single", "reserved"))
    # 2 own residuals < MIN_CASES: the band comes from (lora, single), which holds all 13.
    assert band.category == "lora/single" and band.cases == 13
    own = band_from_pools(pools, ("litgpt", "lora", "single", "allocated"))
    assert own.category == "litgpt/lora/single/allocated" and own.cases == 11


def test_fewer_cases_give_a_wider_band_for_the_same_spread() -> None:
    spread = [-0.1, -0.05, 0.0, 0.05, 0.1]
    key = ("a", "full", "single", "allocated")
    small = band_from_pools(build_pools({key: spread * 2}), key)
    large = band_from_pools(build_pools({key: spread * 20}), key)
    assert small.cases == 10 and large.cases == 100
    assert small.high_ratio - small.low_ratio > large.high_ratio - large.low_ratio
    assert small.low_ratio < 1 < small.high_ratio


def test_low_confidence_is_at_least_as_wide_as_the_band_of_all_cases() -> None:
    pools = build_pools(
        {
            ("a", "lora", "single", "allocated"): [0.0, 0.01, -0.01] * 4,
            ("b", "full", "fsdp", "device"): [-0.4, 0.3, 0.5, -0.2] * 3,
        }
    )
    key = ("a", "lora", "single", "allocated")
    tight = band_from_pools(pools, key)
    wide = band_from_pools(pools, key, low_confidence=True)
    root = band_from_pools(pools, ("z", "none", "none", "none"))
    assert root.category == "all cases"
    assert wide.widened_low_confidence and not tight.widened_low_confidence
    assert wide.low_ratio <= min(tight.low_ratio, root.low_ratio)
    assert wide.high_ratio >= max(tight.high_ratio, root.high_ratio)


def test_the_bundled_table_is_the_one_the_benchmark_computes() -> None:
    cases = load_cases()
    table = residual_table([(c, evaluate_case(c)) for c in cases])
    stored = json.loads(TABLE.read_text(encoding="utf-8"))
    assert stored == json.loads(json.dumps(table_json(table))), "run: python -m benchmarks.accuracy.band"
    assert parse_table(stored).keys() == table.keys()
    assert sum(pool.n for key, pool in bundled_pools().items() if len(key) == 4) >= 60


def test_every_estimate_carries_a_band_around_its_peaks() -> None:
    plan = {"model": {"name": "meta-llama/Llama-3.1-8B"}, "method": "lora", "framework": "litgpt", "seq_len": 1024}
    mem = estimate_dict(plan, "A100 80GB")["memory"]
    low, high = mem["interval_gib"]
    assert low < high and mem["intervals_gib"]["device"] == [low, high]
    for counter in ("allocated", "reserved", "device"):
        lo, hi = mem["intervals_gib"][counter]
        # A band is a ratio range, so each counter's band scales with its peak.
        assert lo / mem[f"peak_{counter}_gib"] == pytest.approx(low / mem["peak_device_gib"], rel=1e-2)
        assert hi / mem[f"peak_{counter}_gib"] == pytest.approx(high / mem["peak_device_gib"], rel=1e-2)
    assert "litgpt/lora/single" in mem["interval_basis"]


def test_generic_models_get_the_widened_band() -> None:
    plan = {"model": {"generic": {"parameters": 7_000_000_000, "activation_bytes_per_sample": 2**30}}}
    mem = estimate_dict(plan)["memory"]
    low, high = mem["interval_gib"]
    assert low < mem["peak_device_gib"] < high
    assert "low confidence" in mem["interval_basis"]


def test_category_names_single_gpu_ddp_and_sharded_runs_apart() -> None:
    assert category("hf-trainer", "lora", "none", 1, "device") == ("hf-trainer", "lora", "single", "device")
    assert category("hf-trainer", "lora", "none", 4, "device")[2] == "ddp"
    assert category("hf-trainer", "lora", "fsdp", 4, "device")[2] == "fsdp"
    assert category("hf-trainer", "lora", "none", 1, "device", mode="inference")[1] == "inference"


def test_gpuplan_estimate_json_shows_the_band(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"model": {"name": "meta-llama/Llama-3.1-8B"}, "method": "qlora"}))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [str(Path(sys.executable).parent / "gpuplan"), "estimate", "--plan", str(plan), "--gpu", "L40S", "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    mem = json.loads(out.stdout)["memory"]
    low, high = mem["interval_gib"]
    assert math.isfinite(low) and math.isfinite(high) and low < high
    assert int(mem["interval_basis"].split(" over ")[1].split()[0]) >= MIN_CASES


def test_gpuplan_estimate_text_shows_the_band(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"model": {"name": "meta-llama/Llama-3.1-8B"}, "method": "lora", "framework": "litgpt"}))
    out = subprocess.run(
        [str(Path(sys.executable).parent / "gpuplan"), "estimate", "--plan", str(plan)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "80% band" in out.stdout and "litgpt/lora/single" in out.stdout


def test_quantile_ratio_is_the_normal_prediction_quantile_of_a_large_pool() -> None:
    import math
    import statistics

    from services.estimator.uncertainty import build_pools, quantile_ratio

    # 2,000 log residuals evenly spread over N(0.05, 0.1): the t quantile tends to the normal one.
    dist = statistics.NormalDist(0.05, 0.1)
    values = [dist.inv_cdf((i + 0.5) / 2000) for i in range(2000)]
    pools = build_pools({("f", "lora", "single", "device"): values})
    for level in (0.2, 0.46, 0.9):
        expected = math.exp(dist.inv_cdf(level))
        assert quantile_ratio(pools, ("f", "lora", "single", "device"), level) == pytest.approx(expected, rel=2e-3)
