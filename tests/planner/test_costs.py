"""What a rented run pays: billing increments and minimums, start-up, download, checkpoints, spot rework."""

from __future__ import annotations

import itertools
import math
from datetime import UTC, datetime
from typing import Any

import pytest

from services.catalog.offers import Offer
from services.planner import Constraints, plan_setups
from services.planner.costs import (
    DEFAULT_PREEMPTION_PER_NODE_HOUR,
    DEFAULT_STARTUP_S,
    RunShape,
    billed_seconds,
    checkpoint_interval_s,
    run_cost,
)
from services.planner.planner import price_age_hours
from tests.conftest import make_plan


def offer(price: float = 2.0, spot: float | None = 0.6, **v2: Any) -> Offer:
    return Offer("acme", "A100 80GB", 8, price, spot, "USD", "eu", "DE", "NVSwitch", "2026-11-01", "test", **v2)


SHAPE = RunShape(
    gpus=2,
    nodes=1,
    training_s=3600.0,
    model_download_bytes=16e9,
    checkpoint_bytes=1e9,
    final_upload_bytes=0.1e9,
    checkpoint_write_s=5.0,
)


def test_billing_rounds_up_to_the_increment_and_the_minimum() -> None:
    assert billed_seconds(61.0, 1, 0) == 61.0
    assert billed_seconds(61.0, 60, 0) == 120.0
    assert billed_seconds(120.0, 60, 0) == 120.0
    assert billed_seconds(61.0, 3600, 0) == 3600.0
    assert billed_seconds(10.0, 1, 60) == 60.0


def test_the_breakdown_adds_up_and_names_every_cause() -> None:
    cost = run_cost(offer(), SHAPE, "on_demand")
    per_s = 2 * 2.0 / 3600
    assert cost.breakdown["compute"] == pytest.approx(3600 * per_s)
    assert cost.breakdown["startup"] == pytest.approx(DEFAULT_STARTUP_S * per_s)
    # 16 GB at the default 4 Gbit/s: 32 s.
    assert cost.breakdown["model_download"] == pytest.approx(32 * per_s)
    assert cost.breakdown["checkpoint_writes"] > 0.1e9 / 100e6 * per_s - 1e-9
    assert sum(cost.breakdown.values()) == pytest.approx(cost.expected_cost_usd)
    assert cost.expected_cost_usd == pytest.approx(cost.billed_hours * cost.price_usd_per_hour)


def test_offer_fields_replace_the_defaults() -> None:
    fast = run_cost(offer(startup_s=30.0, download_gbit_per_s=32.0), SHAPE, "on_demand")
    slow = run_cost(offer(), SHAPE, "on_demand")
    assert fast.breakdown["startup"] == pytest.approx(slow.breakdown["startup"] / 10)
    assert fast.breakdown["model_download"] == pytest.approx(slow.breakdown["model_download"] / 8)


def test_a_short_run_pays_the_billing_minimum_and_an_hourly_increment() -> None:
    tiny = RunShape(1, 1, 20.0, 1e9, 1e8, 1e7, 0.5)
    hourly = run_cost(offer(billing_increment_s=3600, startup_s=10.0), tiny, "on_demand")
    assert hourly.billed_hours == 1.0
    assert hourly.expected_cost_usd == pytest.approx(2.0)
    assert hourly.breakdown["billing_rounding"] > 1.9
    minimum = run_cost(offer(billing_minimum_s=600, startup_s=10.0), tiny, "on_demand")
    assert minimum.expected_cost_usd == pytest.approx(2.0 * 600 / 3600)


def test_spot_adds_checkpoints_and_rework_at_the_young_daly_interval() -> None:
    rate = 0.2
    spot = run_cost(offer(preemption_per_hour=rate), SHAPE, "spot")
    assert spot.interruptions_per_hour == pytest.approx(rate)
    mtbf_s = 3600 / rate
    assert spot.checkpoint_interval_s == pytest.approx(math.sqrt(2 * 5.0 * mtbf_s))
    spot_per_s = 2 * 0.6 / 3600
    checkpoint_s = spot.breakdown["checkpoint_writes"] / spot_per_s
    assert spot.expected_preemptions == pytest.approx(rate * (3600 + checkpoint_s) / 3600)
    # Each preemption costs a restart (start-up and download again) and half an interval of work.
    restart = DEFAULT_STARTUP_S + 32.0
    # ("acme" has no trace of its own: the generic GPU-spot figures give the wait and the fallback.)
    assert spot.breakdown["preemption_rework"] == pytest.approx(
        spot.expected_preemptions * (restart + spot.checkpoint_interval_s / 2) * 2 * 0.6 / 3600
    )
    # The on-demand finish is its own part of the cost, not rework (a quote showed it as spot GPU-hours).
    assert spot.breakdown["on_demand_fallback"] == spot.on_demand_fallback_usd > 0
    assert sum(spot.breakdown.values()) == pytest.approx(spot.expected_cost_usd)
    # A job on two nodes is interrupted when either is.
    two_nodes = run_cost(offer(preemption_per_hour=rate), RunShape(16, 2, 3600.0, 16e9, 1e9, 1e8, 5.0), "spot")
    assert two_nodes.interruptions_per_hour == pytest.approx(2 * rate)
    # Without a rate on the offer, the sourced one-GPU default applies, scaled for a node of 2 GPUs; the user's
    # figure overrides both.
    default = run_cost(offer(), SHAPE, "spot")
    assert default.interruptions_per_hour > DEFAULT_PREEMPTION_PER_NODE_HOUR
    assert default.rate_source.startswith("no rate from the provider")
    assert run_cost(offer(preemption_per_hour=rate), SHAPE, "spot", preemptions_per_node_hour=0.0).breakdown[
        "preemption_rework"
    ] == pytest.approx(0.0)


