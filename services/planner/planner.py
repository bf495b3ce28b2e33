"""Plan a fine-tuning job over a price list: every setup that fits, ranked by the expected cost of the rented run.

A setup is an offer (provider x card x price) rented as some GPUs on some nodes, with a sharding mode, a
micro-batch and accumulation that keep the plan's effective batch, gradient checkpointing on or off, and
(only where nothing else fits) CPU offload or, when the user allows it, an 8-bit optimizer. It fits when
the predicted peak device memory per GPU stays under the card's memory less the safety margin (the upper
end of the estimate's uncertainty band where the estimate has one). Each setup is priced on demand and,
where the offer has a spot price, on spot; both pricings are ranked together by expected cost: start-up,
model download, training at the speed its links allow, checkpoints, preemption rework and the provider's
billing increment and minimum (services.planner.costs). Ties go to fewer GPUs, then fewer nodes, then the
shorter run, then the cost before rounding (Entry.rank_key), and a setup with more GPUs, more nodes, spot or
CPU offload ranks above a simpler one only when it is cheaper by more than constraints.prefer_simpler_within
(services.planner.ranking). The plan's method and precision are never changed; a card on which nothing fits
gets a rejection with what it needed, what it has, and the cheapest change that fits.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime

import numpy as np

from services.catalog.gpus import GpuSpec, gpu_specs
from services.catalog.market import as_market
from services.catalog.offers import Offer, bundled_offers
from services.core.money import usd
from services.estimator.architecture import Architecture, parameter_counts
from services.estimator.budget import CpuBudget, unlimited
from services.estimator.communication import synchronisation_fraction
from services.estimator.fit import FIT_QUANTILE
from services.estimator.memory import GIB, adapter_params
from services.estimator.padding import short_run_warnings, truncation_note
from services.estimator.plan import Plan
from services.estimator.recipe import Recipe
from services.estimator.resolved import ResolvedPlan, as_resolved
from services.planner.batching import effective_batch_size
from services.planner.constraints import SHOWN_COST_DECIMALS, SHOWN_HOURS_DECIMALS, Constraints
from services.planner.context import Candidate, Entry, PlanContext, RunSizes
from services.planner.costs import (
    DEFAULT_DOWNLOAD_GBIT_PER_S,
    DEFAULT_PREEMPTION_PER_NODE_HOUR,
    DEFAULT_STARTUP_S,
    UPLOAD_BYTES_PER_S,
    RunCost,
    spot_note,
)
from services.planner.errors import PlannerError
from services.planner.evaluator import Config, Evaluator
from services.planner.host_ram import host_ram_available_bytes, host_ram_margin
from services.planner.layouts import Layout
from services.planner.models import PlannerResult, Recommendation, Rejection
from services.planner.ranking import Pricer, rank_entries, unqualified_offers
from services.planner.rejections import (
    RamBlockedOffer,
    constraint_rejection,
    gpus_label,
    host_ram_rejections,
    leanest_offload,
    memory_rejection,
    ram_shortfall,
)
from services.planner.scan import Scan, scan_offers
from services.planner.spot import (
    CAPACITY_WAIT_CAP_HOURS,
    CHECKPOINT_WRITE_BYTES_PER_S,
    checkpoint_bytes,
    checkpoint_write_seconds,
)

DEFAULT_TOP_N = 10
STALE_AFTER_HOURS = 24.0
_REJECTION_ORDER = (
    "memory",
    "precision",
    "gpu_count",
    "budget",
    "deadline",
    "budget_and_deadline",
    "unknown_gpu",
    "provider",
    "region",
)


def _check_plannable(plan: Plan, top_n: int) -> float:
    """The data set's total tokens, after checking the plan is one the planner can rank."""
    if plan.data is None:
        raise PlannerError(
            "data",
            "the data set size is needed for time and cost: give data.tokens, or data.examples with "
            "data.avg_tokens_per_example (and data.epochs)",
        )
    if plan.model.generic is not None:
        raise PlannerError(
            "model.generic",
            "the planner needs the model's architecture for speed: give model.name (an HF id) or model.config",
        )
    if not plan.is_training:
        raise PlannerError("mode", f"the planner plans training runs: mode must be 'train', got {plan.mode!r}")
    if top_n < 1:
        raise PlannerError("top_n", f"must be at least 1, got {top_n}")
    return plan.data.total_tokens()


