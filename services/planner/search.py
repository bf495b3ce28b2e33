"""The search over setups of one offer: GPU layouts x sharding x checkpointing x offload x the largest micro-batch.

Pruning, each step justified by the model it prunes:

- Memory grows with the micro-batch among those that accumulate (the largest, one micro-batch per step,
  accumulates nothing and can need less, so it is tried on its own), and tokens/s does not fall with it
  (fixed per-step costs amortise over more tokens; the one exception, paged optimizer states spilling as
  free memory shrinks, is ignored), so only the largest micro-batch that fits is kept, found by bisection
  over the divisors of the per-GPU samples. Under padding to the longest sample, the fitting micro-batch
  that consumes the data fastest on the setup's links is kept instead (``_fastest_padded``).
- If a setup fits without gradient checkpointing at the largest micro-batch, checkpointing could only
  slow it down, so it is not tried.
- An 8-bit optimizer (only where the user allows changing the optimizer) and CPU offload are tried on a
  layout only when nothing fits there without them: they slow every step down (offload: the CPU Adam
  step and the host traffic) or change the training. Several nodes are searched to do without offload,
  so offload is tried on several nodes only when it fits on no single node.
- Jobs on several nodes are tried only when no single node of the offer fits, or none meets the
  deadline; node counts then grow until one fits (and meets the deadline): at one configuration, more
  nodes of the same card only add communication per GPU. A known limit: more GPUs can let a faster
  configuration fit (no checkpointing, the optimizer step sharded over one-GPU nodes), which this does
  not search (docs/planner.md, stop 55).
- A setup with CPU offload fits only where the node's host RAM (when the offer gives it) holds the
  offloaded states; one that does not is dropped (and kept aside to explain the offer's rejection), so the
  search moves on to more GPUs or nodes as if it did not fit. Unknown host RAM is not a limit.

What fits and how fast depends on the card and the offer's node shape, not on its price: the fitting
setups are computed once per shape and priced per offer (a catalog of thousands of offers has few shapes).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from services.catalog.gpus import GpuSpec
from services.catalog.offers import Offer
from services.estimator.communication import Links
from services.estimator.plan import Optimizer, Sharding
from services.planner.batching import batch_split, config_for, largest_fitting_micro_batch
from services.planner.context import (
    EIGHT_BIT_OPTIMIZERS,
    ConfigNeeds,
    HostRamBlocked,
    NodeStep,
    NodeWalk,
    PlanContext,
    RamBlocked,
    RamKey,
    Setup,
    ShapeKey,
    SingleNode,
    StepSetups,
)
from services.planner.enough import enough, meets_any, offload_for_deadline, verdicts
from services.planner.evaluator import Config
from services.planner.host_ram import holds, host_ram_bytes_per_node, host_ram_fits, usable_host_ram_bytes
from services.planner.layouts import Layout, gpu_layouts, offload_shardings, sharding_options


def _setup(ctx: PlanContext, spec: GpuSpec, layout: Layout, links: Links, cfg: Config) -> Setup:
    tp = ctx.evaluator.throughput(cfg, spec, links)
    peak = ctx.evaluator.memory(cfg).peak_device
    training_s = ctx.total_tokens / tp.data_tokens_per_s
    # In field order, positionally: one per fitting configuration, layout and links of the search.
    return Setup(spec, layout, links, cfg, peak, tp, training_s, host_ram_bytes_per_node(ctx, cfg, layout))


def layout_setups(ctx: PlanContext, spec: GpuSpec, layout: Layout, links: Links, offload: bool = True) -> list[Setup]:
    """The fitting setups on one layout: per sharding and checkpointing, the largest micro-batch (under padding
    to the longest sample, the fitting one that consumes the data fastest on these links, ``_fastest_padded``); an
    8-bit optimizer (when allowed) and then CPU offload (when ``offload``) only when nothing fits without them."""
    key = (spec.name, layout, links, offload)
    cached = ctx.memo.layouts.get(key)
    if cached is None:
        configs = card_configs(ctx, spec, layout.gpus, offload)
        if ctx.evaluator.padding_varies:
            # Two may settle on one micro-batch.
            configs = tuple(dict.fromkeys(_fastest_padded(ctx, spec, links, cfg) for cfg in configs))
        cached = [_setup(ctx, spec, layout, links, cfg) for cfg in configs]
        ctx.memo.layouts[key] = cached
    return cached


def card_configs(ctx: PlanContext, spec: GpuSpec, gpus: int, offload: bool = True) -> tuple[Config, ...]:
    """``fitting_configs`` on ``spec``: per sharding and checkpointing the largest micro-batch that fits."""
    key = (spec.name, gpus, offload)
    cached = ctx.memo.card_configs.get(key)
    if cached is None:
        cached = ctx.memo.card_configs[key] = fitting_configs(ctx, ctx.usable_bytes(spec), gpus, offload)
    return cached


def _fastest_padded(ctx: PlanContext, spec: GpuSpec, links: Links, largest: Config) -> Config:
    """Under padding to the longest sample of a data set of known mean length, the fitting micro-batch (``largest``
    or a smaller one of the same split) that consumes the data fastest on ``links``, ties to the larger: every
    extra sample pads the others to a longer longest one, so a smaller micro-batch with more accumulation can be the
    faster, and by how much depends on the links (each micro-batch gathers the sharded weights again).

    Exact by bounds: a smaller micro-batch is estimated on the links only where its ceiling on any links
    (``Evaluator.data_tokens_per_s_ceiling``) is above the best rate found. A per-sample floor of compute and
    dispatch once proposed a single candidate on the card's default links, and missed faster ones (a probe against
    brute force: 8B LoRA on 4 x H100 PCIe kept micro-batch 3 at 14,969 tokens/s where 1 runs 23,589)."""
    ev = ctx.evaluator
    smaller = ctx.memo.smaller.get(largest)
    if smaller is None:  # the same on every card
        split = batch_split(ctx.effective_batch_size, largest.gpus)
        smaller = ctx.memo.smaller[largest] = tuple(
            config_for(split, largest.sharding, m, largest.checkpointing, largest.cpu_offload, largest.optimizer)
            for m in split.micro_batch_sizes
            if m < largest.micro_batch_size
        )
    if not smaller:
        return largest
    if largest.accumulation_steps == 1:
        # Those that accumulate can need more memory than the largest (largest_fitting_micro_batch).
        usable = ctx.usable_bytes(spec)
        smaller = tuple(c for c in smaller if ev.sized_bytes(c) <= usable)
    best, best_rate = largest, ev.throughput(largest, spec, links).data_tokens_per_s
    # Highest ceiling first: the likeliest to be the fastest, and once one is found the rest are bounded out.
    for ceiling, c in sorted(((ev.data_tokens_per_s_ceiling(c, spec), c) for c in smaller), reverse=True):
        if ceiling < best_rate:
            break
        rate = ev.throughput(c, spec, links).data_tokens_per_s
        if rate > best_rate or (rate == best_rate and c.micro_batch_size > best.micro_batch_size):
            best, best_rate = c, rate  # ties to the larger micro-batch
    return best


def fitting_configs(ctx: PlanContext, usable: float, gpus: int, offload: bool = True) -> tuple[Config, ...]:
    """The configurations that fit ``usable`` bytes per GPU on ``gpus`` GPUs (memory does not depend on the
    links, so every offer shape with the same card and GPU count shares them)."""
    key = (usable, gpus, offload)
    cached = ctx.memo.configs.get(key)
    if cached is not None:
        return cached
    split = batch_split(ctx.effective_batch_size, gpus)
    checkpointing_options = (True,) if ctx.plan.gradient_checkpointing else (False, True)
    c = ctx.constraints

    def search(shardings: tuple[Sharding, ...], offload: bool, optimizer: Optimizer | None) -> list[Config]:
        found: list[Config] = []
        offloaded = offload or ctx.plan.cpu_offload
        for sharding in shardings:
            for checkpointing in checkpointing_options:
                m = largest_fitting_micro_batch(
                    ctx.evaluator, split, sharding, checkpointing, usable, offloaded, optimizer
                )
                if m is None:
                    continue
                found.append(config_for(split, sharding, m, checkpointing, offloaded, optimizer))
                if not checkpointing and m == split.micro_batch_sizes[-1]:
                    break
        return found

    plain = sharding_options(ctx.plan, gpus)
    found = search(plain, False, None)
    if not found and c.allow_optimizer_change and ctx.plan.optimizer == "adamw":
        for optimizer in EIGHT_BIT_OPTIMIZERS:
            found = search(plain, False, optimizer)
            if found:
                break
    if not found and offload and c.allow_cpu_offload and not ctx.plan.cpu_offload:
        found = search(offload_shardings(ctx.plan), True, None)
    ctx.memo.configs[key] = tuple(found)
    return ctx.memo.configs[key]


def shape_key(ctx: PlanContext, spec: GpuSpec, offer: Offer) -> ShapeKey:
    """What the search depends on besides the price and the host RAM: the card, the node shape and the link
    kind it really is."""
    kind = ctx.link_kind(spec, offer.interconnect)
    return (spec.name, offer.gpus_per_node, offer.whole_nodes_only, kind, None)


def _fastest_per_count(found: list[Setup]) -> list[Setup]:
    """Per GPU count only the fastest setup: same GPUs at the same price, so also the cheapest. Shares ``found``
    where there is nothing to compare (most lists): the search's lists are never changed once built."""
    if len(found) < 2:
        return found
    fastest: dict[int, Setup] = {}
    for s in found:
        gpus = s.layout.gpus
        kept = fastest.get(gpus)
        if kept is None or s.training_s < kept.training_s:
            fastest[gpus] = s
    return [fastest[gpus] for gpus in sorted(fastest)]


