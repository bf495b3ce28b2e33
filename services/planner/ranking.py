"""Ranking a catalog: every offer's fitting setups, priced in order of a lower bound of their cost.

What fits and how fast depends on the card and the node shape, not on the price, so the setups come from
the shape cache (services.planner.search). Each (offer, setup, pricing) gets a lower bound of its
expected cost: start-up, model download and training at the hourly price (the full cost only adds
checkpoints, rework and billing rounding). Entries are priced in full in increasing order of that bound
(a heap: only the cheapest few are taken out), until a bound can reach neither the top N nor the best
of a card that still has none: over thousands of offers only a few dozen are priced.

The priced entries are then ordered by ``prefer_simpler``: cheapest first, except that a setup with more GPUs,
more nodes, spot or CPU offload ranks above a simpler one only when it is cheaper by more than
``constraints.prefer_simpler_within``; the pruning keeps every entry that tolerance could bring into the top N.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from services.catalog.gpus import GpuSpec, find_gpu
from services.catalog.offers import Offer
from services.estimator.errors import EstimatorError
from services.estimator.memory import GIB
from services.planner.context import Candidate, Entry, PlanContext, RamBlocked, Setup
from services.planner.costs import DEFAULT_DOWNLOAD_GBIT_PER_S, DEFAULT_STARTUP_S
from services.planner.host_ram import host_ram_available_bytes
from services.planner.models import Rejection
from services.planner.rejections import filter_rejection, precision_rejection
from services.planner.search import (
    NARROW_SEARCH,
    price_setup,
    qualifies,
    ram_blocked_setups,
    shape_setups,
)

CENT = 0.005
# An entry the simpler-first rule moves up passes at most this many others in a chain (8 GPUs spot -> 1 GPU spot
# -> 1 GPU on demand -> ...): the pruning keeps entries up to kth / (1 - tolerance) ** this.
SIMPLER_CHAIN = 3
# An offload setup slower than this share of the first GPU-only setup says so first.
SLOW_SHARE = 0.25
# The provider/region filter, the card and its precision verdict of an offer: a card, or why it is left out.
Verdict = tuple[GpuSpec | None, Rejection | None, str | None]
# What decides an offer's setups: card, node size, whole nodes only, intra-node link as written, inter-node
# Gbit/s, host RAM per node (services.planner.search.shape_setups reads nothing else of the offer).
LayoutKey = tuple[str, int, bool, str, float | None, float | None]


@dataclass
class OfferGroup:
    """The offers of one layout key: one search gives all of them the same setups (or none)."""

    spec: GpuSpec
    indices: list[int]
    setups: list[Setup] = field(default_factory=list)


@dataclass
class Bounds:
    """Every (offer, setup, pricing) as arrays, in rank order of the lower bound of its cost: the bound, then
    fewer GPUs, fewer nodes, the shorter run, the offer's position, the setup's position, on demand first."""

    bound: np.ndarray
    offer: np.ndarray
    setup: np.ndarray  # position in the offer's setups
    spot: np.ndarray  # bool
    card: np.ndarray  # position in Scan.card_names

    @classmethod
    def empty(cls) -> Bounds:
        e = np.empty(0)
        return cls(e, e.astype(np.int64), e.astype(np.int64), e.astype(bool), e.astype(np.int64))


@dataclass
class Scan:
    """One pass over the catalog: what was filtered out, the cards seen, the offers grouped by layout and the
    lower bounds of every pricing."""

    offers: tuple[Offer, ...]
    rejections: list[Rejection] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    cards: dict[str, tuple[GpuSpec, list[Offer]]] = field(default_factory=dict)
    fitting_cards: set[str] = field(default_factory=set)
    groups: list[OfferGroup] = field(default_factory=list)
    group_of: dict[int, OfferGroup] = field(default_factory=dict)  # offers with fitting setups, in index order
    # Offers with no setup because their nodes' host RAM cannot hold the offloaded states: index -> those setups.
    ram_blocked: dict[int, list[RamBlocked]] = field(default_factory=dict)
    card_names: list[str] = field(default_factory=list)
    bounds: Bounds = field(default_factory=Bounds.empty)

    def setups_of(self, index: int) -> list[Setup]:
        return self.group_of[index].setups


def _verdict(
    ctx: PlanContext, offer: Offer, specs: tuple[GpuSpec, ...], found: dict[str, GpuSpec | EstimatorError]
) -> Verdict:
    """(card, rejection, warning) of an offer by its provider, region, country and card name."""
    excluded = filter_rejection(ctx.constraints, offer)
    if excluded is not None:
        return None, excluded, None
    spec = found.get(offer.gpu)
    if spec is None:
        try:
            spec = find_gpu(offer.gpu, specs)
        except EstimatorError as exc:
            spec = exc
        found[offer.gpu] = spec
    if isinstance(spec, EstimatorError):
        unknown = Rejection(gpu=offer.gpu, provider=offer.provider, kind="unknown_gpu", reason=spec.message)
        return None, unknown, f"offer {offer.provider} / {offer.gpu}: {spec.message}"
    unsupported = precision_rejection(ctx.plan, spec, offer)
    return (None, unsupported, None) if unsupported is not None else (spec, None, None)


def scan_offers(ctx: PlanContext, offers: tuple[Offer, ...], specs: tuple[GpuSpec, ...]) -> Scan:
    """Filter the offers, match their cards, group them by layout, search each layout once, and bound each
    pricing's cost as arrays over the group's offers."""
    scan = Scan(offers)
    found_specs: dict[str, GpuSpec | EstimatorError] = {}
    verdicts: dict[tuple[str, str, str, str], Verdict] = {}
    groups: dict[LayoutKey, OfferGroup] = {}
    for index, offer in enumerate(offers):
        where = (offer.provider, offer.region, offer.country, offer.gpu)
        verdict = verdicts.get(where)
        if verdict is None:
            verdict = verdicts[where] = _verdict(ctx, offer, specs, found_specs)
        spec, rejection, warning = verdict
        if spec is None:
            scan.rejections.append(rejection)  # type: ignore[arg-type]
            if warning is not None:
                scan.warnings.append(warning)
            continue
        scan.cards.setdefault(spec.name, (spec, []))[1].append(offer)
        key = (
            spec.name,
            offer.gpus_per_node,
            offer.whole_nodes_only,
            offer.interconnect,
            offer.inter_node_gbit_per_s,
            offer.host_ram_gib_per_node,
        )
        group = groups.get(key)
        if group is None:
            group = groups[key] = OfferGroup(spec, [])
        group.indices.append(index)
    scan.groups = list(groups.values())
    fitting: list[OfferGroup] = []
    for group in scan.groups:
        ctx.budget.check("constraints", NARROW_SEARCH)
        first = offers[group.indices[0]]
        group.setups = shape_setups(ctx, first, group.spec)
        if group.setups:
            scan.fitting_cards.add(group.spec.name)
            fitting.append(group)
        elif first.host_ram_gib_per_node is not None:
            blocked = ram_blocked_setups(ctx, first, group.spec)
            if blocked:
                for index in group.indices:
                    scan.ram_blocked[index] = blocked
    scan.ram_blocked = dict(sorted(scan.ram_blocked.items()))
    scan.group_of = dict(sorted((i, g) for g in fitting for i in g.indices))
    scan.card_names = sorted(scan.fitting_cards)
    scan.bounds = _bounds(ctx, scan, fitting)
    return scan


def _bounds(ctx: PlanContext, scan: Scan, groups: list[OfferGroup]) -> Bounds:
    """Start-up, model download and training at the hourly price, for every offer, setup and pricing in one
    vector pass (the same sums as costs.startup_seconds + costs.download_seconds, element by element)."""
    offers = scan.offers
    card_of = {name: i for i, name in enumerate(scan.card_names)}
    pair_offer: list[int] = []
    rows: list[tuple[float, int, int, int, int]] = []  # per (group, setup): training s, GPUs, nodes, position, card
    counts: list[int] = []
    for group in groups:
        card = card_of[group.spec.name]
        for position, s in enumerate(group.setups):
            pair_offer.extend(group.indices)
            rows.append((s.training_s, s.layout.gpus, s.layout.nodes, position, card))
            counts.append(len(group.indices))
    if not rows:
        return Bounds.empty()
    members = sorted(scan.group_of)
    column = np.full(len(offers), np.nan)

    def per_offer(values: list[float]) -> np.ndarray:
        out = column.copy()
        out[members] = values
        return out

    chosen = [offers[i] for i in members]
    price = per_offer([o.on_demand_usd_per_hour for o in chosen])
    startup = per_offer([DEFAULT_STARTUP_S if o.startup_s is None else o.startup_s for o in chosen])
    gbit = per_offer([o.download_gbit_per_s or DEFAULT_DOWNLOAD_GBIT_PER_S for o in chosen])
    spot_ok = ctx.constraints.spot_allowed
    spot_price = per_offer(
        [np.nan if o.spot_usd_per_hour is None or not spot_ok else o.spot_usd_per_hour for o in chosen]
    )
    fixed = startup + ctx.sizes.model_download_bytes / (gbit / 8.0 * 1e9)

    index = np.array(pair_offer, dtype=np.int64)
    repeat = np.array(counts, dtype=np.int64)
    training, gpus, nodes, position, card = (np.repeat(np.array(c), repeat) for c in zip(*rows, strict=True))
    seconds = training + fixed[index]
    on_demand = seconds * gpus * price[index] / 3600.0
    spot_rate = spot_price[index]
    has = ~np.isnan(spot_rate)
    spot = seconds[has] * gpus[has] * spot_rate[has] / 3600.0
    is_spot = np.concatenate((np.zeros(len(index), dtype=bool), np.ones(len(spot), dtype=bool)))

    def both(a: np.ndarray) -> np.ndarray:
        return np.concatenate((a, a[has]))

    bound = np.concatenate((on_demand, spot))
    gpus_, nodes_, seconds_, index_, position_, card_ = (both(a) for a in (gpus, nodes, seconds, index, position, card))
    order = np.lexsort((is_spot, position_, index_, seconds_, nodes_, gpus_, bound))
    return Bounds(bound[order], index_[order], position_[order], is_spot[order], card_[order])


class Pricer:
    """Full prices of (offer, setup) pairs, each computed once."""

    def __init__(self, ctx: PlanContext, scan: Scan) -> None:
        self.ctx = ctx
        self.scan = scan
        self._priced: dict[tuple[int, int], Candidate] = {}

    def candidate(self, index: int, position: int) -> Candidate:
        """The offer's setup at ``position`` of its setups, priced."""
        key = (index, position)
        found = self._priced.get(key)
        if found is None:
            setup = self.scan.setups_of(index)[position]
            found = price_setup(self.ctx, index, self.scan.offers[index], setup)
            self._priced[key] = found
        return found


