"""The search over setups of one offer: GPU layouts x sharding x checkpointing x the largest micro-batch.

Pruning, each step justified by the model it prunes:

- Memory grows with the micro-batch, and tokens/s does not fall with it (fixed per-step costs amortise
  over more tokens; the one exception, paged optimizer states spilling as free memory shrinks, is
  ignored), so only the largest micro-batch that fits is kept, found by bisection over the divisors of
  the per-GPU samples.
- If a setup fits without gradient checkpointing at the largest micro-batch, checkpointing could only
  slow it down, so it is not tried.
- Jobs on several nodes are tried only when no single node of the offer fits, or none meets the
  deadline; node counts then grow until one fits (and meets the deadline): more nodes of the same card
  only add communication per GPU, so they cost more.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services.catalog.gpus import GpuSpec
from services.catalog.offers import Offer
from services.estimator.architecture import Architecture
from services.estimator.budget import CpuBudget, unlimited
from services.estimator.memory import GIB
from services.estimator.plan import Method, Plan, Sharding
from services.estimator.throughput import Throughput
from services.planner.batching import BatchSplit, batch_split
from services.planner.constraints import Constraints
from services.planner.evaluator import Config, Evaluator
from services.planner.layouts import Layout, gpu_layouts, link_spec, sharding_options
from services.planner.models import PricingMode
from services.planner.spot import SpotRun, spot_run


@dataclass(frozen=True)
class PlanContext:
    """What every step of one planning call shares: the plan, its numbers, and the memoised estimators."""

    plan: Plan
    arch: Architecture
    constraints: Constraints
    total_tokens: float
    effective_batch_size: int
    checkpoint_write_seconds: float
    evaluator: Evaluator
    budget: CpuBudget = field(default_factory=unlimited)
    _variants: dict[Method, Evaluator] = field(default_factory=dict)

    def variant(self, method: Method) -> Evaluator:
        """An evaluator for the plan with another fine-tuning method (for suggestions)."""
        if method == self.plan.method:
            return self.evaluator
        found = self._variants.get(method)
        if found is None:
            found = Evaluator(self.plan.model_copy(update={"method": method}), self.arch)
            self._variants[method] = found
        return found

    def usable_bytes(self, spec: GpuSpec) -> float:
        """Memory per GPU a setup may use: the card's memory less the safety margin."""
        return spec.memory_gib * (1.0 - self.constraints.safety_margin) * GIB


@dataclass(frozen=True)
class Candidate:
    """A setup that fits, with its speed and prices."""

    offer: Offer
    offer_index: int
    spec: GpuSpec  # the card
    link: GpuSpec  # the card as the offer connects it
    layout: Layout
    cfg: Config
    effective_batch_size: int
    peak_device_bytes: float
    throughput: Throughput
    hours: float
    cost_usd: float
    spot: SpotRun | None
    spot_cost_usd: float | None
    qualifies_with: PricingMode | None  # None: breaks the budget or the deadline under every pricing


def config_for(split: BatchSplit, sharding: Sharding, micro_batch_size: int, checkpointing: bool) -> Config:
    return Config(split.gpus, sharding, micro_batch_size, split.accumulation_steps(micro_batch_size), checkpointing)


def largest_fitting_micro_batch(
    evaluator: Evaluator, split: BatchSplit, sharding: Sharding, checkpointing: bool, usable_bytes: float
) -> int | None:
    """The largest micro-batch (a divisor of the per-GPU samples) whose peak fits, or None.

    Tries the smallest first (shared by every card, so usually cached), then the largest, then bisects.
    """
    sizes = split.micro_batch_sizes
    if not evaluator.fits(config_for(split, sharding, sizes[0], checkpointing), usable_bytes):
        return None
    if len(sizes) == 1 or evaluator.fits(config_for(split, sharding, sizes[-1], checkpointing), usable_bytes):
        return sizes[-1]
    lo, hi = 0, len(sizes) - 1  # sizes[lo] fits, sizes[hi] does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if evaluator.fits(config_for(split, sharding, sizes[mid], checkpointing), usable_bytes):
            lo = mid
        else:
            hi = mid
    return sizes[lo]


