"""The bridge from a stored plan to the pure planner."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from services.catalog.gpus import gpu_specs
from services.catalog.offers import Offer
from services.estimator.budget import CpuBudget
from services.estimator.plan import Plan
from services.estimator.resolved import ResolvedPlan
from services.planner.constraints import Constraints
from services.planner.planner import plan_setups

# CPU seconds of one search when the caller passes no budget (Settings.plan_cpu_budget_s's default).
DEFAULT_CPU_BUDGET_S = 10.0


def recommend(
    plan: Plan | ResolvedPlan,
    constraints: Constraints,
    offers: tuple[Offer, ...],
    default_margin: float,
    top_n: int = 10,
    utilisation: Mapping[str, tuple[float, str]] | None = None,
    budget: CpuBudget | None = None,
    now: datetime | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    """(recommendations cheapest first, rejections, warnings) as JSON data; prices fetched more than a day
    before ``now`` (default: the current time) are marked stale.

    Without a ``budget``, the search gets DEFAULT_CPU_BUDGET_S of CPU time (the default of
    GPUPLAN_PLAN_CPU_BUDGET_S), so the quote and dashboard paths are bounded as the plan task is.
    """
    budget = budget if budget is not None else CpuBudget(DEFAULT_CPU_BUDGET_S)
    if "safety_margin" not in constraints.model_fields_set:
        constraints = constraints.model_copy(update={"safety_margin": default_margin})
    result = plan_setups(
        plan,
        offers,
        gpu_specs(),
        constraints,
        top_n=top_n,
        utilisation=utilisation,
        budget=budget,
        now=now if now is not None else datetime.now(UTC),
    )
    return (
        [r.model_dump(mode="json") for r in result.recommendations],
        [r.model_dump(mode="json") for r in result.rejections],
        list(result.warnings),
    )
