"""Why a card or an offer has no setup to recommend, in numbers, with the smallest change that fits."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from decimal import ROUND_CEILING, Decimal

from services.catalog.gpus import GpuSpec
from services.catalog.offers import Offer
from services.core.money import usd
from services.estimator.memory import GIB
from services.estimator.plan import Method, Optimizer, Plan, Sharding
from services.planner.batching import batch_split, config_for
from services.planner.constraints import SHOWN_HOURS_DECIMALS, Constraints
from services.planner.context import Candidate, HostRamBlocked, PlanContext, PricedSetup
from services.planner.evaluator import Evaluator
from services.planner.host_ram import (
    host_ram_available_bytes,
    host_ram_bytes_per_node,
    host_ram_margin,
    usable_host_ram_bytes,
)
from services.planner.layouts import Layout, gpu_layouts, offload_shardings, sharding_options
from services.planner.models import Rejection, RejectionKind

# Cheaper fine-tuning methods to suggest, least change first.
CHEAPER_METHODS: dict[Method, tuple[Method, ...]] = {"full": ("lora", "qlora"), "lora": ("qlora",), "qlora": ()}
# GPU counts a suggestion may name (beyond max_gpus, flagged as such).
SUGGESTION_GPU_COUNTS = (2, 4, 8, 16, 32, 64, 128)
# A setup priced on demand and maybe on spot, in full (a candidate) or as the ranking's arrays give it.
Priced = Candidate | PricedSetup


def gpus_label(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def _sharding_label(sharding: Sharding, gpus: int) -> str:
    if sharding == "none":
        return "DDP" if gpus > 1 else "no sharding"
    return sharding


def leanest_need(
    evaluator: Evaluator,
    effective_batch_size: int,
    gpus: int,
    offload: bool = False,
    optimizer: Optimizer | None = None,
) -> tuple[float, Sharding]:
    """Smallest bytes per GPU a setup is sized on (peak device memory times the headroom ratio) on ``gpus`` GPUs
    (micro-batch 1, gradient checkpointing on), over the sharding modes the planner tries (with CPU offload:
    FSDP and ZeRO-2, ``offload_shardings``), and the mode that reaches it."""
    split = batch_split(effective_batch_size, gpus)
    modes = offload_shardings(evaluator.base) if offload else sharding_options(evaluator.base, gpus)
    needs = [(evaluator.sized_bytes(config_for(split, s, 1, True, offload, optimizer)), s) for s in modes]
    return min(needs, key=lambda pair: pair[0])


def _offload_host_gib(ctx: PlanContext, gpus: int, gpus_per_node: int, sharding: Sharding) -> float:
    split = batch_split(ctx.effective_batch_size, gpus)
    cfg = config_for(split, sharding, 1, True, True)
    return host_ram_bytes_per_node(ctx, cfg, Layout(gpus_per_node, max(1, gpus // gpus_per_node))) / GIB


def _where(n: int, per_node: int) -> str:
    nodes = -(-n // per_node)
    return gpus_label(n) + (f" in {nodes} nodes of {per_node}" if nodes > 1 else "")


def _host_ram_limit_bytes(ctx: PlanContext, offers: list[Offer], gpus_per_node: int) -> float | None:
    """The most usable host RAM a node of ``gpus_per_node`` GPUs has over the offers; None when one of them
    does not say (then host RAM rules nothing out)."""
    usable = [usable_host_ram_bytes(ctx, o, Layout(min(gpus_per_node, max(1, o.gpus_per_node)), 1)) for o in offers]
    if not usable or any(u is None for u in usable):
        return None
    return max(u for u in usable if u is not None)


def fit_suggestion(ctx: PlanContext, usable_bytes: float, fewest_gpus: int, offers: list[Offer] | None = None) -> str:
    """The cheapest changes that fit a card, least change first: CPU offload (same training, needs host RAM;
    left out where every offer's nodes are known to have too little), more GPUs or nodes (same training, more
    money per hour), an 8-bit optimizer, then a cheaper method."""
    per_node = max((o.gpus_per_node for o in offers or ()), default=8)
    networked = any(o.inter_node_gbit_per_s is not None for o in offers or ())
    largest_node = min(per_node, ctx.constraints.max_gpus)
    cheaper = CHEAPER_METHODS[ctx.plan.method]
    max_gpus = ctx.constraints.max_gpus
    e = ctx.effective_batch_size
    parts: list[str] = []
    need, sharding = leanest_need(ctx.evaluator, e, largest_node, offload=True)
    host = _offload_host_gib(ctx, largest_node, per_node, sharding)
    ram_limit = _host_ram_limit_bytes(ctx, list(offers or ()), largest_node)
    if not ctx.plan.cpu_offload and need <= usable_bytes and (ram_limit is None or host * GIB <= ram_limit):
        setting = "" if ctx.constraints.allow_cpu_offload else " (set constraints.allow_cpu_offload)"
        parts.append(
            f"with optimizer offload to CPU on {gpus_label(largest_node)} ({sharding}; about {host:,.0f} GiB of "
            f"host RAM per node for the offloaded weights, gradients and optimizer states){setting}"
        )
    for n in SUGGESTION_GPU_COUNTS:
        if n <= fewest_gpus:
            continue
        need, sharding = leanest_need(ctx.evaluator, e, n)
        if need <= usable_bytes:
            limits = []
            if n > max_gpus:
                limits.append(f"above max_gpus {max_gpus}")
            if n > per_node and not networked:
                limits.append("needs a provider with a network between nodes")
            extra = f" ({'; '.join(limits)})" if limits else ""
            parts.append(f"on {_where(n, per_node)} with {_sharding_label(sharding, n)}{extra}")
            break
    eight_bit = len(parts) < 2 and ctx.plan.optimizer == "adamw" and not ctx.constraints.allow_optimizer_change
    if eight_bit and leanest_need(ctx.evaluator, e, largest_node, optimizer="paged-adamw-8bit")[0] <= usable_bytes:
        parts.append(f"with paged-adamw-8bit on {gpus_label(largest_node)} (set constraints.allow_optimizer_change)")
    if len(parts) < 2:
        for method in cheaper:
            if leanest_need(ctx.variant(method), e, fewest_gpus)[0] <= usable_bytes:
                parts.append(f"with {method}" + (f" on {gpus_label(fewest_gpus)}" if fewest_gpus > 1 else ""))
                break
    if not parts:
        for method in cheaper:
            for n in SUGGESTION_GPU_COUNTS:
                need, sharding = leanest_need(ctx.variant(method), e, n)
                if need <= usable_bytes:
                    above = f" (above max_gpus {max_gpus})" if n > max_gpus else ""
                    return f"fits with {method} on {_where(n, per_node)} and {_sharding_label(sharding, n)}{above}"
    if not parts:
        methods = ", ".join((ctx.plan.method, *cheaper))
        return (
            f"does not fit with {methods} on up to {SUGGESTION_GPU_COUNTS[-1]} GPUs of this card: "
            "use a larger card, a shorter seq_len or a smaller model"
        )
    return "fits " + ", or ".join(parts[:2])


def leanest_offload(setups: Sequence[HostRamBlocked]) -> HostRamBlocked:
    """The offload setup that needs the least host RAM (the first of equals; fewer GPUs first): all that the
    rejections below read of an offer's blocked setups."""
    return min(setups, key=lambda x: (x.host_ram_bytes_per_node, x.layout.gpus))