def run_sizes(plan: Plan, arch: Architecture, recipe: Recipe) -> RunSizes:
    """What the run downloads (the base model as 16-bit safetensors: a QLoRA base is quantized on load),
    checkpoints (services.planner.spot.checkpoint_bytes) and uploads at the end (the adapter in 16-bit,
    or the full weights in 16-bit)."""
    total = float(parameter_counts(arch).total)
    size = checkpoint_bytes(plan, arch)
    final = total * 2.0 if plan.method == "full" else float(adapter_params(arch, recipe) * 2)
    return RunSizes(
        model_download_bytes=total * 2.0,
        checkpoint_bytes=size,
        final_upload_bytes=final,
        checkpoint_write_s=checkpoint_write_seconds(size),
    )


def plan_setups(
    plan: Plan | ResolvedPlan,
    offers: Sequence[Offer] | None = None,
    specs: tuple[GpuSpec, ...] | None = None,
    constraints: Constraints | None = None,
    *,
    top_n: int = DEFAULT_TOP_N,
    utilisation: Mapping[str, tuple[float, str]] | None = None,
    budget: CpuBudget | None = None,
    now: datetime | None = None,
) -> PlannerResult:
    """Every setup over ``offers`` (default: the bundled price lists) that fits ``plan``, cheapest expected
    run first, on demand and spot mixed (``plan`` resolved once by the caller, or resolved here).

    Returns the ``top_n`` entries that meet the constraints, the best one per card, and a rejection for
    every card on which nothing fits and every offer whose fitting setups break the budget, the
    deadline, or the provider and region filters. ``now`` (the caller's clock; the planner reads none)
    marks prices fetched more than a day before it. Raises :class:`PlannerError` without a data set size,
    and :class:`WorkBudgetExceeded` when the search needs more CPU time than ``budget``.
    """
    _check_plannable(plan.plan if isinstance(plan, ResolvedPlan) else plan, top_n)
    constraints = constraints if constraints is not None else Constraints()
    offers = as_market(offers if offers is not None else bundled_offers())
    specs = specs if specs is not None else gpu_specs()
    name, ctx = plan_context(plan, constraints, utilisation, budget)
    total_tokens = ctx.total_tokens

    scan = scan_offers(ctx, offers, specs)
    warnings = [*_plan_warnings(ctx), *scan.warnings]
    if not scan.cards:
        warnings.append("no offer is left to plan on after the provider and region constraints")
    pricer = Pricer(ctx, scan)
    entries, firsts = rank_entries(ctx, scan, pricer, top_n)
    rejections = [*scan.rejections, *_rejections(ctx, scan)]
    for setups in unqualified_offers(ctx, scan):
        rejections.append(constraint_rejection(constraints, setups[0].offer, setups))
    if scan.cards and not entries:
        warnings.append("no setup fits and meets the constraints: see rejections")

    built: dict[tuple[int, Layout, Config, str, tuple[str, ...], tuple[str, ...]], Recommendation] = {}

    def recommend(e: Entry) -> Recommendation:
        # An entry is one pricing of one setup of one offer: those values name it (an offer has one setup per
        # layout and configuration), with the notes of the ranking that shows it (the whole one, or its card's).
        c = e.candidate
        key = (c.offer_index, c.layout, c.cfg, e.cost.pricing, e.lead, e.tail)
        if key not in built:
            built[key] = _recommendation(ctx, e, now)
        return built[key]

    order = {kind: rank for rank, kind in enumerate(_REJECTION_ORDER)}
    return PlannerResult(
        model=name,
        total_tokens=total_tokens,
        plan_effective_batch_size=ctx.effective_batch_size,
        recommendations=[recommend(e) for e in entries[:top_n]],
        best_per_gpu=[recommend(e) for e in firsts],
        rejections=sorted(rejections, key=lambda r: (order[r.kind], r.gpu, r.provider or "")),
        candidates_evaluated=ctx.evaluator.memory_probes,
        warnings=warnings,
        assumptions=_assumptions(ctx),
    )


