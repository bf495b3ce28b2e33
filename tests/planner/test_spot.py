"""Checkpoint size, the Young/Daly interval and expected spot hours against hand computations."""

from __future__ import annotations

import math
from typing import Any

import pytest

from services.catalog.offers import Offer
from services.core.money import usd
from services.estimator.architecture import architecture_from_config, parameter_counts
from services.estimator.memory import adapter_params
from services.estimator.recipe import resolve_recipe
from services.planner.costs import RunShape, run_cost
from services.planner.spot import (
    CAPACITY_WAIT_CAP_HOURS,
    CHECKPOINT_WRITE_BYTES_PER_S,
    DEFAULT_SPOT_RISK,
    SPOT_RISKS,
    checkpoint_bytes,
    checkpoint_write_seconds,
    node_scarcity,
    on_demand_fallback_hours,
    spot_run,
    young_daly_interval_seconds,
)
from tests.conftest import LLAMA_8B, make_plan

ARCH = architecture_from_config(LLAMA_8B)


def test_young_daly_interval() -> None:
    # 60 s writes, one failure every 20 h: sqrt(2 x 60 x 72,000) s ~ 49 min.
    assert young_daly_interval_seconds(60.0, 72_000.0) == pytest.approx(math.sqrt(2 * 60 * 72_000))


def test_write_seconds_at_200_mb_per_s() -> None:
    assert CHECKPOINT_WRITE_BYTES_PER_S == 200e6
    assert checkpoint_write_seconds(1e9) == pytest.approx(5.0)


def test_full_checkpoint_is_weights_plus_optimizer_states() -> None:
    plan = make_plan(method="full")  # bf16 weights, AdamW states in bf16 (no master copy)
    n = parameter_counts(ARCH).total
    assert checkpoint_bytes(plan, ARCH) == pytest.approx(n * 2 + n * 4)


def test_lora_checkpoint_is_16_bit_adapters_plus_their_optimizer_states() -> None:
    plan = make_plan(method="lora")
    adapters = adapter_params(ARCH, resolve_recipe(plan))
    # PEFT keeps fp32 adapters under the Trainer, so AdamW's two states are fp32: 8 bytes per parameter.
    assert checkpoint_bytes(plan, ARCH) == pytest.approx(adapters * 2 + adapters * 8)
    assert checkpoint_bytes(plan, ARCH) < checkpoint_bytes(make_plan(method="full"), ARCH) / 50


def test_spot_run_adds_checkpoints_and_rework() -> None:
    run = spot_run(hours=10.0, nodes=1, preemptions_per_node_hour=0.05, restart_minutes=10.0, write_seconds=60.0)
    interval = math.sqrt(2 * 60 * 72_000)
    assert run.checkpoint_interval_seconds == pytest.approx(interval)
    checkpoint_hours = (36_000 / interval - 1) * 60 / 3600
    assert run.checkpoint_hours == pytest.approx(checkpoint_hours)
    preemptions = (10.0 + checkpoint_hours) * 0.05
    assert run.expected_preemptions == pytest.approx(preemptions)
    assert run.rework_hours == pytest.approx(preemptions * (10 / 60 + interval / 2 / 3600))
    assert run.hours == pytest.approx(10.0 + checkpoint_hours + run.rework_hours)


def test_several_nodes_are_preempted_more_often() -> None:
    one = spot_run(5.0, 1, 0.05, 10.0, 30.0)
    four = spot_run(5.0, 4, 0.05, 10.0, 30.0)
    assert four.expected_preemptions > 3 * one.expected_preemptions
    assert four.checkpoint_interval_seconds == pytest.approx(one.checkpoint_interval_seconds / 2)


def test_no_preemptions_means_no_extra_time() -> None:
    run = spot_run(3.0, 2, 0.0, 10.0, 120.0)
    assert run.hours == pytest.approx(3.0)
    assert run.expected_preemptions == 0


def test_a_job_shorter_than_the_interval_writes_no_checkpoint_before_the_end() -> None:
    run = spot_run(0.1, 1, 0.05, 10.0, 60.0)
    assert run.checkpoint_interval_seconds == pytest.approx(360.0)
    assert run.checkpoint_hours == 0


