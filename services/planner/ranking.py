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

from services.catalog.gpus import GpuSpec, find_gpu
from services.catalog.offers import Offer
from services.estimator.errors import EstimatorError
from services.estimator.memory import GIB
from services.planner.context import Candidate, Entry, PlanContext, RamBlocked, Setup
from services.planner.costs import download_seconds, startup_seconds
from services.planner.host_ram import host_ram_available_bytes
from services.planner.models import PricingMode, Rejection
from services.planner.rejections import filter_rejection, precision_rejection
from services.planner.search import (
    NARROW_SEARCH,
    price_setup,
    qualifies,
    ram_blocked_setups,
    shape_setups,
)

# (bound, GPUs, nodes, seconds, offer index, sequence number, setup, pricing); the sequence number keeps
# heap comparisons away from the setup.
Bound = tuple[float, int, int, float, int, int, Setup, PricingMode]
CENT = 0.005
# An entry the simpler-first rule moves up passes at most this many others in a chain (8 GPUs spot -> 1 GPU spot
# -> 1 GPU on demand -> ...): the pruning keeps entries up to kth / (1 - tolerance) ** this.
SIMPLER_CHAIN = 3
# An offload setup slower than this share of the first GPU-only setup says so first.
SLOW_SHARE = 0.25


@dataclass
class Scan:
    """One pass over the catalog: what was filtered out, the cards seen, and every priced bound."""

    offers: tuple[Offer, ...]
    rejections: list[Rejection] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    cards: dict[str, tuple[GpuSpec, list[Offer]]] = field(default_factory=dict)
    fitting_cards: set[str] = field(default_factory=set)
    setups_of: dict[int, list[Setup]] = field(default_factory=dict)
    # Offers with no setup because their nodes' host RAM cannot hold the offloaded states: index -> those setups.
    ram_blocked: dict[int, list[RamBlocked]] = field(default_factory=dict)
    bounds: list[Bound] = field(default_factory=list)


def scan_offers(ctx: PlanContext, offers: tuple[Offer, ...], specs: tuple[GpuSpec, ...]) -> Scan:
    """Filter the offers, match their cards, search their shapes, and bound each pricing's cost."""
    scan = Scan(offers)
    found_specs: dict[str, GpuSpec | EstimatorError] = {}
    spot_ok = ctx.constraints.spot_allowed
    download_bytes = ctx.sizes.model_download_bytes
    for index, offer in enumerate(offers):
        ctx.budget.check("constraints", NARROW_SEARCH)
        excluded = filter_rejection(ctx.constraints, offer)
        if excluded is not None:
            scan.rejections.append(excluded)
            continue
        spec = found_specs.get(offer.gpu)
        if spec is None:
            try:
                spec = find_gpu(offer.gpu, specs)
            except EstimatorError as exc:
                spec = exc
            found_specs[offer.gpu] = spec
        if isinstance(spec, EstimatorError):
            scan.rejections.append(
                Rejection(gpu=offer.gpu, provider=offer.provider, kind="unknown_gpu", reason=spec.message)
            )
            scan.warnings.append(f"offer {offer.provider} / {offer.gpu}: {spec.message}")
            continue
        unsupported = precision_rejection(ctx.plan, spec, offer)
        if unsupported is not None:
            scan.rejections.append(unsupported)
            continue
        scan.cards.setdefault(spec.name, (spec, []))[1].append(offer)
        setups = shape_setups(ctx, offer, spec)
        if not setups:
            blocked = ram_blocked_setups(ctx, offer, spec) if offer.host_ram_gib_per_node is not None else []
            if blocked:
                scan.ram_blocked[index] = blocked
            continue
        scan.fitting_cards.add(spec.name)
        scan.setups_of[index] = setups
        fixed_s = startup_seconds(offer) + download_seconds(offer, download_bytes)
        spot_price = offer.spot_usd_per_hour if spot_ok else None
        bounds = scan.bounds
        for s in setups:
            gpus, nodes = s.layout.gpus, s.layout.nodes
            seconds = s.training_s + fixed_s
            bounds.append(
                (
                    seconds * gpus * offer.on_demand_usd_per_hour / 3600.0,
                    gpus,
                    nodes,
                    seconds,
                    index,
                    len(bounds),
                    s,
                    "on_demand",
                )
            )
            if spot_price is not None:
                bounds.append(
                    (seconds * gpus * spot_price / 3600.0, gpus, nodes, seconds, index, len(bounds), s, "spot")
                )
    return scan


class Pricer:
    """Full prices of (offer, setup) pairs, each computed once."""

    def __init__(self, ctx: PlanContext, offers: tuple[Offer, ...]) -> None:
        self.ctx = ctx
        self.offers = offers
        self._priced: dict[tuple[int, int], Candidate] = {}

    def candidate(self, index: int, setup: Setup) -> Candidate:
        key = (index, id(setup))
        found = self._priced.get(key)
        if found is None:
            found = price_setup(self.ctx, index, self.offers[index], setup)
            self._priced[key] = found
        return found


def rank_entries(ctx: PlanContext, scan: Scan, pricer: Pricer, top_n: int) -> tuple[list[Entry], set[int]]:
    """The priced entries that meet the constraints, in rank order, and the offers that have one."""
    bounds = list(scan.bounds)
    heapq.heapify(bounds)
    entries: list[Entry] = []
    top: list[float] = []  # max-heap (negated) of the top_n costs so far
    card_best: dict[str, float] = {}
    qualified: set[int] = set()
    widen = _widening(ctx.constraints.prefer_simpler_within)
    while bounds:
        bound, _, _, _, index, _, s, pricing = heapq.heappop(bounds)
        kth = -top[0] * widen if len(top) >= top_n else math.inf
        every_card_done = len(card_best) == len(scan.fitting_cards)
        if bound > kth + CENT and every_card_done and all(bound > b + CENT for b in card_best.values()):
            break
        best = card_best.get(s.spec.name, math.inf)
        if bound > kth + CENT and bound > best + CENT:
            continue
        c = pricer.candidate(index, s)
        cost = c.on_demand if pricing == "on_demand" else c.spot
        if cost is None or not qualifies(ctx.constraints, cost):
            continue
        qualified.add(index)
        entries.append(Entry(c, cost))
        value = cost.expected_cost_usd
        if len(top) < top_n:
            heapq.heappush(top, -value)
        elif value < -top[0]:
            heapq.heapreplace(top, -value)
        card_best[s.spec.name] = min(best, value)
    entries.sort(key=Entry.rank_key)
    return prefer_simpler(entries, ctx.constraints.prefer_simpler_within), qualified


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
    for index, setups in scan.setups_of.items():
        if index in qualified:
            continue
        priced = [pricer.candidate(index, s) for s in setups]
        if all(p.qualifies_with is None for p in priced):
            out.append(priced)
    return out
