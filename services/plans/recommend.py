"""The bridge from a stored plan to the pure planner."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from services.catalog.gpus import gpu_specs
from services.catalog.offers import Offer
from services.estimator.plan import Plan
from services.planner.constraints import Constraints
from services.planner.planner import plan_setups


def recommend(
    plan: Plan,
    constraints: Constraints,
    offers: tuple[Offer, ...],
    default_margin: float,
    top_n: int = 10,
    utilisation: Mapping[str, tuple[float, str]] | None = None,
    now: datetime | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    """(recommendations cheapest first, rejections, warnings) as JSON data; prices fetched more than a day
    before ``now`` (default: the current time) are marked stale."""
    if "safety_margin" not in constraints.model_fields_set:
        constraints = constraints.model_copy(update={"safety_margin": default_margin})
    result = plan_setups(
        plan,
        offers,
        gpu_specs(),
        constraints,
        top_n=top_n,
        utilisation=utilisation,
        now=now if now is not None else datetime.now(UTC),
    )
    return (
        [r.model_dump(mode="json") for r in result.recommendations],
        [r.model_dump(mode="json") for r in result.rejections],
        list(result.warnings),
    )
