"""Why a card or an offer has no setup to recommend, in numbers, with the smallest change that fits."""

from __future__ import annotations

from services.catalog.gpus import GpuSpec
from services.catalog.offers import Offer
from services.estimator.memory import GIB
from services.estimator.plan import Method, Sharding
from services.planner.batching import batch_split
from services.planner.constraints import Constraints
from services.planner.evaluator import Evaluator
from services.planner.layouts import gpu_layouts, sharding_options
from services.planner.models import Rejection, RejectionKind
from services.planner.search import Candidate, PlanContext, config_for

# Cheaper fine-tuning methods to suggest, least change first.
CHEAPER_METHODS: dict[Method, tuple[Method, ...]] = {"full": ("lora", "qlora"), "lora": ("qlora",), "qlora": ()}
# GPU counts a suggestion may name (beyond max_gpus, flagged as such).
SUGGESTION_GPU_COUNTS = (2, 4, 8, 16, 32, 64, 128)


def gpus_label(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def _sharding_label(sharding: Sharding, gpus: int) -> str:
    if sharding == "none":
        return "DDP" if gpus > 1 else "no sharding"
    return sharding


def leanest_need(evaluator: Evaluator, effective_batch_size: int, gpus: int) -> tuple[float, Sharding]:
    """Smallest peak device bytes per GPU on ``gpus`` GPUs (micro-batch 1, gradient checkpointing on),
    over the sharding modes the planner tries, and the mode that reaches it."""
    split = batch_split(effective_batch_size, gpus)
    needs = [
        (evaluator.memory(config_for(split, s, 1, True)).peak_device, s) for s in sharding_options(evaluator.base, gpus)
    ]
    return min(needs, key=lambda pair: pair[0])


def fit_suggestion(ctx: PlanContext, usable_bytes: float, fewest_gpus: int) -> str:
    """The smallest change that fits a card: a cheaper method on as few GPUs, and/or more GPUs."""
    cheaper = CHEAPER_METHODS[ctx.plan.method]
    max_gpus = ctx.constraints.max_gpus
    e = ctx.effective_batch_size
    gpus_min = fewest_gpus
    parts: list[str] = []
    for method in cheaper:
        if leanest_need(ctx.variant(method), e, gpus_min)[0] <= usable_bytes:
            parts.append(f"with {method}" + (f" on {gpus_label(gpus_min)}" if gpus_min > 1 else ""))
            break
    for n in SUGGESTION_GPU_COUNTS:
        if n <= gpus_min:
            continue
        need, sharding = leanest_need(ctx.evaluator, e, n)
        if need <= usable_bytes:
            above = f" (above max_gpus {max_gpus})" if n > max_gpus else ""
            parts.append(f"with {gpus_label(n)} and {_sharding_label(sharding, n)}{above}")
            break
    if not parts:
        for method in cheaper:
            for n in SUGGESTION_GPU_COUNTS:
                need, sharding = leanest_need(ctx.variant(method), e, n)
                if need <= usable_bytes:
                    above = f" (above max_gpus {max_gpus})" if n > max_gpus else ""
                    return f"fits with {method} on {gpus_label(n)} and {_sharding_label(sharding, n)}{above}"
    if not parts:
        methods = ", ".join((ctx.plan.method, *cheaper))
        return (
            f"does not fit with {methods} on up to {SUGGESTION_GPU_COUNTS[-1]} GPUs of this card: "
            "use a larger card, a shorter seq_len or a smaller model"
        )
    return "fits " + ", or ".join(parts)


def memory_rejection(ctx: PlanContext, spec: GpuSpec, offers: list[Offer]) -> Rejection:
    """A card on which no setup fits, with what the leanest setups need against what it has."""
    counts = sorted(
        {layout.gpus for offer in offers for group in gpu_layouts(offer, ctx.constraints.max_gpus) for layout in group}
    )
    margin = ctx.constraints.safety_margin
    usable = ctx.usable_bytes(spec)
    if not counts:
        smallest = min(o.gpus_per_node for o in offers)
        return Rejection(
            gpu=spec.name,
            kind="gpu_count",
            reason=f"sold only as nodes of {smallest} GPUs, more than max_gpus {ctx.constraints.max_gpus}",
            gpu_memory_gib=spec.memory_gib,
            gpus=smallest,
        )
    fewest, most = counts[0], counts[-1]
    need, _ = leanest_need(ctx.evaluator, ctx.effective_batch_size, fewest)
    reason = (
        f"needs {need / GIB:.1f} GiB per GPU on {gpus_label(fewest)} (micro-batch 1, gradient checkpointing), "
        f"card has {spec.memory_gib:.1f} GiB ({usable / GIB:.1f} GiB usable with the {margin * 100:g}% margin)"
    )
    if most > fewest:
        need_most, sharding = leanest_need(ctx.evaluator, ctx.effective_batch_size, most)
        with_mode = f"{gpus_label(most)} with {_sharding_label(sharding, most)}"
        reason += f"; {with_mode} still need {need_most / GIB:.1f} GiB per GPU"
    suggestion = fit_suggestion(ctx, usable, fewest)
    return Rejection(
        gpu=spec.name,
        kind="memory",
        reason=f"{reason}; {suggestion}",
        needed_gib_per_gpu=round(need / GIB, 2),
        gpu_memory_gib=spec.memory_gib,
        usable_gib=round(usable / GIB, 2),
        gpus=fewest,
        suggestion=suggestion,
    )


def _setup_label(c: Candidate) -> str:
    return f"{c.layout.gpus} x {c.spec.name}"


def _meets_budget(constraints: Constraints, c: Candidate) -> bool:
    budget = constraints.budget_usd
    return budget is None or c.cost_usd <= budget or (c.spot_cost_usd is not None and c.spot_cost_usd <= budget)


def _meets_deadline(constraints: Constraints, c: Candidate) -> bool:
    deadline = constraints.deadline_hours
    return deadline is None or c.hours <= deadline or (c.spot is not None and c.spot.hours <= deadline)


def constraint_rejection(constraints: Constraints, offer: Offer, setups: list[Candidate]) -> Rejection:
    """An offer whose fitting setups all break the budget or the deadline (or never meet both at once)."""
    cheapest = min(setups, key=lambda c: c.cost_usd)
    fastest = min(setups, key=lambda c: c.hours)
    budget_ok = [c for c in setups if _meets_budget(constraints, c)]
    deadline_ok = [c for c in setups if _meets_deadline(constraints, c)]
    budget, deadline = constraints.budget_usd, constraints.deadline_hours
    over_budget = over_deadline = ""
    kind: RejectionKind
    if budget is not None:
        spot = f" and ${cheapest.spot_cost_usd:,.2f} expected on spot" if cheapest.spot_cost_usd is not None else ""
        over_budget = (
            f"the cheapest fitting setup ({_setup_label(cheapest)}) costs ${cheapest.cost_usd:,.2f} on demand{spot}, "
            f"over the ${budget:,.2f} budget"
        )
    if deadline is not None:
        over_deadline = (
            f"the fastest fitting setup ({_setup_label(fastest)}) takes {fastest.hours:.2f} h, "
            f"over the {deadline:g} h deadline"
        )
    if not budget_ok and not deadline_ok:
        kind, reason, ref = "budget_and_deadline", f"{over_budget}; {over_deadline}", cheapest
    elif not budget_ok:
        kind, reason, ref = "budget", over_budget, cheapest
    elif not deadline_ok:
        kind, reason, ref = "deadline", over_deadline, fastest
    else:
        within_deadline = min(deadline_ok, key=lambda c: c.cost_usd)
        within_budget = min(budget_ok, key=lambda c: c.hours)
        kind, ref = "budget_and_deadline", within_deadline
        reason = (
            f"no setup meets both: within the {deadline:g} h deadline the cheapest ({_setup_label(within_deadline)}) "
            f"costs ${within_deadline.cost_usd:,.2f} (budget ${budget:,.2f}); within budget the fastest "
            f"({_setup_label(within_budget)}) takes {within_budget.hours:.2f} h"
        )
    return Rejection(
        gpu=cheapest.spec.name,
        provider=offer.provider,
        kind=kind,
        reason=reason,
        needed_gib_per_gpu=round(ref.peak_device_bytes / GIB, 2),
        gpu_memory_gib=ref.spec.memory_gib,
        gpus=ref.layout.gpus,
        cost_usd=round(ref.cost_usd, 2),
        hours=round(ref.hours, 3),
    )


def filter_rejection(constraints: Constraints, offer: Offer) -> Rejection | None:
    """An offer the provider or region constraints exclude, or None if they allow it."""
    if not constraints.allows_provider(offer.provider):
        allowed = ", ".join(constraints.providers)
        return Rejection(
            gpu=offer.gpu,
            provider=offer.provider,
            kind="provider",
            reason=f"provider {offer.provider!r} is not among the allowed providers ({allowed})",
        )
    if not constraints.allows_region(offer.region, offer.country):
        allowed = ", ".join(constraints.regions)
        where = f"{offer.region!r}" + (f" (country {offer.country!r})" if offer.country else "")
        return Rejection(
            gpu=offer.gpu,
            provider=offer.provider,
            kind="region",
            reason=f"region {where} is not among the allowed regions or countries ({allowed})",
        )
    return None
