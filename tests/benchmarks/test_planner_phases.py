"""benchmarks/planner/phases.py splits a plan's CPU time by phase by wrapping the planner's functions for the
length of a measurement: the phases come out, the plan's answer is the same, and the functions are put back."""

from __future__ import annotations

import pytest

from benchmarks.planner import phases
from benchmarks.planner.run import benchmark_plan, generated_catalog
from services.catalog.market import Market
from services.planner import plan_setups, planner, scan


def test_phases_of_a_plan_and_the_functions_put_back() -> None:
    market = Market(generated_catalog(300, seed=5))
    plan = benchmark_plan("full")
    originals = [getattr(module, name) for module, name, _ in phases._TIMED]
    expected = plan_setups(plan, market)
    row = phases.plan_phases(plan, market, rounds=3)
    assert set(row) == {*phases.PHASES, "total"}
    assert row["total"] > 0 and row["search"] > 0 and row["grouping"] > 0 and row["ranking"] > 0
    assert [getattr(module, name) for module, name, _ in phases._TIMED] == originals
    assert plan_setups(plan, market) == expected


def test_the_functions_are_put_back_when_a_plan_fails() -> None:
    originals = (scan._group_offers, planner.scan_offers)
    spent: dict[str, float] = {}
    with pytest.raises(RuntimeError), phases._timed(spent):
        raise RuntimeError("a plan that fails")
    assert (scan._group_offers, planner.scan_offers) == originals