def _ram_gib(offer: Offer, s: HostRamBlocked) -> tuple[float, float]:
    """(needed GiB, node GiB) of an offload setup (the leanest of an offer's) on the offer's nodes."""
    available = host_ram_available_bytes(offer, s.layout) or 0.0
    return s.host_ram_bytes_per_node / GIB, available / GIB


# An offer whose offload setups its nodes' host RAM cannot hold, with the leanest of them (``leanest_offload``: all
# the rejections read of them); the closest of a set: the planner picks it by ``ram_shortfall``, the first of equals.
RamBlockedOffer = tuple[Offer, HostRamBlocked]


def ram_shortfall(offer: Offer, leanest: HostRamBlocked) -> float:
    """GiB by which the offer's node RAM falls short of its leanest offload setup: how close it comes."""
    needed, available = _ram_gib(offer, leanest)
    return needed - available


def _ram_text(ctx: PlanContext, blocked: RamBlockedOffer) -> tuple[str, float, float, int]:
    """Why in words (the leanest setup's need against the node's RAM), needed GiB, node GiB and GPUs."""
    offer, leanest = blocked
    before, after, needed, available, gpus = _ram_parts(ctx, offer, leanest)
    return f"{before}{offer.provider}{after}", needed, available, gpus


def _ram_parts(ctx: PlanContext, offer: Offer, s: HostRamBlocked) -> tuple[str, str, float, float, int]:
    """``_ram_text``'s words before and after the provider's name, needed GiB, node GiB and GPUs."""
    needed, available = _ram_gib(offer, s)
    usable = usable_host_ram_bytes(ctx, offer, s.layout) or 0.0
    margin = host_ram_margin(ctx)
    before = (
        f"with CPU offload it fits {_where(s.layout.gpus, s.layout.gpus_per_node)} ({s.cfg.sharding}) but needs "
        f"{s.host_ram_bytes_per_node / GIB:,.0f} GiB of host RAM per node; "
    )
    after = f"'s node has {available:,.0f} GiB ({usable / GIB:,.0f} GiB usable with the {margin * 100:g}% margin)"
    return before, after, needed, available, s.layout.gpus


