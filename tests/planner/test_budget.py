"""The planner's CPU budget (issue 15.3): a search that would run long stops with a reason naming what
to narrow, instead of holding a worker thread."""

from __future__ import annotations

import dataclasses
import time

import pytest

from services.catalog.models import find_model
from services.catalog.offers import Offer, bundled_offers
from services.estimator.budget import CpuBudget, WorkBudgetExceeded
from services.estimator.plan import Plan
from services.estimator.validation import parse_plan
from services.planner.constraints import Constraints
from services.planner.planner import plan_setups


def _unplaceable_plan() -> Plan:
    """A model larger than any card x 4,096 GPUs can hold: the search walks every node count of every offer."""
    config = {
        **find_model("meta-llama/Llama-3.1-8B").config,
        "num_hidden_layers": 1024,
        "hidden_size": 131_072,
        "num_attention_heads": 1024,
        "intermediate_size": 524_288,
    }
    return parse_plan({"model": {"config": config}, "data": {"tokens": 10**9}, "micro_batch_size": 64})


def _many_networked_offers() -> list[Offer]:
    """480 multi-node offers, each with its own network speed: none shares a cached multi-node search."""
    return [
        dataclasses.replace(o, provider=f"{o.provider}-{i}", gpus_per_node=8, inter_node_gbit_per_s=100.0 + i)
        for i in range(40)
        for o in bundled_offers()
    ]


def test_a_search_over_its_budget_stops_naming_the_constraints_to_narrow() -> None:
    plan = _unplaceable_plan()
    offers = _many_networked_offers()
    started = time.thread_time()
    with pytest.raises(WorkBudgetExceeded) as raised:
        plan_setups(plan, offers, constraints=Constraints(max_gpus=4096), budget=CpuBudget(0.02))
    assert raised.value.field == "constraints" and "constraints.max_gpus" in raised.value.message
    # It stops within one unit of work of the budget (one offer's node count), not after the whole search.
    assert time.thread_time() - started < 1.0


def test_a_search_within_its_budget_is_unchanged() -> None:
    plan = parse_plan({"model": {"name": "meta-llama/Llama-3.1-8B"}, "method": "qlora", "data": {"tokens": 10**7}})
    unlimited = plan_setups(plan)
    budgeted = plan_setups(plan, budget=CpuBudget(60.0))
    assert budgeted.model_dump() == unlimited.model_dump()