def qualifies(
    constraints: Constraints, hours: float, cost_usd: float, spot_hours: float | None, spot_cost_usd: float | None
) -> PricingMode | None:
    """The pricing (on demand first, else spot) under which a setup meets both budget and deadline."""

    def meets(h: float, usd: float) -> bool:
        budget_ok = constraints.budget_usd is None or usd <= constraints.budget_usd
        deadline_ok = constraints.deadline_hours is None or h <= constraints.deadline_hours
        return budget_ok and deadline_ok

    if meets(hours, cost_usd):
        return "on_demand"
    if spot_hours is not None and spot_cost_usd is not None and meets(spot_hours, spot_cost_usd):
        return "spot"
    return None


def price_candidate(
    ctx: PlanContext, offer_index: int, offer: Offer, spec: GpuSpec, layout: Layout, cfg: Config
) -> Candidate:
    """Speed, wall-clock and cost of a fitting setup, on demand and (where offered and allowed) on spot."""
    link = link_spec(spec, offer, layout.nodes)
    tp = ctx.evaluator.throughput(cfg, link)
    hours = ctx.total_tokens / tp.tokens_per_s / 3600.0
    cost = hours * layout.gpus * offer.on_demand_usd_per_hour
    spot: SpotRun | None = None
    spot_cost: float | None = None
    c = ctx.constraints
    if offer.spot_usd_per_hour is not None and c.spot_allowed:
        spot = spot_run(hours, layout.nodes, c.preemptions_per_hour, c.restart_minutes, ctx.checkpoint_write_seconds)
        spot_cost = spot.hours * layout.gpus * offer.spot_usd_per_hour
    return Candidate(
        offer=offer,
        offer_index=offer_index,
        spec=spec,
        link=link,
        layout=layout,
        cfg=cfg,
        effective_batch_size=ctx.effective_batch_size,
        peak_device_bytes=ctx.evaluator.memory(cfg).peak_device,
        throughput=tp,
        hours=hours,
        cost_usd=cost,
        spot=spot,
        spot_cost_usd=spot_cost,
        qualifies_with=qualifies(c, hours, cost, None if spot is None else spot.hours, spot_cost),
    )


def layout_candidates(
    ctx: PlanContext, offer_index: int, offer: Offer, spec: GpuSpec, layout: Layout
) -> list[Candidate]:
    """The fitting setups of one offer on one layout: per sharding and checkpointing, the largest micro-batch."""
    split = batch_split(ctx.effective_batch_size, layout.gpus)
    usable = ctx.usable_bytes(spec)
    checkpointing_options = (True,) if ctx.plan.gradient_checkpointing else (False, True)
    found = []
    for sharding in sharding_options(ctx.plan, layout.gpus):
        for checkpointing in checkpointing_options:
            m = largest_fitting_micro_batch(ctx.evaluator, split, sharding, checkpointing, usable)
            if m is None:
                continue
            cfg = config_for(split, sharding, m, checkpointing)
            found.append(price_candidate(ctx, offer_index, offer, spec, layout, cfg))
            if not checkpointing and m == split.micro_batch_sizes[-1]:
                break
    return found


NARROW_SEARCH = (
    "narrow the search: fewer GPUs (constraints.max_gpus), or fewer offers (constraints.providers, constraints.regions)"
)


def offer_candidates(ctx: PlanContext, offer_index: int, offer: Offer, spec: GpuSpec) -> list[Candidate]:
    """Every setup of one offer that the search keeps (see the module docstring for the pruning)."""
    single, multi = gpu_layouts(offer, ctx.constraints.max_gpus)
    deadline = ctx.constraints.deadline_hours

    def enough(found: list[Candidate]) -> bool:
        return bool(found) and (deadline is None or any(c.hours <= deadline for c in found))

    found: list[Candidate] = []
    for layout in single:
        found.extend(layout_candidates(ctx, offer_index, offer, spec, layout))
    if not enough(found):
        for layout in multi:
            ctx.budget.check("constraints", NARROW_SEARCH)
            more = layout_candidates(ctx, offer_index, offer, spec, layout)
            found.extend(more)
            if enough(more):
                break
    return found


def fastest_per_offer_and_count(candidates: list[Candidate]) -> list[Candidate]:
    """One setup per (offer, GPU count): the fastest, which is also the cheapest (same GPUs, same price)."""
    best: dict[tuple[int, int], Candidate] = {}
    for c in candidates:
        key = (c.offer_index, c.layout.gpus)
        if key not in best or c.hours < best[key].hours:
            best[key] = c
    return list(best.values())


def rank_key(c: Candidate) -> tuple[float, float, int, int]:
    """Whole-job on-demand cost, then hours (then catalog order, for a stable answer)."""
    return (c.cost_usd, c.hours, c.offer_index, c.layout.gpus)
