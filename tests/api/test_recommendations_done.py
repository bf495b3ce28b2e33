"""Issue 12's "done means", through the real app on the embedded catalog (SQLite and Postgres)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from services.catalog.offers import bundled_offers
from tests.api.conftest import QLORA_PLAN, Api


def _plan(api: Api, plan: dict[str, Any]) -> dict[str, Any]:
    response = api.client.post("/v1/plans", json=plan, headers=api.headers())
    assert response.status_code == 202, response.text
    body = api.wait_for_plan(response.json()["id"])
    assert body["status"] == "done", body.get("error")
    return body


def test_the_seeds_qlora_job_shows_spot_where_it_is_cheaper_in_expectation(api: Api) -> None:
    # Spot is priced with its preemptions (issue 22), so a spot setup may rank below simpler on-demand ones of
    # another provider; on AWS, whose spot is about 75% off (the bundled us-east-1 snapshot), it is still the
    # cheaper in expectation.
    recs = _plan(api, {**QLORA_PLAN, "constraints": {"providers": ["aws"]}})["recommendations"]
    spot = [r for r in recs if r["pricing"] == "spot"]
    assert spot, recs
    best = spot[0]
    # The same setup on demand costs more, preemptions, checkpoints and restarts included.
    assert best["expected_cost_usd"] == best["spot_cost_usd"] < best["cost_usd"]
    assert set(best["cost_breakdown"]) == {
        "compute",
        "startup",
        "model_download",
        "checkpoint_writes",
        "preemption_rework",
        "billing_rounding",
        "on_demand_fallback",
    }
    assert sum(best["cost_breakdown"].values()) == pytest.approx(best["expected_cost_usd"], abs=0.01)
    # Cost order, except that a more complex setup ranks above a simpler one only when more than 10% cheaper.
    for i, a in enumerate(recs):
        for b in recs[i + 1 :]:
            if b["expected_cost_usd"] < a["expected_cost_usd"]:
                assert b["expected_cost_usd"] >= 0.9 * a["expected_cost_usd"], (a, b)


def test_multi_gpu_scaling_comes_from_the_links_and_ties_go_to_fewer_gpus(api: Api) -> None:
    body = _plan(api, {**QLORA_PLAN, "method": "lora", "constraints": {"max_gpus": 8}})
    recs = body["recommendations"]
    multi = [r for r in recs if r["gpus"] > 1]
    assert multi
    for rec in multi:
        assert 0 < rec["scaling_efficiency"] < 1.0 and rec["nodes"] >= 1 and rec["links"]
        if "PCIe" in rec["links"]:
            # No multi-GPU PCIe setup scales at 98% or better (issue 12).
            assert rec["scaling_efficiency"] < 0.98, rec
    for a, b in itertools.pairwise(recs):
        if a["expected_cost_usd"] == b["expected_cost_usd"]:
            assert (a["gpus"], a["nodes"]) <= (b["gpus"], b["nodes"]), (a, b)


def test_every_memory_rejection_has_numbers_and_a_fix(api: Api) -> None:
    plan = {
        **QLORA_PLAN,
        "model": {"name": "meta-llama/Llama-3.1-70B"},
        "method": "full",
        "lora": None,
        "constraints": {"allow_cpu_offload": False},
    }
    rejections = _plan(api, plan)["rejections"]
    memory = [r for r in rejections if r["kind"] == "memory"]
    assert memory
    for r in memory:
        assert r["needed_gib_per_gpu"] > r["usable_gib_per_gpu"] > 0, r
        assert r["fix"] and r["fix"].startswith(("fits ", "does not fit")), r


def test_budget_rejections_are_their_own_kind(api: Api) -> None:
    body = _plan(api, {**QLORA_PLAN, "constraints": {"budget_usd": 0.01}})
    assert body["recommendations"] == []
    kinds = {r["kind"] for r in body["rejections"]}
    assert kinds - {"precision"} == {"budget"}  # the T4 cannot run bf16 at all


def test_a_100_example_job_pays_at_least_its_billing_minimum_and_its_start_up(api: Api) -> None:
    tiny = {**QLORA_PLAN, "dataset": {"examples": 100, "avg_tokens": 512}, "epochs": 1}
    recs = _plan(api, tiny)["recommendations"]
    assert recs
    minimum = {(o.provider, o.gpu): o.billing_minimum_s for o in bundled_offers()}
    for rec in recs:
        price = rec["price_usd_per_hour"] if rec["pricing"] == "on_demand" else rec["spot_price_usd_per_hour"]
        floor_s = max(minimum.get((rec["provider"], rec["gpu"]), 0), 0)
        assert rec["expected_cost_usd"] >= price * floor_s / 3600 - 0.01
        assert rec["cost_breakdown"]["startup"] > 0
        assert rec["expected_cost_usd"] >= rec["cost_breakdown"]["startup"]