def offer_search(
    ctx: PlanContext, offer: Offer, spec: GpuSpec, base: ShapeKey
) -> tuple[list[Setup], list[HostRamBlocked]]:
    """Every setup of an offer's shape that the search keeps (see the module docstring for the pruning), with the
    setups its host RAM cannot hold (what explains its rejection where it keeps none); ``base``: its ``shape_key``,
    which offers of one shape share.

    Cached per shape. What fits on one node does not depend on the network, so the network enters the key
    only when the search has to go beyond one node. Where the offer gives its host RAM and the search meets
    offload, the setups the RAM cannot hold are dropped (``_ram_search``).
    """
    single = _single_node(ctx, offer, spec, base)
    ram_key = _ram_key(ctx, offer, spec, base, single)
    if ram_key is not None:
        return _ram_search(ctx, offer, spec, ram_key, single.found)
    if single.enough or offer.inter_node_gbit_per_s is None:
        return single.fastest, []
    # More nodes are searched to do without offload; offload on several nodes only where no node fits, or where no
    # setup found meets the deadline.
    grown = _grown(ctx, offer, spec, base, not single.found)
    if single.found and offload_for_deadline(ctx, single.fastest + grown):
        grown = _fastest_per_count(grown + _grown(ctx, offer, spec, base, True, for_deadline=True))
    return (single.fastest + grown if grown else single.fastest), []