# --------------------------------------------------------------------------------------------------
# Spot risk: sourced rates, the node's size, the wait for capacity and finishing on demand


def test_every_bundled_spot_offer_has_a_sourced_rate_of_at_least_one_per_100_node_hours() -> None:
    from services.catalog.offers import bundled_offers
    from services.planner.costs import preemption_rate

    spot_offers = [o for o in bundled_offers() if o.spot_usd_per_hour is not None]
    assert spot_offers
    for o in spot_offers:
        for gpus_per_node in (1, o.gpus_per_node):
            rate, source = preemption_rate(o, None, gpus_per_node)
            assert rate >= 0.01, (o, rate)
            assert source and ("spot-traces" in source or "preemption_per_hour" in source), source
    for risk in (*SPOT_RISKS.values(), DEFAULT_SPOT_RISK):
        assert risk.preemptions_per_node_hour >= 0.01 and risk.source and risk.as_of[:2] == "20"
        assert 0 < risk.no_capacity_share < 1 and 0 < risk.wait_hours <= CAPACITY_WAIT_CAP_HOURS


def test_a_whole_8_gpu_node_is_scarcer_than_one_card() -> None:
    assert node_scarcity(1) == 1.0
    assert node_scarcity(8) == pytest.approx(3.6)  # 1.088 / 0.303 losses per available hour in the traces
    assert node_scarcity(1) < node_scarcity(2) < node_scarcity(4) < node_scarcity(8) == node_scarcity(16)


def test_on_demand_fallback_hours_match_a_simulation() -> None:
    # Independent check of E[max(0, T - t)], t ~ Exp(lambda), by Monte Carlo.
    import random

    rng = random.Random(7)
    for job_hours, lam in ((5.0, 0.1), (2.0, 1.0), (10.0, 0.02)):
        draws = [max(0.0, job_hours - rng.expovariate(lam)) for _ in range(100_000)]
        assert on_demand_fallback_hours(job_hours, lam) == pytest.approx(sum(draws) / len(draws), rel=0.03)
    assert on_demand_fallback_hours(5.0, 0.0) == 0.0


def _offer(provider: str = "aws", **fields: Any) -> Offer:
    return Offer(provider, "A100 80GB", 8, 4.0, 1.2, "USD", "us", "US", "NVSwitch", "2026-11-01", "test", **fields)


SHAPE_1 = RunShape(gpus=1, nodes=1, training_s=4 * 3600.0, model_download_bytes=16e9, checkpoint_bytes=1e9,
                   final_upload_bytes=1e8, checkpoint_write_s=5.0)  # fmt: skip


def test_spot_cost_counts_the_wait_and_finishing_on_demand() -> None:
    spot = run_cost(_offer(), SHAPE_1, "spot")
    risk = SPOT_RISKS["aws"]
    assert spot.preemptions_per_node_hour == pytest.approx(risk.preemptions_per_node_hour)
    # The wait takes wall-clock but no node is billed for it.
    assert spot.capacity_wait_hours == pytest.approx(spot.expected_preemptions * risk.wait_hours)
    assert spot.hours == pytest.approx(spot.billed_hours + spot.capacity_wait_hours, abs=1e-6)
    # About 4 h x 0.468 x 25% = 0.47 preemptions without capacity: 1 - exp(-0.47) ~ 37% chance of finishing on demand.
    assert spot.on_demand_fallback_probability == pytest.approx(0.37, abs=0.02)
    assert spot.on_demand_fallback_usd > 0
    assert sum(spot.breakdown.values()) == pytest.approx(spot.expected_cost_usd)
    # Dearer on demand makes the fallback dearer; the spot part is unchanged.
    dearer = Offer("aws", "A100 80GB", 8, 8.0, 1.2, "USD", "us", "US", "NVSwitch", "2026-11-01", "test")
    dear = run_cost(dearer, SHAPE_1, "spot")
    assert dear.on_demand_fallback_usd == pytest.approx(spot.on_demand_fallback_usd * (8.0 - 1.2) / (4.0 - 1.2))