def rank_entries(ctx: PlanContext, scan: Scan, pricer: Pricer, top_n: int) -> tuple[list[Entry], set[int]]:
    """The priced entries that meet the constraints, in rank order, and the offers that have one.

    Entries are taken in bound order; each is priced in full unless its bound can reach neither the top N nor
    its card's best. Both limits only fall as entries are taken and bounds only rise, so a card's first entry
    left out closes the card: its later entries are not visited (the per-card orders are merged)."""
    b = scan.bounds
    entries: list[Entry] = []
    top: list[float] = []  # max-heap (negated) of the top_n costs so far
    card_best: dict[str, float] = {}
    qualified: set[int] = set()
    widen = _widening(ctx.constraints.prefer_simpler_within)
    cards = len(scan.fitting_cards)
    heads = _card_heads(scan)
    while heads:
        rank, card, members, at = heapq.heappop(heads)
        bound = float(b.bound[rank])
        kth = -top[0] * widen if len(top) >= top_n else math.inf
        if bound > kth + CENT and len(card_best) == cards and all(bound > v + CENT for v in card_best.values()):
            break
        best = card_best.get(card, math.inf)
        if bound > kth + CENT and bound > best + CENT:
            continue  # the card is closed
        index = int(b.offer[rank])
        if at + 1 < len(members):
            heapq.heappush(heads, (int(members[at + 1]), card, members, at + 1))
        c = pricer.candidate(index, int(b.setup[rank]))
        cost = c.spot if b.spot[rank] else c.on_demand
        if cost is None or not qualifies(ctx.constraints, cost):
            continue
        qualified.add(index)
        entries.append(Entry(c, cost))
        value = cost.expected_cost_usd
        if len(top) < top_n:
            heapq.heappush(top, -value)
        elif value < -top[0]:
            heapq.heapreplace(top, -value)
        card_best[card] = min(best, value)
    entries.sort(key=Entry.rank_key)
    return prefer_simpler(entries, ctx.constraints.prefer_simpler_within), qualified