def settled_setups(ctx: PlanContext, offer: Offer, spec: GpuSpec, base: ShapeKey) -> list[Setup] | None:
    """The setups ``offer_search`` gives every offer of this one's card, link kind and node shape (size, whole nodes
    only: ``base``, its ``shape_key``) whatever its network and host RAM, where it does: one node is enough
    (``enough``) and no setup on it offloads, so neither more nodes nor the host RAM are searched. None where the
    search reads them."""
    single = _single_node(ctx, offer, spec, base)
    settled = single.enough and not ctx.plan.cpu_offload and not single.offloads
    return single.fastest if settled else None


def _grown(
    ctx: PlanContext, offer: Offer, spec: GpuSpec, base: ShapeKey, offload: bool, for_deadline: bool = False
) -> list[Setup]:
    """The fastest setup per GPU count on more nodes of the offer's shape, adding nodes until they are enough
    (``enough``), or ``for_deadline`` until one meets the deadline with offload too (``offload_for_deadline``);
    with offload where ``offload``. No host RAM limit."""
    walk = _walk(ctx, offer, base)
    key = (offload, for_deadline)
    found = walk.grown.get(key)
    if found is None:
        grown: list[Setup] = []
        for step in walk.steps():
            more, enough, _ = _step_setups(ctx, spec, step, offload)
            grown.extend(more)
            if enough or (for_deadline and meets_any(ctx, more)):
                break
        found = walk.grown[key] = _fastest_per_count(grown)
    return found


