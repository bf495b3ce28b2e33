"""The planner's array pricing gives what the per-offer pricing gave, to the last digit.

``tests/planner/data/vectorised_reference.json.gz`` holds whole planner results recorded with the per-offer
planner (commit 011bb6a, before offers were grouped by layout and priced as arrays) over generated catalogs of a
few hundred offers: several methods (70B full included), spot on and off, budgets, deadlines, filters, CPU
offload, 8-bit optimizers and offers that give their own start-up, download and preemption figures. Each case
is planned again and compared field by field. The catalogs are benchmarks.planner.run.generated_catalog's
(seeded), so a change to that generator needs a new recording too.

An estimator change that moves outputs on purpose moves these too: re-record them in that commit
(``python -m tests.planner.test_vectorised_equivalence``), with the planner's own code unchanged, and say so
in its message.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from benchmarks.planner.run import benchmark_plan, generated_catalog
from services.catalog.gpus import gpu_specs
from services.catalog.offers import Offer
from services.planner import Constraints, plan_setups
from services.planner.planner import plan_context
from services.planner.ranking import price_setup
from services.planner.scan import scan_offers

REFERENCE = Path(__file__).parent / "data" / "vectorised_reference.json.gz"
NOW = datetime(2026, 11, 3, tzinfo=UTC)


def _enriched(offers: tuple[Offer, ...]) -> tuple[Offer, ...]:
    """Every fifth offer with its own start-up, download and preemption rate (the generator sets none),
    every seventh with a date after ``NOW`` minus a day (fresh) so that stale and fresh prices mix."""
    out = []
    for i, o in enumerate(offers):
        if i % 5 == 1:
            o = dataclasses.replace(
                o,
                startup_s=60.0 * (1 + i % 4),
                download_gbit_per_s=(1.0, 10.0, 25.0)[i % 3],
                preemption_per_hour=0.05 * (1 + i % 3),
            )
        if i % 7 == 3:
            o = dataclasses.replace(o, fetched_at="2026-11-02T20:00:00Z")
        out.append(o)
    return tuple(out)


CATALOGS = {
    "generated_300": lambda: generated_catalog(300, seed=7),
    "generated_400_enriched": lambda: _enriched(generated_catalog(400, seed=11)),
}


B8, B70 = "meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-70B"
# name: (catalog, plan arguments, constraints, top_n)
CASES: dict[str, tuple[str, dict[str, Any], dict[str, Any], int]] = {
    "8b_qlora": ("generated_300", {"method": "qlora"}, {}, 10),
    "8b_lora_no_spot": ("generated_300", {"method": "lora"}, {"spot_allowed": False}, 10),
    "8b_full_budget": ("generated_300", {"method": "full"}, {"budget_usd": 1.0}, 10),
    "8b_full_deadline": ("generated_300", {"method": "full"}, {"deadline_hours": 0.4}, 25),
    "8b_full_budget_deadline": (
        "generated_400_enriched",
        {"method": "full"},
        {"budget_usd": 3.0, "deadline_hours": 1.0},
        10,
    ),
    "70b_full": ("generated_300", {"method": "full", "model": B70}, {}, 10),
    "70b_full_enriched": ("generated_400_enriched", {"method": "full", "model": B70}, {}, 40),
    "70b_full_budget_deadline": (
        "generated_300",
        {"method": "full", "model": B70},
        {"budget_usd": 60.0, "deadline_hours": 6.0},
        10,
    ),
    "70b_full_no_spot_8bit": (
        "generated_400_enriched",
        {"method": "full", "model": B70},
        {"spot_allowed": False, "allow_optimizer_change": True},
        10,
    ),
    "70b_full_no_offload_margin": (
        "generated_300",
        {"method": "full", "model": B70},
        {"allow_cpu_offload": False, "safety_margin": 0.1, "max_gpus": 16},
        10,
    ),
    "70b_full_plan_offload": (
        "generated_400_enriched",
        {"method": "full", "model": B70, "cpu_offload": True, "sharding": "fsdp"},
        {},
        10,
    ),
    "70b_qlora_preemptions": (
        "generated_400_enriched",
        {"method": "qlora", "model": B70},
        {"preemptions_per_hour": 0.5, "restart_minutes": 12.0, "prefer_simpler_within": 0.0},
        15,
    ),
    "8b_lora_filters": (
        "generated_400_enriched",
        {"method": "lora"},
        {"providers": ["provider-3", "provider-17", "provider-40"], "regions": ["region-2", "region-5", "region-9"]},
        10,
    ),
    "8b_full_packed_checkpointing": (
        "generated_300",
        {"method": "full", "gradient_checkpointing": True, "data": {"tokens": 40_000_000}},
        {"prefer_simpler_within": 0.3},
        10,
    ),
}


def run_case(name: str) -> dict[str, Any]:
    catalog, plan_args, constraints, top_n = CASES[name]
    plan_args = dict(plan_args)
    plan = benchmark_plan(plan_args.pop("method"), plan_args.pop("model", B8), **plan_args)
    result = plan_setups(plan, CATALOGS[catalog](), None, Constraints(**constraints), top_n=top_n, now=NOW)
    return json.loads(result.model_dump_json())


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    return json.loads(gzip.decompress(REFERENCE.read_bytes()))


def _differences(got: Any, want: Any, where: str = "") -> list[str]:
    if isinstance(want, dict) and isinstance(got, dict):
        out = [f"{where}.{k}: missing" for k in want if k not in got]
        out += [f"{where}.{k}: unexpected" for k in got if k not in want]
        for k in want:
            if k in got:
                out += _differences(got[k], want[k], f"{where}.{k}")
        return out
    if isinstance(want, list) and isinstance(got, list):
        if len(got) != len(want):
            return [f"{where}: {len(got)} items, want {len(want)}"]
        return [d for i, (g, w) in enumerate(zip(got, want, strict=True)) for d in _differences(g, w, f"{where}[{i}]")]
    return [] if got == want and type(got) is type(want) else [f"{where}: {got!r}, want {want!r}"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_plan_is_identical_to_the_per_offer_reference(name: str, reference: dict[str, Any]) -> None:
    differences = _differences(run_case(name), reference[name])
    assert not differences, "\n".join(differences[:20])


def test_the_reference_covers_what_it_claims(reference: dict[str, Any]) -> None:
    # Each kind of outcome the array pricing must reproduce appears somewhere in the reference.
    kinds = {r["kind"] for case in reference.values() for r in case["rejections"]}
    assert {"memory", "budget", "deadline", "budget_and_deadline", "provider", "region"} <= kinds
    recs = [r for case in reference.values() for r in case["recommendations"]]
    assert {r["pricing"] for r in recs} == {"on_demand", "spot"}
    assert any(r["cpu_offload"] for r in recs) and any(r["nodes"] > 1 for r in recs)
    assert any(r["cost_breakdown"]["billing_rounding"] > 0 for r in recs)
    assert any(r["stale_price"] for r in recs) and any(not r["stale_price"] for r in recs)


def record() -> None:
    """Write the reference from the planner as it is now (run on the commit before a change)."""
    REFERENCE.parent.mkdir(parents=True, exist_ok=True)
    data = {name: run_case(name) for name in sorted(CASES)}
    text = json.dumps(data, indent=0, sort_keys=True) + "\n"
    REFERENCE.write_bytes(gzip.compress(text.encode("utf-8"), mtime=0))
    print(f"wrote {REFERENCE} ({REFERENCE.stat().st_size / 1e3:.0f} kB)")


if __name__ == "__main__":
    record()
    sys.exit(0)


@pytest.mark.parametrize(
    "constraints",
    [
        {"budget_usd": 5.0},
        {"deadline_hours": 2.0, "preemptions_per_hour": 0.3, "restart_minutes": 7.5},
        {"budget_usd": 50.0, "preemptions_per_hour": 0.0},
    ],
)
@pytest.mark.parametrize("model", [B70, B8])
def test_array_prices_are_the_scalar_prices_to_the_bit(constraints: dict[str, Any], model: str) -> None:
    # Every (offer, setup, pricing) the arrays price, against costs.run_cost through search.price_setup (the 8B
    # runs are short enough for billing minimums to decide some costs).
    offers = CATALOGS["generated_400_enriched"]()
    _, ctx = plan_context(benchmark_plan("full", model), Constraints(**constraints))
    scan = scan_offers(ctx, offers, gpu_specs())
    checked = 0
    for bounds in scan.bounds.values():
        assert bounds.cost is not None and bounds.hours is not None
        for row in range(len(bounds.bound)):
            index, position = int(bounds.offer[row]), int(bounds.position[row])
            c = price_setup(ctx, index, offers[index], scan.setups_of(index)[position])
            cost = c.spot if bounds.spot[row] else c.on_demand
            assert cost is not None
            assert (float(bounds.cost[row]), float(bounds.hours[row])) == (cost.expected_cost_usd, cost.hours)
            # The ranking prices in order of the bound and stops on it: never above the cost, not by a bit.
            assert float(bounds.bound[row]) <= cost.expected_cost_usd
            checked += 1
    assert checked > 500