def host_ram_rejections(
    ctx: PlanContext, spec: GpuSpec, rows: Iterable[tuple[RamBlockedOffer, int]]
) -> list[Rejection]:
    """Per row, one provider's ``offers`` offers of a card that fits elsewhere, left out because their nodes' host
    RAM cannot hold what their only fitting setups (CPU offload) put there; the numbers are those of the row's
    offer that comes closest. Rows of one node RAM and leanest setup share their words but the provider's name,
    worked out once."""
    words: dict[tuple[object, ...], tuple[str, str, float, float, int, str]] = {}
    out = []
    for (offer, s), offers in rows:
        key = (offer.host_ram_gib_per_node, offer.gpus_per_node, s.layout, s.cfg.sharding, s.host_ram_bytes_per_node)
        found = words.get(key)
        if found is None:
            before, after, needed, available, gpus = _ram_parts(ctx, offer, s)
            fix = (
                f"a node with at least {needed / (1.0 - host_ram_margin(ctx)):,.0f} GiB of host RAM, or another "
                f"offer of the {spec.name} (see the recommendations)"
            )
            found = words[key] = (before, after, round(needed, 1), round(available, 1), gpus, fix)
        before, after, needed_gib, available_gib, gpus, fix = found
        more = f" (and {offers - 1} more offers of {offer.provider} like it)" if offers > 1 else ""
        out.append(
            Rejection(
                gpu=spec.name,
                provider=offer.provider,
                kind="memory",
                reason=f"host RAM: {before}{offer.provider}{after}{more}; nothing else fits this offer",
                gpu_memory_gib=spec.memory_gib,
                gpus=gpus,
                fix=fix,
                suggestion=fix,
                host_ram_needed_gib_per_node=needed_gib,
                host_ram_gib_per_node=available_gib,
            )
        )
    return out


def memory_rejection(
    ctx: PlanContext, spec: GpuSpec, offers: list[Offer], ram_blocked: RamBlockedOffer | None = None
) -> Rejection:
    """A card on which no setup fits, with what the leanest setups need against what it has, and the fix.

    ``ram_blocked``: where some offers' CPU-offload setups fit the GPUs but not the nodes' host RAM, the one whose
    nodes come closest; the reason then says so in numbers, and the fix goes on to more GPUs or nodes."""
    most, batch = ctx.constraints.max_gpus, ctx.effective_batch_size
    counts = sorted({layout.gpus for offer in offers for group in gpu_layouts(offer, most, batch) for layout in group})
    margin = ctx.constraints.safety_margin
    usable = ctx.usable_bytes(spec)
    if not counts:
        smallest = min(o.gpus_per_node for o in offers)
        fix = f"set constraints.max_gpus to at least {smallest}, or choose an offer rented per GPU"
        return Rejection(
            gpu=spec.name,
            kind="gpu_count",
            reason=f"sold only as nodes of {smallest} GPUs, more than max_gpus {ctx.constraints.max_gpus}; {fix}",
            gpu_memory_gib=spec.memory_gib,
            gpus=smallest,
            fix=fix,
            suggestion=fix,
        )
    fewest, most = counts[0], counts[-1]
    need, _ = leanest_need(ctx.evaluator, ctx.effective_batch_size, fewest)
    reason = (
        f"needs {need / GIB:.1f} GiB per GPU on {gpus_label(fewest)} (micro-batch 1, gradient checkpointing; "
        f"the predicted peak times the memory band's headroom), card has {spec.memory_gib:.1f} GiB"
        + (f" ({usable / GIB:.1f} GiB usable with the {margin * 100:g}% margin)" if margin > 0 else "")
    )
    if most > fewest:
        need_most, sharding = leanest_need(ctx.evaluator, ctx.effective_batch_size, most)
        with_mode = f"{gpus_label(most)} with {_sharding_label(sharding, most)}"
        reason += f"; {with_mode} still need {need_most / GIB:.1f} GiB per GPU"
        need, fewest = need_most, most
    suggestion = fit_suggestion(ctx, usable, fewest, offers)
    host_needed = host_available = None
    if ram_blocked is not None:
        text, host_needed, host_available, _ = _ram_text(ctx, ram_blocked)
        reason += f"; {text}"
    return Rejection(
        gpu=spec.name,
        kind="memory",
        reason=f"{reason}; {suggestion}",
        host_ram_needed_gib_per_node=None if host_needed is None else round(host_needed, 1),
        host_ram_gib_per_node=None if host_available is None else round(host_available, 1),
        needed_gib_per_gpu=round(need / GIB, 2),
        gpu_memory_gib=spec.memory_gib,
        usable_gib=round(usable / GIB, 2),
        usable_gib_per_gpu=round(usable / GIB, 2),
        gpus=fewest,
        fix=suggestion,
        suggestion=suggestion,
    )