def _single_node(ctx: PlanContext, offer: Offer, spec: GpuSpec, base: ShapeKey) -> SingleNode:
    """The setups on one node of the shape."""
    single = ctx.memo.single.get(base)
    if single is None:
        layouts, _ = gpu_layouts(offer, ctx.constraints.max_gpus, ctx.effective_batch_size)
        found: list[Setup] = []
        for layout in layouts:
            if card_configs(ctx, spec, layout.gpus):  # the links only for a layout on which something fits
                found.extend(layout_setups(ctx, spec, layout, ctx.links(spec, offer, layout)))
        enough, offloads = verdicts(ctx, found)
        single = SingleNode(found, _fastest_per_count(found), enough, offloads)
        ctx.memo.single[base] = single
    return single


def _ram_search(
    ctx: PlanContext, offer: Offer, spec: GpuSpec, key: RamKey, found_anywhere: list[Setup]
) -> tuple[list[Setup], list[HostRamBlocked]]:
    """The search of ``offer_search`` under the offer's host RAM: (setups kept, configurations the RAM cannot
    hold).

    A setup that offloads more than a node's RAM holds is dropped as if it did not fit, so the search goes
    on to more nodes: offload on the fewest nodes whose RAM holds it, then more nodes only to do without it
    (which no RAM limits, so that part is the shape's search without offload)."""
    base, _, held, decided = key  # held: which of the single-node setups the RAM holds (_ram_key_of)
    fastest, blocked, enough = _held_single(ctx, base, held, found_anywhere)
    if not enough and offer.inter_node_gbit_per_s is not None:
        more, more_blocked = _ram_walk(ctx, offer, spec, base, not any(held), decided)
        if offload_for_deadline(ctx, fastest + more):
            extra, extra_blocked = _ram_walk(ctx, offer, spec, base, True, decided, throughout=True)
            more = _fastest_per_count(more + extra)
            more_blocked = more_blocked + [b for b in extra_blocked if b not in more_blocked]
        return fastest + more, blocked + more_blocked
    return fastest, blocked


def _held_single(
    ctx: PlanContext, base: ShapeKey, held: tuple[bool, ...], found_anywhere: list[Setup]
) -> tuple[list[Setup], list[HostRamBlocked], bool]:
    """The single-node part of ``_ram_search``: the fastest per GPU count of the setups the RAM holds, those it
    cannot hold, and whether the held ones are enough (``enough``). The shape's networks share it."""
    key = (base, held)
    found = ctx.memo.held_single.get(key)
    if found is None:
        kept = [s for s, ok in zip(found_anywhere, held, strict=True) if ok]
        blocked: list[HostRamBlocked] = [s for s, ok in zip(found_anywhere, held, strict=True) if not ok]
        found = ctx.memo.held_single[key] = (_fastest_per_count(kept), blocked, enough(ctx, kept))
    return found


def _ram_walk(
    ctx: PlanContext,
    offer: Offer,
    spec: GpuSpec,
    base: ShapeKey,
    offload: bool,
    decided: object,
    throughout: bool = False,
) -> tuple[list[Setup], list[HostRamBlocked]]:
    """The multi-node part of ``_ram_search`` (fastest setups per GPU count, configurations the RAM cannot
    hold): it reads of the single-node search only whether offload is still to be tried, and of the host RAM only
    what ``decided`` (the last part of the RamKey) says, so shapes of one walk share it. ``throughout``: offload is
    tried on every node count until a setup meets the deadline (``offload_for_deadline``), not only up to the first
    on which it fits."""
    walk = _walk(ctx, offer, base)
    key = (offload, decided, throughout)
    cached = walk.ram.get(key)
    if cached is not None:
        return cached
    grown: list[Setup] = []
    blocked: list[HostRamBlocked] = []
    for index, step in enumerate(walk.steps()):
        if not offload and not ctx.plan.cpu_offload:
            grown.extend(s for setups in _plain_walk(ctx, walk, spec)[index:] for s in setups)
            break
        more, enough, offloads = _ram_layout_setups(ctx, offer, spec, step, offload, blocked)
        grown.extend(more)
        if enough or (throughout and meets_any(ctx, more)):
            break
        if offload and offloads and not throughout:
            offload = False
    cached = walk.ram[key] = (_fastest_per_count(grown), blocked)
    return cached