def plan_context(
    plan: Plan | ResolvedPlan,
    constraints: Constraints,
    utilisation: Mapping[str, tuple[float, str]] | None = None,
    budget: CpuBudget | None = None,
) -> tuple[str, PlanContext]:
    """The model's name and what one planning call shares (``plan_setups`` and the exact setups of quotes build
    it the same way, so both price a setup alike). Raises :class:`PlannerError` for a plan it cannot rank."""
    total_tokens = _check_plannable(plan.plan if isinstance(plan, ResolvedPlan) else plan, DEFAULT_TOP_N)
    resolved = as_resolved(plan)
    plan, arch = resolved.plan, resolved.architecture
    return resolved.name, PlanContext(
        plan=plan,
        arch=arch,
        constraints=constraints,
        total_tokens=total_tokens,
        effective_batch_size=effective_batch_size(plan),
        sizes=run_sizes(plan, arch, resolved.recipe),
        evaluator=Evaluator(plan, arch, utilisation, recipe=resolved.recipe),
        budget=budget if budget is not None else unlimited(),
    )


def _rejections(ctx: PlanContext, scan: Scan) -> list[Rejection]:
    """A memory rejection per card with no fitting setup (saying so where host RAM was the limit), and one per
    provider of a fitting card whose offers' nodes cannot hold in host RAM their only fitting (offload) setups.

    Offers of one group and provider come out alike, so each such set is explained once, by its first offer."""
    closest: dict[str, RamBlockedOffer] = {}
    by_provider: dict[str, list[tuple[RamBlockedOffer, int]]] = {}
    blocked = scan.ram_blocked_groups()
    if blocked:
        # Per blocked group, its leanest blocked setup (all the rejections read of its setups) and how far its
        # nodes' RAM falls short of it (every offer of a group has the same node RAM); then per offer of them, its
        # group, card and provider.
        leanest = [leanest_offload(group.ram_blocked) for group in blocked]
        shortfall = np.array([ram_shortfall(scan.offers[g.first], s) for g, s in zip(blocked, leanest, strict=True)])
        card_codes: dict[str, int] = {}
        card_of_group = np.array([card_codes.setdefault(g.spec.name, len(card_codes)) for g in blocked])
        cards = list(card_codes)
        group_of = np.repeat(np.arange(len(blocked)), [len(g.indices) for g in blocked])
        indices = np.concatenate([g.indices for g in blocked])
        provider_of, providers = scan.offers.codes(("provider",))
        short, card_of = shortfall[group_of], card_of_group[group_of]

        def per_key(key: np.ndarray) -> Iterator[tuple[int, RamBlockedOffer, int]]:
            """Per distinct ``key`` of the offers, in order of its first offer: the key, its closest offer
            (the least ``ram_shortfall``, the first of equals) with its group's leanest setup, and
            how many offers have the key."""
            order = np.lexsort((indices, short, key))
            keys = key[order]
            starts = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
            counts = np.diff(np.concatenate((starts, [len(keys)])))
            by_first = np.argsort(np.minimum.reduceat(indices[order], starts))
            for code, at, count in zip(
                keys[starts][by_first].tolist(),
                order[starts][by_first].tolist(),
                counts[by_first].tolist(),
                strict=True,
            ):
                yield code, (scan.offers[int(indices[at])], leanest[int(group_of[at])]), count

        for code, row, _ in per_key(card_of):
            closest[cards[code]] = row
        for code, row, count in per_key(card_of * len(providers) + provider_of[indices]):
            by_provider.setdefault(cards[code // len(providers)], []).append((row, count))
    out = []
    for card, spec in scan.cards.items():
        if card not in scan.fitting_cards:
            out.append(memory_rejection(ctx, spec, scan.card_offers(card), closest.get(card)))
        else:
            out.extend(host_ram_rejections(ctx, spec, by_provider.get(card, [])))
    return out


def scaling_efficiency(ctx: PlanContext, c: Candidate) -> float:
    """Tokens/s of the setup over gpus x tokens/s of one GPU of the card at the same micro-batch and
    effective batch (no memory limit on the one GPU: this isolates communication and synchronisation)."""
    if c.layout.gpus == 1:
        return 1.0
    cfg = c.cfg
    one = Config(
        gpus=1,
        sharding=cfg.sharding if cfg.cpu_offload else "none",
        micro_batch_size=cfg.micro_batch_size,
        accumulation_steps=cfg.accumulation_steps * c.layout.gpus,
        checkpointing=cfg.checkpointing,
        cpu_offload=cfg.cpu_offload,
        optimizer=cfg.optimizer,
    )
    single = ctx.evaluator.throughput(one, c.spec, spill=False)
    ratio = c.throughput.tokens_per_s / (c.layout.gpus * single.tokens_per_s)
    # With CPU offload one GPU streams the whole model over its own host link while n GPUs stream a shard
    # each, so the ratio can pass 1; the synchronisation every multi-GPU step waits for still bounds it.
    waiting = synchronisation_fraction(c.layout.gpus) * c.throughput.seconds["compute"] / c.throughput.step_seconds
    return min(ratio, 1.0 - waiting)


def price_age_hours(fetched_at: str, now: datetime | None) -> float | None:
    """Hours between an offer's ``fetched_at`` (an ISO date or a UTC datetime) and ``now``; None without
    ``now`` or with an unreadable date."""
    if now is None:
        return None
    try:
        fetched = datetime.fromisoformat(fetched_at.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if fetched.tzinfo is None:
        fetched = fetched.replace(tzinfo=UTC)
    current = now if now.tzinfo is not None else now.replace(tzinfo=UTC)
    return (current - fetched).total_seconds() / 3600.0


def _breakdown(cost: RunCost) -> dict[str, float]:
    return {k: round(v, 4) for k, v in cost.breakdown.items()}


def _recommendation(ctx: PlanContext, e: Entry, now: datetime | None) -> Recommendation:
    c, cost = e.candidate, e.cost
    gpus = c.layout.gpus
    peak_gib = c.peak_device_bytes / GIB
    spot = c.spot
    age = price_age_hours(c.offer.fetched_at, now)
    return Recommendation(
        provider=c.offer.provider,
        gpu=c.spec.name,
        region=c.offer.region,
        pricing=cost.pricing,
        expected_cost_usd=round(cost.expected_cost_usd, SHOWN_COST_DECIMALS),
        expected_hours=round(cost.hours, SHOWN_HOURS_DECIMALS),
        cost_breakdown=_breakdown(cost),
        gpus=gpus,
        gpus_per_node=c.layout.gpus_per_node,
        nodes=c.layout.nodes,
        offer_gpus_per_node=c.offer.gpus_per_node,
        links=c.setup.links.label() if gpus > 1 else "one GPU",
        sharding=c.cfg.sharding,
        cpu_offload=c.cfg.cpu_offload,
        host_ram_gib_per_node=round(c.setup.host_ram_bytes_per_node / GIB, 1) if c.cfg.cpu_offload else None,
        optimizer=c.cfg.optimizer or ctx.plan.optimizer,
        micro_batch_size=c.cfg.micro_batch_size,
        gradient_accumulation_steps=c.cfg.accumulation_steps,
        effective_batch_size=c.cfg.micro_batch_size * c.cfg.accumulation_steps * gpus,
        gradient_checkpointing=c.cfg.checkpointing,
        peak_gib_per_gpu=round(peak_gib, 2),
        gpu_memory_gib=c.spec.memory_gib,
        usable_gib=round(ctx.usable_bytes(c.spec) / GIB, 2),
        headroom_gib=round(c.spec.memory_gib - peak_gib, 2),
        tokens_per_s=round(c.throughput.tokens_per_s, 1),
        tokens_per_s_per_gpu=round(c.throughput.tokens_per_s_per_gpu, 1),
        data_tokens_per_s=round(c.throughput.data_tokens_per_s, 1),
        mfu=round(c.throughput.mfu, 4),
        scaling_efficiency=round(scaling_efficiency(ctx, c), 3),
        hours=round(c.on_demand.hours, 3),
        cost_usd=round(c.on_demand.expected_cost_usd, 2),
        price_usd_per_hour=round(c.on_demand.price_usd_per_hour, 4),
        spot_price_usd_per_hour=None if spot is None else round(spot.price_usd_per_hour, 4),
        spot_hours=None if spot is None else round(spot.hours, 3),
        spot_cost_usd=None if spot is None else round(spot.expected_cost_usd, 2),
        expected_preemptions=None if spot is None else round(spot.expected_preemptions, 3),
        checkpoint_interval_minutes=None if spot is None else round(spot.checkpoint_interval_s / 60.0, 1),
        qualifies_with=cost.pricing,
        price_fetched_at=c.offer.fetched_at,
        price_age_hours=None if age is None else round(age, 1),
        stale_price=age is not None and age > STALE_AFTER_HOURS,
        notes=_notes(ctx, e, age),
        ranking_notes=[*e.lead, *e.tail],
    )


def tight_note(ctx: PlanContext, c: Candidate) -> str:
    """A risk note where the setup fits by the headroom rule but the upper end (p90) of its device band does not:
    offered, since runs that close to the card have run, but named tight with its band; empty otherwise."""
    usable = ctx.usable_bytes(c.spec)
    high = ctx.evaluator.band_high_bytes(c.cfg)
    if high <= usable:
        return ""
    return (
        f"tight: predicted peak {c.peak_device_bytes / GIB:.1f} GiB per GPU, up to {high / GIB:.1f} GiB at the "
        f"upper end (p90) of its band, against {usable / GIB:.1f} GiB usable; it may run out of memory "
        "(a smaller micro-batch or gradient checkpointing gives more room)"
    )


def _notes(ctx: PlanContext, e: Entry, age: float | None) -> list[str]:
    """What the setup changes from the plan, and what its numbers rest on."""
    c, cost = e.candidate, e.cost
    plan, cfg, layout = ctx.plan, c.cfg, c.layout
    notes: list[str] = list(e.lead)
    if age is not None and age > STALE_AFTER_HOURS:
        notes.append(
            f"price fetched {age / 24:.1f} days ago ({c.offer.fetched_at}): it may have changed; refresh the catalog"
        )
    if cfg.checkpointing and not plan.gradient_checkpointing:
        notes.append("gradient checkpointing turned on to fit (the forward pass is replayed: slower per token)")
    if cfg.cpu_offload and not plan.cpu_offload:
        notes.append(
            f"optimizer states{' and sharded weights' if cfg.sharding in ('zero3', 'fsdp') else ''} offloaded to "
            f"CPU memory to fit: about {c.setup.host_ram_bytes_per_node / GIB:,.0f} GiB of host RAM per node; "
            f"the optimizer step runs on the CPU ({c.throughput.seconds['optimizer']:.2f} s per micro-batch)"
        )
    if cfg.cpu_offload:
        available = host_ram_available_bytes(c.offer, layout)
        host_gib = c.setup.host_ram_bytes_per_node / GIB
        if available is None:
            notes.append(
                f"host RAM unverified: {c.offer.provider} does not say how much CPU memory its nodes have; check "
                f"a node has at least {host_gib / (1 - host_ram_margin(ctx)):,.0f} GiB (the offloaded "
                f"states need about {host_gib:,.0f} GiB)"
            )
        else:
            notes.append(
                f"host RAM: the offloaded states take {host_gib:,.0f} GiB of the node's {available / GIB:,.0f} GiB"
            )
    if cfg.optimizer is not None and cfg.optimizer != plan.optimizer:
        notes.append(f"optimizer switched to {cfg.optimizer} to fit (allowed by constraints.allow_optimizer_change)")
    effective = cfg.micro_batch_size * cfg.accumulation_steps * layout.gpus
    plan_split = (plan.micro_batch_size, plan.gradient_accumulation_steps or 1, plan.gpus)
    if (cfg.micro_batch_size, cfg.accumulation_steps, layout.gpus) != plan_split:
        steps = "step" if cfg.accumulation_steps == 1 else "steps"
        notes.append(
            f"micro-batch {cfg.micro_batch_size} x {cfg.accumulation_steps} accumulation {steps} x "
            f"{gpus_label(layout.gpus)} = effective batch {effective}"
        )
    if effective != ctx.effective_batch_size:
        notes.append(
            f"effective batch {effective} instead of the plan's {ctx.effective_batch_size}: "
            f"{ctx.effective_batch_size} {'sample does' if ctx.effective_batch_size == 1 else 'samples do'} not "
            f"split evenly over {gpus_label(layout.gpus)}"
        )
    tight = tight_note(ctx, c)
    if tight:
        notes.append(tight)
    if layout.gpus > 1:
        notes.append(f"{c.setup.links.label()}: scaling {scaling_efficiency(ctx, c):.1%} of {layout.gpus} x one GPU")
    if c.offer.whole_nodes_only:
        notes.append(f"sold as whole nodes of {c.offer.gpus_per_node} GPUs")
    if cost.pricing == "spot":
        notes.append(spot_note(cost, layout.nodes, c.on_demand.expected_cost_usd))
    if cost.breakdown["billing_rounding"] > 0.005:
        notes.append(
            f"billed per {c.offer.billing_increment_s} s with a {c.offer.billing_minimum_s} s minimum: "
            f"{usd(cost.breakdown['billing_rounding'])} of unused billed time"
        )
    notes.extend(e.tail)
    return notes


def _plan_warnings(ctx: PlanContext) -> list[str]:
    plan, max_positions = ctx.plan, ctx.arch.max_position_embeddings
    out: list[str] = []
    if plan.method != "full" and plan.lora is None:
        out.append("no lora settings given: assumed rank 16 on all linear layers (q,k,v,o,gate,up,down)")
    if max_positions and plan.seq_len > max_positions:
        out.append(f"seq_len {plan.seq_len} exceeds the model's max_position_embeddings {max_positions}")
    cut = truncation_note(plan, ctx.evaluator.recipe)  # as the estimate notes it
    if cut is not None:
        out.append(cut)
    out += short_run_warnings(plan, ctx.evaluator.recipe, ctx.effective_batch_size)
    return out


def _assumptions(ctx: PlanContext) -> list[str]:
    c = ctx.constraints
    sizes = ctx.sizes
    rate = (
        f"{c.preemptions_per_hour:g} per node-hour (constraints.preemptions_per_hour)"
        if c.preemptions_per_hour is not None
        else "the offer's rate, else the provider's sourced rate for one GPU "
        f"({DEFAULT_PREEMPTION_PER_NODE_HOUR:g} per node-hour on GPU spot traces, services.planner.spot) x up to "
        "3.6 for a whole 8-GPU node"
    )
    restart = (
        f"{c.restart_minutes:g} min" if c.restart_minutes is not None else "the offer's start-up plus the download"
    )
    return [
        "a setup fits when its predicted peak device memory per GPU times its category's headroom ratio (the "
        f"{FIT_QUANTILE:g} quantile of measured / predicted in the memory band) is at most "
        f"{(1 - c.safety_margin) * 100:g}% of the card's memory; one whose band's upper end (p90) is above that "
        "is offered with a 'tight' note",
        "ranked by expected cost of the rented run (on demand and spot as separate entries): start-up, model "
        "download, training, checkpoint writes and final upload, preemption rework, billing increment and minimum; "
        "ties go to fewer GPUs, then fewer nodes, then the shorter run, then the lower cost before rounding",
        "the effective batch (micro-batch x accumulation x GPUs) is kept; where GPUs cannot split it evenly, "
        "the smallest larger one is used and noted",
        "a node holds at most the offer's gpus_per_node GPUs; more GPUs means several nodes over the offer's "
        "inter-node network, impossible where it has none; scaling comes from the bytes each layout moves over "
        "those links (services.estimator.communication)",
        f"start-up {DEFAULT_STARTUP_S:g} s and model download at {DEFAULT_DOWNLOAD_GBIT_PER_S:g} Gbit/s where the "
        f"offer does not say; base model {sizes.model_download_bytes / 1e9:.1f} GB, final upload "
        f"{sizes.final_upload_bytes / 1e9:.2f} GB at {UPLOAD_BYTES_PER_S / 1e6:g} MB/s",
        f"spot preemptions: {rate}, x nodes for the job; each costs a restart ({restart}) and half a checkpoint "
        f"interval of work, and waits for capacity; where none is back within {CAPACITY_WAIT_CAP_HOURS:g} h the "
        "job finishes on demand",
        f"a setup with more GPUs, more nodes, spot or CPU offload ranks above a simpler one only when its expected "
        f"cost is lower by more than {c.prefer_simpler_within:.0%} (constraints.prefer_simpler_within)",
        f"resumable checkpoint of {sizes.checkpoint_bytes / GIB:.2f} GiB written at "
        f"{CHECKPOINT_WRITE_BYTES_PER_S / 1e6:g} MB/s ({sizes.checkpoint_write_s:.0f} s); interval "
        "sqrt(2 x write x MTBF) (Young 1974), at most an hour",
    ]
