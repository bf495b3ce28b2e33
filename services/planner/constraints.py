"""What the user asks of a setup beyond fitting: money, time, where, how many GPUs, how much margin."""

from __future__ import annotations

import math
from typing import Annotated, TypeVar

import numpy as np
from pydantic import ConfigDict, Field, StrictBool, StrictFloat, StrictInt

from services.core.request_models import ClosedModel, SingleLine

# How recommendations show a cost and a time (services.planner.planner._recommendation): to the cent, and hours to
# three decimals. A setup shown over the budget or the deadline breaks it, whatever digits lie behind (a planner
# probe of stop 50: $1.08 recommended under a budget of $1.0753).
SHOWN_COST_DECIMALS = 2
SHOWN_HOURS_DECIMALS = 3

Value = TypeVar("Value", float, np.ndarray)


def rounded(value: Value, decimals: int) -> Value:
    """``np.round(value, decimals)``; a finite float is rounded as numpy rounds it (times 10**decimals, half to even,
    divided back: the same three IEEE operations), without numpy's per-call cost: a constrained plan checks hundreds
    of thousands of single costs and hours (rejections.constraint_rejection)."""
    if isinstance(value, float) and math.isfinite(value) and decimals >= 0:
        scale = 10.0**decimals
        return round(value * scale) / scale
    return np.round(value, decimals)  # type: ignore[no-any-return]


# A region, country or provider named in the constraints: one line of text (a line break, a bidi control or an empty
# name was stored and matched nothing), and at most this many of each (a list of 1,000 was taken).
_Place = Annotated[SingleLine, Field(min_length=1, max_length=100)]
_MOST_PLACES = 200


class Constraints(ClosedModel):
    """Limits and assumptions for :func:`services.planner.planner.plan_setups`.

    ``preemptions_per_hour`` overrides every offer's spot interruption rate (per node and hour; a job on
    several nodes restarts when any one of them is preempted). Left out, each offer's own rate is used,
    else the planner's default (services.planner.costs). ``restart_minutes`` likewise overrides the time
    from a preemption to training again (default: the offer's start-up plus the model download); the wait for spot
    capacity comes on top. ``prefer_simpler_within`` is the tolerance of services.planner.simpler.prefer_simpler.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    budget_usd: StrictFloat | None = Field(default=None, gt=0, description="the most the whole job may cost, in USD")
    deadline_hours: StrictFloat | None = Field(
        default=None, gt=0, description="the longest the job may take, wall-clock"
    )
    regions: tuple[_Place, ...] = Field(
        default=(),
        max_length=_MOST_PLACES,
        description="allowed offer regions or countries (case-insensitive); empty allows all",
    )
    providers: tuple[_Place, ...] = Field(
        default=(), max_length=_MOST_PLACES, description="allowed providers (case-insensitive); empty allows all"
    )
    spot_allowed: StrictBool = Field(default=True, description="whether spot (preemptible) prices may be used")
    max_gpus: StrictInt = Field(
        default=64, ge=1, le=4096, description="the most GPUs one setup may use, all nodes together"
    )
    safety_margin: StrictFloat = Field(
        default=0.0,
        ge=0.0,
        le=0.5,
        description="extra share of each card's memory kept free (0.0-0.5), on top of the headroom the planner "
        "sizes every setup with (services.estimator.fit.headroom_ratio)",
    )
    preemptions_per_hour: StrictFloat | None = Field(
        default=None,
        ge=0.0,
        le=60.0,
        description="spot preemptions per node and hour for every offer; null: the offer's rate or the default",
    )
    restart_minutes: StrictFloat | None = Field(
        default=None,
        ge=0.0,
        le=1440.0,
        description="minutes from a preemption to training again; null: the offer's start-up plus the download",
    )
    allow_optimizer_change: StrictBool = Field(
        default=False,
        description="whether the planner may switch AdamW to an 8-bit or paged 8-bit optimizer to fit a card",
    )
    prefer_simpler_within: StrictFloat = Field(
        default=0.10,
        ge=0.0,
        le=1.0,
        description="a setup with more GPUs, more nodes, spot or CPU offload ranks above a simpler one only when its "
        "expected cost is lower by more than this share (0.0-1.0; 0.10 = 10%)",
    )
    allow_cpu_offload: StrictBool = Field(
        default=True,
        description="whether the planner may offload optimizer states (and sharded weights) to CPU memory to fit",
    )

    def allows_region(self, region: str, country: str) -> bool:
        """Whether an offer's region or country is one the user allows (no regions given allows all)."""
        if not self.regions:
            return True
        wanted = {r.strip().lower() for r in self.regions}
        return region.strip().lower() in wanted or (bool(country.strip()) and country.strip().lower() in wanted)

    @property
    def restart_s(self) -> float | None:
        """``restart_minutes`` in seconds (None: the offer's start-up plus the download)."""
        return None if self.restart_minutes is None else self.restart_minutes * 60.0

    def meets_budget(self, cost_usd: Value) -> Value:
        """Whether a cost (or each of an array) is within the budget, as computed and as shown."""
        if self.budget_usd is None:
            return np.ones_like(cost_usd, dtype=bool) if isinstance(cost_usd, np.ndarray) else True
        shown = rounded(cost_usd, SHOWN_COST_DECIMALS)
        return (cost_usd <= self.budget_usd) & (shown <= self.budget_usd)

    def meets_deadline(self, hours: Value) -> Value:
        """Whether a wall-clock (or each of an array) is within the deadline, as computed and as shown."""
        if self.deadline_hours is None:
            return np.ones_like(hours, dtype=bool) if isinstance(hours, np.ndarray) else True
        shown = rounded(hours, SHOWN_HOURS_DECIMALS)
        return (hours <= self.deadline_hours) & (shown <= self.deadline_hours)

    def allows_provider(self, provider: str) -> bool:
        """Whether the user allows this provider (no providers given allows all)."""
        return not self.providers or provider.strip().lower() in {p.strip().lower() for p in self.providers}