def _ram_layout_setups(
    ctx: PlanContext, offer: Offer, spec: GpuSpec, step: NodeStep, offload: bool, blocked: list[HostRamBlocked]
) -> StepSetups:
    """``layout_setups`` under the offer's host RAM, adding what the RAM cannot hold to ``blocked``; where it
    holds none of them, no setup's speed is computed. With whether those kept are enough (``enough``) and
    whether one offloads."""
    layout = step.layout
    needs = _config_needs(ctx, spec, layout, offload)
    usable = usable_host_ram_bytes(ctx, offer, layout)
    if usable is not None and usable < needs.least:  # the RAM holds none of them
        blocked.extend(needs.blocked)
        return _NOTHING
    setups, enough, offloads = _step_setups(ctx, spec, step, offload)
    if usable is None:
        return setups, enough, offloads
    kept: list[Setup] = []
    for s in setups:
        if holds(s.host_ram_bytes_per_node, usable):
            kept.append(s)
        else:
            blocked.append(s)
    if len(kept) == len(setups):
        return kept, enough, offloads
    return kept, *verdicts(ctx, kept)


# No setups, and a step on which nothing fits (most steps of a long walk): one value each for every step and plan,
# immutable (a tuple), so no caller can change what the others share.
_NO_SETUPS: tuple[Setup, ...] = ()
_NOTHING: StepSetups = (_NO_SETUPS, False, False)


def _step_links(ctx: PlanContext, spec: GpuSpec, step: NodeStep) -> Links:
    """The links of a multi-node step (``PlanContext.links`` of its offer), worked out when a walk reaches it."""
    if step.links is None:
        step.links = ctx.links(spec, step.offer, step.layout)
    return step.links


def _step_setups(ctx: PlanContext, spec: GpuSpec, step: NodeStep, offload: bool) -> StepSetups:
    """``layout_setups`` of a multi-node step, whether they are enough (``enough``) and whether one offloads."""
    found = step.offloaded if offload else step.plain
    if found is None:
        if card_configs(ctx, spec, step.layout.gpus, offload):  # the links only for a step on which something fits
            setups = layout_setups(ctx, spec, step.layout, _step_links(ctx, spec, step), offload)
            found = (setups, *verdicts(ctx, setups))
        else:
            found = _NOTHING
        if offload:
            step.offloaded = found
        else:
            step.plain = found
    return found


def _walk(ctx: PlanContext, offer: Offer, base: ShapeKey) -> NodeWalk:
    """The offer's multi-node layouts in order (``gpu_layouts``) and the node-count walks over them, memoised per
    card, link kind, node size and network (whole nodes or not, the same layouts; the same links); ``base``: the
    offer's ``shape_key``, which holds the first three."""
    card, per_node, _, kind, _ = base
    key = (card, kind, per_node, offer.inter_node_gbit_per_s)
    found = ctx.memo.walks.get(key)
    if found is None:
        _, multi = gpu_layouts(offer, ctx.constraints.max_gpus, ctx.effective_batch_size)
        found = ctx.memo.walks[key] = NodeWalk(multi, offer)
    return found


def _plain_walk(ctx: PlanContext, walk: NodeWalk, spec: GpuSpec) -> list[Sequence[Setup]]:
    """The setups without offload on a walk's multi-node layouts, growing until they are enough (then
    empty): what the search finds on more nodes once it does without offload (host RAM plays no part)."""
    if walk.plain is None:
        plain: list[Sequence[Setup]] = []
        for step in walk.steps():
            more, done, _ = _step_setups(ctx, spec, step, False)
            plain.append(more)
            if done:
                break
        walk.plain = plain + [_NO_SETUPS] * (len(walk.layouts) - len(plain))
    return walk.plain