def _setup_label(c: Priced) -> str:
    return f"{c.layout.gpus} x {c.spec.name}"


def _meets_budget(constraints: Constraints, c: Priced) -> bool:
    spot = c.spot_cost_usd is not None and constraints.meets_budget(c.spot_cost_usd)
    return bool(constraints.meets_budget(c.cost_usd) or spot)


def _meets_deadline(constraints: Constraints, c: Priced) -> bool:
    spot = c.spot_hours is not None and constraints.meets_deadline(c.spot_hours)
    return bool(constraints.meets_deadline(c.hours) or spot)


def constraint_rejection(constraints: Constraints, offer: Offer, setups: Sequence[Priced]) -> Rejection:
    """An offer whose fitting setups all break the budget or the deadline (or never meet both at once)."""
    cheapest = min(setups, key=lambda c: c.cost_usd)
    fastest = min(setups, key=lambda c: c.hours)
    budget_ok = [c for c in setups if _meets_budget(constraints, c)]
    deadline_ok = [c for c in setups if _meets_deadline(constraints, c)]
    budget, deadline = constraints.budget_usd, constraints.deadline_hours
    over_budget = over_deadline = ""
    kind: RejectionKind
    if budget is not None:
        spot = f" and {usd(cheapest.spot_cost_usd)} expected on spot" if cheapest.spot_cost_usd is not None else ""
        over_budget = (
            f"the cheapest fitting setup ({_setup_label(cheapest)}) costs {usd(cheapest.cost_usd)} on demand{spot}, "
            f"over the {usd(budget)} budget"
        )
    if deadline is not None:
        over_deadline = (
            f"the fastest fitting setup ({_setup_label(fastest)}) takes {_over(fastest.hours, deadline, 2):.2f} h, "
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
        assert budget is not None  # no setup meets both, yet some meet each: neither is absent
        reason = (
            f"no setup meets both: within the {deadline:g} h deadline the cheapest ({_setup_label(within_deadline)}) "
            f"costs {usd(within_deadline.cost_usd)} (budget {usd(budget)}); within budget the fastest "
            f"({_setup_label(within_budget)}) takes {_over(within_budget.hours, deadline, 2):.2f} h"
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
        hours=_over(ref.hours, deadline, SHOWN_HOURS_DECIMALS),
    )


def _over(hours: float, deadline: float | None, decimals: int) -> float:
    """``hours`` rounded to ``decimals`` places, up where a run over the deadline would read as meeting it (a
    rejection's hours read 1.806 beside a 1.806 h deadline, its run 1.8062 h)."""
    shown = round(hours, decimals)
    if deadline is not None and hours > deadline >= shown:
        shown = float(Decimal(repr(hours)).quantize(Decimal(1).scaleb(-decimals), rounding=ROUND_CEILING))
    return shown


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


def lacks_precision(plan: Plan, spec: GpuSpec) -> bool:
    """Whether the card cannot run the plan's precision at all: bf16 needs compute capability 8.0 (Ampere) or
    newer. Turing (T4) and Volta (V100) have no bf16 tensor cores, and the HF Trainer refuses ``bf16=True``
    on them ("Your setup doesn't support bf16/gpu"); the spec marks them with no bf16 rate."""
    return plan.precision.startswith("bf16") and not spec.bf16_tflops


def precision_rejection(plan: Plan, spec: GpuSpec, offer: Offer) -> Rejection | None:
    """The rejection of a card that cannot run the plan's precision (``lacks_precision``), for the offer's
    provider; None where it can."""
    if not lacks_precision(plan, spec):
        return None
    return Rejection(
        gpu=spec.name,
        provider=offer.provider,
        kind="precision",
        reason=f"{spec.name} has no bf16 support (bf16 needs an Ampere or newer GPU); the plan's precision is "
        f"{plan.precision}",
        fix="submit the plan with precision fp16-mixed to consider this card",
        suggestion="precision fp16-mixed",
    )
