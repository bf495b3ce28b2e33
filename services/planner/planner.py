"""Plan a fine-tuning job over a price list: every setup that fits, ranked by whole-job cost.

A setup is an offer (provider x card x price) rented as some GPUs on some nodes, with a sharding mode, a
micro-batch and accumulation that keep the plan's effective batch, and gradient checkpointing on or
off. It fits when the predicted peak device memory per GPU stays under the card's memory less the
safety margin. Its cost is the whole job: hours (data set tokens / tokens per second) x GPUs x price.
The plan's method, precision, quantization and optimizer are never changed; a card on which nothing
fits gets a rejection that says what would fit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from services.catalog.gpus import GpuSpec, find_gpu, gpu_specs
from services.catalog.offers import Offer, bundled_offers
from services.estimator.budget import CpuBudget, unlimited
from services.estimator.errors import EstimatorError
from services.estimator.estimate import resolve_architecture
from services.estimator.memory import GIB
from services.estimator.plan import Plan
from services.estimator.throughput import INTER_NODE_GB_PER_S
from services.planner.batching import effective_batch_size
from services.planner.constraints import Constraints
from services.planner.errors import PlannerError
from services.planner.evaluator import Config, Evaluator
from services.planner.layouts import sharding_options
from services.planner.models import PlannerResult, Recommendation, Rejection
from services.planner.rejections import constraint_rejection, filter_rejection, gpus_label, memory_rejection
from services.planner.search import (
    NARROW_SEARCH,
    Candidate,
    PlanContext,
    fastest_per_offer_and_count,
    offer_candidates,
    rank_key,
)
from services.planner.spot import CHECKPOINT_WRITE_BYTES_PER_S, checkpoint_bytes, checkpoint_write_seconds

DEFAULT_TOP_N = 10
_REJECTION_ORDER = (
    "memory",
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


def plan_setups(
    plan: Plan,
    offers: Sequence[Offer] | None = None,
    specs: tuple[GpuSpec, ...] | None = None,
    constraints: Constraints | None = None,
    *,
    top_n: int = DEFAULT_TOP_N,
    utilisation: Mapping[str, tuple[float, str]] | None = None,
    budget: CpuBudget | None = None,
) -> PlannerResult:
    """Every setup over ``offers`` (default: the bundled price lists) that fits ``plan``, cheapest job first.

    Returns the ``top_n`` setups that meet the constraints, the best one per card, and a rejection for
    every card on which nothing fits and every offer whose fitting setups break the budget, the
    deadline, or the provider and region filters. Raises :class:`PlannerError` without a data set size,
    and :class:`WorkBudgetExceeded` when the search needs more CPU time than ``budget``.
    """
    total_tokens = _check_plannable(plan, top_n)
    constraints = constraints if constraints is not None else Constraints()
    offers = tuple(offers) if offers is not None else bundled_offers()
    specs = specs if specs is not None else gpu_specs()
    name, arch = resolve_architecture(plan)
    ctx = PlanContext(
        plan=plan,
        arch=arch,
        constraints=constraints,
        total_tokens=total_tokens,
        effective_batch_size=effective_batch_size(plan),
        checkpoint_write_seconds=checkpoint_write_seconds(checkpoint_bytes(plan, arch)),
        evaluator=Evaluator(plan, arch, utilisation),
        budget=budget if budget is not None else unlimited(),
    )

    rejections: list[Rejection] = []
    warnings = _plan_warnings(plan, arch.max_position_embeddings)
    cards: dict[str, tuple[GpuSpec, list[Offer]]] = {}
    candidates: list[Candidate] = []
    for index, offer in enumerate(offers):
        ctx.budget.check("constraints", NARROW_SEARCH)
        excluded = filter_rejection(constraints, offer)
        if excluded is not None:
            rejections.append(excluded)
            continue
        try:
            spec = find_gpu(offer.gpu, specs)
        except EstimatorError as exc:
            rejections.append(Rejection(gpu=offer.gpu, provider=offer.provider, kind="unknown_gpu", reason=exc.message))
            warnings.append(f"offer {offer.provider} / {offer.gpu}: {exc.message}")
            continue
        cards.setdefault(spec.name, (spec, []))[1].append(offer)
        candidates.extend(offer_candidates(ctx, index, offer, spec))
    if not cards:
        warnings.append("no offer is left to plan on after the provider and region constraints")

    ranked = sorted(fastest_per_offer_and_count(candidates), key=rank_key)
    qualifying = [c for c in ranked if c.qualifies_with is not None]
    rejections.extend(_rejections(ctx, cards, ranked))
    if cards and not qualifying:
        warnings.append("no setup fits and meets the constraints: see rejections")

    built: dict[int, Recommendation] = {}

    def recommend(c: Candidate) -> Recommendation:
        if id(c) not in built:
            built[id(c)] = _recommendation(ctx, c)
        return built[id(c)]

    best_per_gpu: dict[str, Candidate] = {}
    for c in qualifying:
        best_per_gpu.setdefault(c.spec.name, c)
    return PlannerResult(
        model=name,
        total_tokens=total_tokens,
        plan_effective_batch_size=ctx.effective_batch_size,
        recommendations=[recommend(c) for c in qualifying[:top_n]],
        best_per_gpu=[recommend(c) for c in best_per_gpu.values()],
        rejections=sorted(rejections, key=lambda r: (_REJECTION_ORDER.index(r.kind), r.gpu, r.provider or "")),
        candidates_evaluated=ctx.evaluator.memory_probes,
        warnings=warnings,
        assumptions=_assumptions(ctx),
    )


def _rejections(
    ctx: PlanContext, cards: dict[str, tuple[GpuSpec, list[Offer]]], ranked: list[Candidate]
) -> list[Rejection]:
    """A memory rejection per card with no fitting setup; a constraint rejection per offer with fitting
    setups none of which meets the budget and deadline."""
    out: list[Rejection] = []
    fitting_cards = {c.spec.name for c in ranked}
    for card, (spec, card_offers) in cards.items():
        if card not in fitting_cards:
            out.append(memory_rejection(ctx, spec, card_offers))
    by_offer: dict[int, list[Candidate]] = {}
    for c in ranked:
        by_offer.setdefault(c.offer_index, []).append(c)
    for setups in by_offer.values():
        if all(c.qualifies_with is None for c in setups):
            out.append(constraint_rejection(ctx.constraints, setups[0].offer, setups))
    return out


def scaling_efficiency(ctx: PlanContext, c: Candidate) -> float:
    """Tokens/s of the setup over gpus x tokens/s of one GPU of the card at the same micro-batch and
    effective batch (no memory limit on the one GPU: this isolates communication and sharding costs)."""
    if c.layout.gpus == 1:
        return 1.0
    one = Config(
        gpus=1,
        sharding=sharding_options(ctx.plan, 1)[0],
        micro_batch_size=c.cfg.micro_batch_size,
        accumulation_steps=c.cfg.accumulation_steps * c.layout.gpus,
        checkpointing=c.cfg.checkpointing,
    )
    single = ctx.evaluator.throughput(one, c.spec, spill=False)
    return c.throughput.tokens_per_s / (c.layout.gpus * single.tokens_per_s)


def _recommendation(ctx: PlanContext, c: Candidate) -> Recommendation:
    gpus = c.layout.gpus
    peak_gib = c.peak_device_bytes / GIB
    spot = c.spot
    return Recommendation(
        provider=c.offer.provider,
        gpu=c.spec.name,
        region=c.offer.region,
        gpus=gpus,
        gpus_per_node=c.layout.gpus_per_node,
        nodes=c.layout.nodes,
        sharding=c.cfg.sharding,
        cpu_offload=ctx.plan.cpu_offload,
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
        mfu=round(c.throughput.mfu, 4),
        scaling_efficiency=round(scaling_efficiency(ctx, c), 3),
        hours=round(c.hours, 3),
        cost_usd=round(c.cost_usd, 2),
        price_usd_per_hour=round(gpus * c.offer.on_demand_usd_per_hour, 4),
        spot_price_usd_per_hour=(
            None if c.offer.spot_usd_per_hour is None else round(gpus * c.offer.spot_usd_per_hour, 4)
        ),
        spot_hours=None if spot is None else round(spot.hours, 3),
        spot_cost_usd=None if c.spot_cost_usd is None else round(c.spot_cost_usd, 2),
        expected_preemptions=None if spot is None else round(spot.expected_preemptions, 3),
        checkpoint_interval_minutes=None if spot is None else round(spot.checkpoint_interval_seconds / 60.0, 1),
        qualifies_with=c.qualifies_with or "on_demand",
        notes=_notes(ctx, c),
    )


def _notes(ctx: PlanContext, c: Candidate) -> list[str]:
    """What the setup changes from the plan, and what its numbers rest on."""
    plan, cfg, layout = ctx.plan, c.cfg, c.layout
    notes: list[str] = []
    if cfg.checkpointing and not plan.gradient_checkpointing:
        notes.append("gradient checkpointing turned on to fit (the forward pass is replayed: slower per token)")
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
            f"{ctx.effective_batch_size} samples do not split evenly over {gpus_label(layout.gpus)}"
        )
    if layout.nodes > 1:
        notes.append(
            f"{layout.nodes} nodes of {layout.gpus_per_node} GPUs: gradients and gathered weights cross nodes at "
            f"{INTER_NODE_GB_PER_S:g} GB/s per GPU (assumed fabric)"
        )
    elif layout.gpus > 1 and not c.link.nvlink_gb_per_s:
        notes.append(f"GPUs communicate over PCIe ({c.link.pcie_gb_per_s:g} GB/s per GPU): no NVLink in this offer")
    if c.offer.gpus_per_node > 1:
        notes.append(f"sold as whole nodes of {c.offer.gpus_per_node} GPUs")
    if c.spot is not None and c.spot_cost_usd is not None:
        extra = c.spot.checkpoint_hours + c.spot.rework_hours
        notes.append(
            f"spot: {c.spot.expected_preemptions:.2f} preemptions expected; a checkpoint every "
            f"{c.spot.checkpoint_interval_seconds / 60:.0f} min ({c.spot.checkpoint_write_seconds:.0f} s to write) "
            f"and the rework add {extra:.2f} h"
        )
    if c.qualifies_with == "spot":
        notes.append(f"meets the budget and deadline only on spot (expected ${c.spot_cost_usd:,.2f})")
    return notes


def _plan_warnings(plan: Plan, max_positions: int | None) -> list[str]:
    out: list[str] = []
    if plan.method != "full" and plan.lora is None:
        out.append("no lora settings given: assumed rank 16 on all linear layers (q,k,v,o,gate,up,down)")
    if max_positions and plan.seq_len > max_positions:
        out.append(f"seq_len {plan.seq_len} exceeds the model's max_position_embeddings {max_positions}")
    return out


def _assumptions(ctx: PlanContext) -> list[str]:
    c = ctx.constraints
    size_gib = ctx.checkpoint_write_seconds * CHECKPOINT_WRITE_BYTES_PER_S / GIB
    return [
        f"a setup fits when its predicted peak device memory per GPU is at most {(1 - c.safety_margin) * 100:g}% "
        "of the card's memory",
        "ranked by whole-job on-demand cost (hours x GPUs x price per GPU-hour), then by hours",
        "the effective batch (micro-batch x accumulation x GPUs) is kept; where GPUs cannot split it evenly, "
        "the smallest larger one is used",
        "offers priced per GPU (gpus_per_node 1) rent as 1, 2, 4 or 8 GPUs per node, several nodes as nodes of 8; "
        "offers with gpus_per_node > 1 rent as whole nodes",
        f"spot: {c.preemptions_per_hour:g} preemptions per node-hour (an assumption: set "
        f"constraints.preemptions_per_hour), {c.restart_minutes:g} min per restart, half a checkpoint interval "
        "of work lost per preemption",
        f"resumable checkpoint of {size_gib:.2f} GiB written at {CHECKPOINT_WRITE_BYTES_PER_S / 1e6:g} MB/s "
        f"({ctx.checkpoint_write_seconds:.0f} s); interval sqrt(2 x write x MTBF) (Young 1974)",
    ]