def _ram_key(ctx: PlanContext, offer: Offer, spec: GpuSpec, base: ShapeKey, single: SingleNode) -> RamKey | None:
    """Where the offer's host RAM changes the search, the key of the search under it; None where it does not
    (RAM unknown, no offload met, or the RAM holds every single-node setup: then the search is the one without
    a limit).

    Offers of many RAM sizes share a key: it holds only what the RAM decides, which single-node setups it holds
    and, when none does, the first node count on which offload fits it and which setups there (a node's
    offloaded states shrink as nodes are added, so beyond it the search does without offload)."""
    if offer.host_ram_gib_per_node is None:
        return None
    if ctx.plan.cpu_offload or not single.found or single.offloads:
        return _ram_key_of(ctx, offer, spec, base, single.found)
    return None


def _ram_key_of(ctx: PlanContext, offer: Offer, spec: GpuSpec, base: ShapeKey, found: list[Setup]) -> RamKey | None:
    """``_ram_key`` for a shape, network and RAM size not met before."""
    held = _held(ctx, offer, spec, found)
    inter = offer.inter_node_gbit_per_s
    if ctx.plan.cpu_offload:
        return (base, inter, held, offer.host_ram_gib_per_node)
    if all(held) and found:
        return None
    beyond: object = ()
    if inter is not None and not any(held):
        beyond = _beyond(ctx, offer, spec)
    return (base, inter, held, beyond)


def _held(ctx: PlanContext, offer: Offer, spec: GpuSpec, found: list[Setup]) -> tuple[bool, ...]:
    """Which of the single-node setups ``found`` the offer's host RAM holds. What a setup offloads and what a node
    holds depend on its configuration and layout, which the link kind does not change (``_single_node`` finds the
    same ones for every link kind), so offers of one card, node size, whole nodes or not and RAM share it."""
    key = (spec.name, offer.gpus_per_node, offer.whole_nodes_only, offer.host_ram_gib_per_node)
    held = ctx.memo.held.get(key)
    if held is None:
        held = ctx.memo.held[key] = tuple(host_ram_fits(ctx, offer, s) for s in found)
    return held


def _beyond(ctx: PlanContext, offer: Offer, spec: GpuSpec) -> object:
    """The first multi-node layout of the offer on which offload fits its host RAM or a setup needs none, with which
    configurations there the RAM holds (None: no such layout). It reads the configurations and the RAM, not the
    links: offers of one card, node size and RAM that span nodes share it, whatever their link kind and network
    speed."""
    ram = offer.host_ram_gib_per_node
    key = (spec.name, offer.gpus_per_node, offer.inter_node_gbit_per_s is not None, ram)
    if key in ctx.memo.beyond:
        return ctx.memo.beyond[key]
    beyond: object = None
    # The walk's steps (multi-node: the effective batch plays no part in them).
    for index, layout in enumerate(gpu_layouts(offer, ctx.constraints.max_gpus)[1]):
        needs = _config_needs(ctx, spec, layout, True)
        usable = usable_host_ram_bytes(ctx, offer, layout)
        fits = tuple(holds(need, usable) for need in needs.needs)
        if needs.plain or any(ok and cfg.cpu_offload for cfg, ok in zip(needs.configs, fits, strict=True)):
            beyond = (index, fits)
            break
    ctx.memo.beyond[key] = beyond
    return beyond


def _config_needs(ctx: PlanContext, spec: GpuSpec, layout: Layout, offload: bool) -> ConfigNeeds:
    """The fitting configurations of a layout, the host RAM per node each needs (0 without offload), and each as
    blocked by a RAM that cannot hold it."""
    key = (spec.name, layout, offload)
    found = ctx.memo.needs.get(key)
    if found is None:
        configs = card_configs(ctx, spec, layout.gpus, offload)
        needs = tuple(host_ram_bytes_per_node(ctx, cfg, layout) for cfg in configs)
        blocked = tuple(RamBlocked(spec, layout, cfg, need) for cfg, need in zip(configs, needs, strict=True))
        plain = any(not cfg.cpu_offload for cfg in configs)
        found = ctx.memo.needs[key] = ConfigNeeds(configs, needs, blocked, plain, min(needs, default=math.inf))
    return found