def test_the_hourly_cap_never_makes_checkpoint_writes_a_large_share() -> None:
    assert checkpoint_interval_s(5.0, 2e-5, 86400.0) == 3600.0
    # A 40-minute write is not repeated every hour: at most a tenth of the run goes to writes.
    assert checkpoint_interval_s(2400.0, 2e-5, 10 * 86400.0) == pytest.approx(24000.0)
    assert checkpoint_interval_s(5.0, 0.0, 30.0) == 60.0


def test_a_100_example_job_pays_at_least_its_billing_minimum() -> None:
    plan = make_plan(
        method="qlora",
        seq_len=512,
        micro_batch_size=4,
        data={"examples": 100, "avg_tokens_per_example": 512, "epochs": 1},
    )
    offers = [offer(billing_increment_s=60, billing_minimum_s=3600, startup_s=60.0)]
    result = plan_setups(plan, offers, None, Constraints(), top_n=100)
    assert result.recommendations
    for rec in result.recommendations:
        price = rec.price_usd_per_hour if rec.pricing == "on_demand" else rec.spot_price_usd_per_hour
        assert price is not None
        assert rec.expected_cost_usd >= price * 1.0 - 0.01
        assert rec.cost_breakdown["billing_rounding"] > 0
        assert any("60 s with a 3600 s minimum" in n for n in rec.notes)


def test_ties_go_to_fewer_gpus() -> None:
    # A job too small to amortise anything: every GPU count costs at least the minimum, more GPUs more.
    plan = make_plan(method="qlora", seq_len=256, data={"examples": 8, "avg_tokens_per_example": 256, "epochs": 1})
    result = plan_setups(plan, [offer(spot=None, billing_minimum_s=60)], None, Constraints(), top_n=100)
    recs = result.recommendations
    assert recs[0].gpus == 1
    for a, b in itertools.pairwise(recs):
        if round(a.expected_cost_usd, 2) == round(b.expected_cost_usd, 2):
            assert (a.gpus, a.nodes, a.expected_hours) <= (b.gpus, b.nodes, b.expected_hours)


def test_stale_prices_are_marked_against_the_callers_clock() -> None:
    assert price_age_hours("2026-11-01", None) is None
    assert price_age_hours("2026-11-01", datetime(2026, 11, 2, 12, tzinfo=UTC)) == pytest.approx(36.0)
    assert price_age_hours("2026-11-01T06:00:00Z", datetime(2026, 11, 1, 12, tzinfo=UTC)) == pytest.approx(6.0)
    assert price_age_hours("not a date", datetime(2026, 11, 1, tzinfo=UTC)) is None
    plan = make_plan(method="qlora", seq_len=512, data={"examples": 1000, "avg_tokens_per_example": 512})
    fresh = plan_setups(plan, [offer()], None, Constraints(), now=datetime(2026, 11, 1, 20, tzinfo=UTC))
    assert not any(r.stale_price for r in fresh.recommendations)
    old = plan_setups(plan, [offer()], None, Constraints(), now=datetime(2026, 11, 5, tzinfo=UTC))
    rec = old.recommendations[0]
    assert rec.stale_price and rec.price_age_hours == pytest.approx(96.0)
    assert any("price fetched 4.0 days ago" in n for n in rec.notes)


def test_the_headroom_lies_between_the_point_estimate_and_the_upper_end_of_the_band() -> None:
    from services.estimator.fit import headroom_ratio
    from services.estimator.uncertainty import bundled_pools, memory_band

    # Every category of the bundled residual table: the planner never sizes below the point estimate, and a
    # setup whose band's upper end (p90) fits is never refused (between the two it is offered, marked tight).
    for framework, method, sharding, *_ in {k for k in bundled_pools() if len(k) == 4}:
        gpus = 1 if sharding == "single" else 2
        shard = "none" if sharding in ("single", "ddp") else sharding
        for low in (False, True):
            ratio = headroom_ratio(framework, method, shard, gpus, "train", low)
            band = memory_band(framework, method, shard, gpus, "device", "train", low)
            assert 1.0 <= ratio <= max(1.0, band.high_ratio), (framework, method, sharding, low)