def test_several_nodes_and_big_nodes_raise_the_jobs_rate() -> None:
    one = run_cost(_offer(), SHAPE_1, "spot")
    eight_gpus = run_cost(_offer(), RunShape(8, 1, 3600.0, 16e9, 1e9, 1e8, 5.0), "spot")
    two_nodes = run_cost(_offer(), RunShape(16, 2, 3600.0, 16e9, 1e9, 1e8, 5.0), "spot")
    assert eight_gpus.interruptions_per_hour == pytest.approx(one.interruptions_per_hour * node_scarcity(8))
    assert two_nodes.interruptions_per_hour == pytest.approx(2 * eight_gpus.interruptions_per_hour)
    assert "x3.6 for a node of 8 GPUs" in eight_gpus.rate_source


def test_the_users_rate_and_the_offers_rate_override_the_table() -> None:
    users = run_cost(_offer(), SHAPE_1, "spot", preemptions_per_node_hour=0.0)
    assert users.expected_preemptions == 0 and users.on_demand_fallback_usd == 0 and users.capacity_wait_hours == 0
    assert users.rate_source == "constraints.preemptions_per_hour"
    offers = run_cost(_offer(preemption_per_hour=0.2), RunShape(8, 1, 3600.0, 16e9, 1e9, 1e8, 5.0), "spot")
    assert offers.preemptions_per_node_hour == pytest.approx(0.2)  # the offer's figure is per node as rented


def test_a_spot_recommendation_shows_its_preemptions_and_their_cost() -> None:
    from services.planner import Constraints, plan_setups

    plan = make_plan(method="qlora", seq_len=512, data={"examples": 2000, "avg_tokens_per_example": 512})
    result = plan_setups(plan, [_offer()], None, Constraints(prefer_simpler_within=0.0), top_n=50)
    spot = [r for r in result.recommendations if r.pricing == "spot"]
    assert spot
    for rec in spot:
        assert rec.expected_preemptions is not None and rec.expected_preemptions > 0
        note = next(n for n in rec.notes if n.startswith("spot: "))
        assert f"{rec.expected_preemptions:.2f} preemptions expected" in note
        assert f"{usd(rec.cost_breakdown['checkpoint_writes'])} of checkpoints" in note
        assert "spot-traces" in note and "finishes on demand" in note


def test_a_deadline_is_met_on_spot_on_more_nodes_where_on_demand_met_it_on_fewer() -> None:
    """A probe of the constrained search against brute force (stop 56): the walk over node counts stopped at the first
    count whose run on demand met the deadline. Spot there missed it (rework, waits for capacity), and spot on one node
    more, cheaper than anything on demand, was never searched; with a budget as well, nothing was recommended."""
    from benchmarks.planner.run import benchmark_plan, generated_catalog
    from services.planner import Constraints, plan_setups

    plan = benchmark_plan("lora", data={"examples": 100_000, "avg_tokens_per_example": 1024, "epochs": 2})
    offers = generated_catalog(300, 1)
    for constraints in (Constraints(deadline_hours=2.5056), Constraints(deadline_hours=2.5056, budget_usd=0.78)):
        result = plan_setups(plan, offers, constraints=constraints)
        assert result.recommendations, result.rejections
        best = result.recommendations[0]
        assert (best.provider, best.gpu, best.gpus, best.nodes, best.pricing) == ("provider-57", "B200", 3, 3, "spot")
        assert best.expected_hours <= 2.5056 and best.expected_cost_usd <= 0.78
        assert all(r.expected_hours <= 2.5056 for r in [*result.recommendations, *result.best_per_gpu])


def test_a_deadline_rejection_never_reads_as_meeting_the_deadline() -> None:
    """A run 1.8062 h long misses a 1.806 h deadline; its rejection read hours=1.806 (a probe of stop 56)."""
    from benchmarks.planner.run import benchmark_plan, generated_catalog
    from services.planner import Constraints, plan_setups

    result = plan_setups(
        benchmark_plan("full", "meta-llama/Llama-3.1-70B"),
        generated_catalog(300, 1),
        constraints=Constraints(deadline_hours=1.806),
    )
    missed = [r for r in result.rejections if r.kind == "deadline"]
    assert missed
    for rejection in missed:
        assert rejection.hours is not None and rejection.hours > 1.806, rejection
        shown = float(rejection.reason.split(" takes ")[1].split(" h")[0])
        assert shown > 1.806, rejection.reason