def _card_heads(scan: Scan) -> list[tuple[int, str, np.ndarray, int]]:
    """Per card, its entries' ranks in bound order, as a heap of (first rank, card, ranks, 0)."""
    b = scan.bounds
    heads = []
    for i, name in enumerate(scan.card_names):
        members = np.flatnonzero(b.card == i)
        if len(members):
            heads.append((int(members[0]), name, members, 0))
    heapq.heapify(heads)
    return heads


def _widening(tolerance: float) -> float:
    """How far past the N-th cheapest cost an entry may still be moved into the top N by the simpler-first rule."""
    if tolerance >= 1.0:
        return math.inf
    return float((1.0 / (1.0 - tolerance)) ** SIMPLER_CHAIN)


def complexity(e: Entry) -> tuple[int, int, int, int]:
    """What makes a setup harder to rent and run: GPUs, nodes, spot, CPU offload (larger is more complex)."""
    c = e.candidate
    return (c.layout.gpus, c.layout.nodes, int(e.cost.pricing == "spot"), int(c.cfg.cpu_offload))


def is_simpler(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Whether complexity ``a`` is simpler than ``b``: no larger in any respect and smaller in one."""
    return a != b and all(x <= y for x, y in zip(a, b, strict=True))


def setup_label(e: Entry) -> str:
    """The setup in a few words: '8 x A100 40GB spot at aws'."""
    c = e.candidate
    nodes = f" on {c.layout.nodes} nodes" if c.layout.nodes > 1 else ""
    pricing = "spot" if e.cost.pricing == "spot" else "on demand"
    offload = " with CPU offload" if c.cfg.cpu_offload else ""
    return f"{c.layout.gpus} x {c.spec.name}{nodes} {pricing}{offload} at {c.offer.provider}"


def prefer_simpler(entries: list[Entry], tolerance: float) -> list[Entry]:
    """``entries`` (in cost order) reordered so that one ranks above a simpler one only when its expected cost is
    lower by more than ``tolerance``, with a note on each entry the rule concerns.

    Each step takes the cheapest entry left that is cheaper by more than the tolerance than every simpler entry
    left; a simplest entry always qualifies, so every step takes one. Pairs of which neither is simpler (2 GPUs on
    demand, 1 GPU spot) keep their cost order. Entries are grouped by complexity (a few distinct ones), so each
    check compares with the cheapest entry left of each simpler group.
    """
    keys = [complexity(e) for e in entries]
    costs = [e.cost.expected_cost_usd for e in entries]
    groups: dict[tuple[int, int, int, int], list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)  # each group in cost order
    simpler_groups = {k: [g for g in groups if is_simpler(g, k)] for k in groups}
    complex_groups = {k: [g for g in groups if is_simpler(k, g)] for k in groups}
    head = dict.fromkeys(groups, 0)  # per group, the position of its cheapest entry left
    taken = [False] * len(entries)

    def cheapest_left(group: tuple[int, int, int, int]) -> int | None:
        members, at = groups[group], head[group]
        while at < len(members) and taken[members[at]]:
            at += 1
        head[group] = at
        return members[at] if at < len(members) else None

    def admissible(i: int) -> bool:
        for g in simpler_groups[keys[i]]:
            j = cheapest_left(g)
            if j is not None and costs[i] >= (1.0 - tolerance) * costs[j]:
                return False
        return True

    left = list(range(len(entries)))
    out: list[Entry] = []
    while left:
        pos = next(p for p, i in enumerate(left) if admissible(i))
        i = left.pop(pos)
        taken[i] = True
        out.append(_simpler_notes(entries, costs, i, simpler_groups, complex_groups, cheapest_left, tolerance))
    return _caveats(out)


def _simpler_notes(
    entries: list[Entry],
    costs: list[float],
    i: int,
    simpler_groups: dict[tuple[int, int, int, int], list[tuple[int, int, int, int]]],
    complex_groups: dict[tuple[int, int, int, int], list[tuple[int, int, int, int]]],
    cheapest_left: Callable[[tuple[int, int, int, int]], int | None],
    tolerance: float,
) -> Entry:
    """Entry ``i``, just ranked, with a note naming the simpler setup it passed (ranked below it), or the cheaper
    complex one within the tolerance it was preferred to."""
    e, cost, key = entries[i], costs[i], complexity(entries[i])
    notes: list[str] = []
    below = [j for g in simpler_groups[key] if (j := cheapest_left(g)) is not None]
    if below:
        q = min(below, key=lambda j: costs[j])
        notes.append(
            f"the simpler {setup_label(entries[q])} costs ${costs[q]:,.2f}: this setup is {1 - cost / costs[q]:.0%} "
            f"cheaper, more than constraints.prefer_simpler_within ({tolerance:.0%})"
        )
    passed = [
        j
        for g in complex_groups[key]
        if (j := cheapest_left(g)) is not None and (1.0 - tolerance) * cost <= costs[j] < cost
    ]
    if passed:
        q = min(passed, key=lambda j: costs[j])
        notes.append(
            f"ranked above {setup_label(entries[q])} at ${costs[q]:,.2f}: that is only {1 - costs[q] / cost:.0%} "
            f"cheaper, within constraints.prefer_simpler_within ({tolerance:.0%}) of this simpler setup at "
            f"${cost:,.2f}"
        )
    return dataclasses.replace(e, tail=(*e.tail, *notes)) if notes else e


def _caveats(out: list[Entry]) -> list[Entry]:
    """A first note on each offload setup whose host RAM is unverified, or that runs at under SLOW_SHARE of the
    first-ranked setup without offload."""
    gpu_only = next((e for e in out if not e.candidate.cfg.cpu_offload), None)
    result = []
    for e in out:
        c = e.candidate
        if not c.cfg.cpu_offload:
            result.append(e)
            continue
        parts = []
        if host_ram_available_bytes(c.offer, c.layout) is None:
            parts.append(
                f"host RAM unverified ({c.offer.provider} does not say how much CPU memory its nodes have; the "
                f"offloaded states need about {c.setup.host_ram_bytes_per_node / GIB:,.0f} GiB per node)"
            )
        speed = c.throughput.data_tokens_per_s
        if gpu_only is not None and speed < SLOW_SHARE * gpu_only.candidate.throughput.data_tokens_per_s:
            fast = gpu_only.candidate.throughput.data_tokens_per_s
            parts.append(
                f"slow: {speed:,.0f} tokens/s, under a quarter of the {fast:,.0f} tokens/s of "
                f"{setup_label(gpu_only)} without offload (${gpu_only.cost.expected_cost_usd:,.2f})"
            )
        result.append(
            dataclasses.replace(e, lead=("caution, CPU offload: " + "; ".join(parts), *e.lead)) if parts else e
        )
    return result


def unqualified_offers(ctx: PlanContext, scan: Scan, pricer: Pricer, qualified: set[int]) -> list[list[Candidate]]:
    """Offers with fitting setups none of which meets the budget and deadline under any pricing (only
    with a budget or a deadline: without them every fitting setup qualifies)."""
    c = ctx.constraints
    if c.budget_usd is None and c.deadline_hours is None:
        return []
    out = []
    for index, group in scan.group_of.items():
        if index in qualified:
            continue
        priced = [pricer.candidate(index, position) for position in range(len(group.setups))]
        if all(p.qualifies_with is None for p in priced):
            out.append(priced)
    return out
