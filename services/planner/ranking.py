"""Ranking a scanned catalog: entries priced in full in increasing order of their cost's lower bound
(services.planner.scan), until a bound can reach neither the top N nor the first entry of a card (both widened by
what the simpler-first rule can move up): over thousands of offers only a few dozen are priced.

A setup is priced on one offer by ``price_setup`` (on demand and spot, services.planner.costs); the priced
entries are then ordered by ``prefer_simpler``: cheapest first, except that a setup with more GPUs,
more nodes, spot or CPU offload ranks above a simpler one only when it is cheaper by more than
``constraints.prefer_simpler_within``; the pruning keeps every entry that tolerance could bring into the top N.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import operator
from collections.abc import Callable, Iterator

import numpy as np

from services.catalog.offers import Offer
from services.estimator.memory import GIB
from services.planner.constraints import Constraints
from services.planner.context import Candidate, Entry, PlanContext, PricedSetup, Setup
from services.planner.costs import RunCost, RunShape, run_cost
from services.planner.host_ram import host_ram_available_bytes
from services.planner.models import PricingMode
from services.planner.scan import EntryKey, Scan

CENT = 0.005
# The chain of entries the simpler-first rule moves up (8 GPUs spot -> 1 GPU spot -> 1 GPU on demand -> ...) that
# the pruning first assumes: it keeps entries up to kth / (1 - tolerance) ** this, then checks (rank_entries).
SIMPLER_CHAIN = 3
# An offload setup slower than this share of the first GPU-only setup says so first.
SLOW_SHARE = 0.25


def qualifies(constraints: Constraints, cost: RunCost) -> bool:
    """Whether one pricing of a setup meets both the budget and the deadline."""
    if constraints.budget_usd is None and constraints.deadline_hours is None:
        return True
    return bool(constraints.meets_budget(cost.expected_cost_usd) and constraints.meets_deadline(cost.hours))


def price_setup(ctx: PlanContext, offer_index: int, offer: Offer, setup: Setup) -> Candidate:
    """The setup on this offer: on demand and, where offered and allowed, on spot."""
    sizes = ctx.sizes
    shape = RunShape(
        gpus=setup.layout.gpus,
        nodes=setup.layout.nodes,
        training_s=setup.training_s,
        model_download_bytes=sizes.model_download_bytes,
        checkpoint_bytes=sizes.checkpoint_bytes,
        final_upload_bytes=sizes.final_upload_bytes,
        checkpoint_write_s=sizes.checkpoint_write_s,
    )
    c = ctx.constraints
    restart_s = c.restart_s
    on_demand = run_cost(offer, shape, "on_demand", restart_s=restart_s)
    spot: RunCost | None = None
    if offer.spot_usd_per_hour is not None and c.spot_allowed:
        spot = run_cost(offer, shape, "spot", preemptions_per_node_hour=c.preemptions_per_hour, restart_s=restart_s)
    mode: PricingMode | None = None
    if qualifies(c, on_demand):
        mode = "on_demand"
    elif spot is not None and qualifies(c, spot):
        mode = "spot"
    return Candidate(offer, offer_index, setup, on_demand, spot, mode)


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


def rank_entries(ctx: PlanContext, scan: Scan, pricer: Pricer, top_n: int) -> tuple[list[Entry], list[Entry]]:
    """The first ``top_n`` entries that meet the constraints in rank order (``prefer_simpler``), and each card's first
    entry among its own (``card_firsts``), cheapest first.

    Entries are priced in bound order as far as ``_priced_entries`` needs, assuming a simpler-first chain of at most
    SIMPLER_CHAIN steps, then both answers are checked against what was left unpriced. An entry left out could change
    the top N only by being cheaper than one of it or by holding one back (a simpler entry within the tolerance of
    it), so where every entry of the top N costs less than ``1 - tolerance`` times the least bound left out, it is
    the top N of the whole ranking; a card's first likewise against the least bound left out of that card. Where a
    check fails (a longer chain: a planner probe of stop 49 found the first pick changing with ``top_n``), more is
    priced until it passes."""
    tolerance = ctx.constraints.prefer_simpler_within
    for chain in (SIMPLER_CHAIN, 2 * SIMPLER_CHAIN, None):
        entries, left_out, card_left_out = _priced_entries(ctx, scan, pricer, top_n, _widening(tolerance, chain))
        ranked = prefer_simpler(entries, tolerance, top_n)
        firsts = card_firsts(entries, tolerance)
        settled = [(e, left_out) for e in ranked[:top_n]] + [(e, card_left_out[c]) for c, e in firsts.items()]
        if all(b == math.inf or e.cost.expected_cost_usd + CENT < (1.0 - tolerance) * b for e, b in settled):
            break
    return ranked, _with_notes(entries, ranked, firsts, tolerance)


def card_firsts(entries: list[Entry], tolerance: float) -> dict[str, Entry]:
    """Each card's first entry under the simpler-first rule among that card's own entries (``entries`` in rank order):
    the first that is cheaper by more than ``tolerance`` than every simpler entry of its card. Other cards' setups do
    not hold it back, so it does not depend on what else the catalog sells (``best_per_gpu``; it was the card's first
    entry in the whole ranking, where a simpler setup of another card could hold back its cheapest one, and which
    pricing only part of the catalog could not find exactly: a planner probe of stop 50)."""
    by_card: dict[str, list[tuple[Entry, tuple[int, int, int, int], float]]] = {}
    for e in entries:
        by_card.setdefault(e.candidate.spec.name, []).append((e, complexity(e), e.cost.expected_cost_usd))
    firsts: dict[str, Entry] = {}
    for card, mine in by_card.items():
        least: dict[tuple[int, int, int, int], float] = {}  # per complexity, the least cost of the card
        for _, key, cost in mine:
            least.setdefault(key, cost)  # in rank order: the first is the least
        for e, key, cost in mine:
            if all(cost < (1.0 - tolerance) * v for k, v in least.items() if is_simpler(k, key)):
                firsts[card] = e  # an entry of the simplest complexity always qualifies
                break
    return firsts


def _with_notes(entries: list[Entry], ranked: list[Entry], firsts: dict[str, Entry], tolerance: float) -> list[Entry]:
    """The cards' firsts, cheapest first, each as the ranking shows it (with its notes) where it ranked, else as its
    card's own ranking would."""
    shown = {(id(e.candidate), e.cost.pricing): e for e in ranked}
    by_card: dict[str, list[Entry]] = {}
    for e in entries:
        by_card.setdefault(e.candidate.spec.name, []).append(e)
    out = []
    for card, e in firsts.items():
        found = shown.get((id(e.candidate), e.cost.pricing))
        out.append(found if found is not None else prefer_simpler(by_card[card], tolerance, 1)[0])
    return sorted(out, key=Entry.rank_key)


def _priced_entries(
    ctx: PlanContext, scan: Scan, pricer: Pricer, top_n: int, widen: float
) -> tuple[list[Entry], float, dict[str, float]]:
    """The entries that meet the constraints among those priced in full, in cost order, the least bound of those left
    unpriced (infinity: none), and per card the least bound of its own left unpriced.

    Entries are taken in bound order; each is priced in full unless its bound can reach neither the top N nor
    its card's first entry: both the N-th and the card's cheapest cost widened by ``widen``, since a simpler
    setup within the tolerance ranks first (a card's cheapest alone left its simpler setups unpriced, and
    best_per_gpu named a dearer, more complex one). Both limits only fall as entries are taken and bounds only
    rise, so a card's first entry left out closes the card: its later entries are never put in order (the
    per-card orders are merged), and the first entry left out has the least bound of all those left out."""
    entries: list[Entry] = []
    top: list[float] = []  # max-heap (negated) of the top_n costs so far
    card_best: dict[str, float] = {}
    stopped = math.inf
    card_left_out: dict[str, float] = {}
    cards = len(scan.fitting_cards)
    heads: list[tuple[EntryKey, int, str, Iterator[tuple[EntryKey, int]]]] = []
    for name, bounds in scan.bounds.items():
        ordered = bounds.in_rank_order()
        first = next(ordered, None)
        if first is not None:
            heads.append((*first, name, ordered))
    heapq.heapify(heads)  # entry keys are unique (offer, setup, pricing): nothing after them is compared
    while heads:
        key, row, card, ordered = heapq.heappop(heads)
        bound, _, _, _, index, position, spot = key
        kth = -top[0] * widen if len(top) >= top_n else math.inf
        if bound > kth + CENT and len(card_best) == cards and all(bound > v * widen + CENT for v in card_best.values()):
            stopped = bound  # every card not closed before has only larger bounds left
            break
        best = card_best.get(card, math.inf)
        if bound > kth + CENT and bound > best * widen + CENT:
            card_left_out[card] = bound  # its first entry left out, the least of its own
            continue  # the card is closed
        following = next(ordered, None)
        if following is not None:
            heapq.heappush(heads, (*following, card, ordered))
        verdict = scan.bounds[card].qualifies
        if verdict is not None and not verdict[row]:
            continue  # priced as arrays: it breaks the budget or the deadline
        c = pricer.candidate(index, position)
        cost = c.spot if spot else c.on_demand
        if cost is None or not qualifies(ctx.constraints, cost):
            continue
        entries.append(Entry(c, cost))
        value = cost.expected_cost_usd
        if len(top) < top_n:
            heapq.heappush(top, -value)
        elif value < -top[0]:
            heapq.heapreplace(top, -value)
        card_best[card] = min(best, value)
    entries.sort(key=Entry.rank_key)
    left_out = min([stopped, *card_left_out.values()])
    return entries, left_out, {card: card_left_out.get(card, stopped) for card in scan.bounds}


def _widening(tolerance: float, chain: int | None) -> float:
    """How far past the N-th cheapest cost an entry may still be moved into the top N by the simpler-first rule
    in a chain of ``chain`` steps (None: any number)."""
    if tolerance >= 1.0 or chain is None:
        return math.inf
    return float((1.0 / (1.0 - tolerance)) ** chain)


def complexity(e: Entry) -> tuple[int, int, int, int]:
    """What makes a setup harder to rent and run: GPUs, nodes, spot, CPU offload (larger is more complex)."""
    c = e.candidate
    return (c.layout.gpus, c.layout.nodes, int(e.cost.pricing == "spot"), int(c.cfg.cpu_offload))


def is_simpler(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Whether complexity ``a`` is simpler than ``b``: no larger in any respect and smaller in one."""
    return a != b and all(map(operator.le, a, b))


def setup_label(e: Entry) -> str:
    """The setup in a few words: '8 x A100 40GB spot at aws'."""
    c = e.candidate
    nodes = f" on {c.layout.nodes} nodes" if c.layout.nodes > 1 else ""
    pricing = "spot" if e.cost.pricing == "spot" else "on demand"
    offload = " with CPU offload" if c.cfg.cpu_offload else ""
    return f"{c.layout.gpus} x {c.spec.name}{nodes} {pricing}{offload} at {c.offer.provider}"


def prefer_simpler(entries: list[Entry], tolerance: float, top_n: int | None = None) -> list[Entry]:
    """``entries`` (in cost order) reordered so that one ranks above a simpler one only when its expected cost is
    lower by more than ``tolerance``, with a note on each entry the rule concerns. With ``top_n``, only the first
    ``top_n`` of the whole order (the offload cautions still measure against the first entry without CPU offload,
    wherever it ranks).

    Each step takes the cheapest entry left that is cheaper by more than the tolerance than every simpler entry
    left; a simplest entry always qualifies, so every step takes one. Of a pair of which neither is simpler (2 GPUs
    on demand, 1 GPU spot) the cheaper comes first unless a simpler entry holds it back. Entries are grouped by
    complexity (a few distinct ones), so each check compares with the cheapest entry left of each simpler group.
    """
    keys = [complexity(e) for e in entries]
    costs = [e.cost.expected_cost_usd for e in entries]
    groups: dict[tuple[int, int, int, int], list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)  # each group in cost order
    simpler_groups = {k: [g for g in groups if is_simpler(g, k)] for k in groups}
    complex_groups: dict[tuple[int, int, int, int], list[tuple[int, int, int, int]]] = {k: [] for k in groups}
    for k in groups:  # the same pairs the other way round, each list in the groups' order
        for g in simpler_groups[k]:
            complex_groups[g].append(k)
    head = dict.fromkeys(groups, 0)  # per group, the position of its cheapest entry left
    taken = [False] * len(entries)

    def cheapest_left(group: tuple[int, int, int, int]) -> int | None:
        members, at = groups[group], head[group]
        while at < len(members) and taken[members[at]]:
            at += 1
        head[group] = at
        return members[at] if at < len(members) else None

    # Per group, the cost its entries must stay under to be cheaper by more than the tolerance than the cheapest
    # entry left of every simpler group: the least of those limits (with finite numbers, each check's verdict is
    # the one against every limit), and which simpler group sets it. Taking a group's cheapest entry moves only
    # that group's limit: a more complex group recomputes its own only where that group set it.
    exact = math.isfinite(tolerance) and all(math.isfinite(c) for c in costs)
    limits: dict[tuple[int, int, int, int], tuple[float, tuple[int, int, int, int] | None]] = {}

    def limit(key: tuple[int, int, int, int]) -> float:
        found = limits.get(key)
        if found is None:
            least, by = math.inf, None
            for g in simpler_groups[key]:
                j = cheapest_left(g)
                if j is not None and (1.0 - tolerance) * costs[j] < least:
                    least, by = (1.0 - tolerance) * costs[j], g
            found = limits[key] = (least, by)
        return found[0]

    def admissible(i: int) -> bool:
        if exact:
            return costs[i] < limit(keys[i])
        for g in simpler_groups[keys[i]]:
            j = cheapest_left(g)
            if j is not None and costs[i] >= (1.0 - tolerance) * costs[j]:
                return False
        return True

    left = list(range(len(entries)))
    out: list[Entry] = []
    plain: Entry | None = None  # the first entry without CPU offload (_caveats)
    plain_to_come = any(not e.candidate.cfg.cpu_offload for e in entries)
    while left:
        if top_n is not None and len(out) >= top_n and not plain_to_come:
            break
        pos = next(p for p, i in enumerate(left) if admissible(i))
        i = left.pop(pos)
        taken[i] = True
        group = keys[i]
        j = cheapest_left(group)
        moved = None if j is None else (1.0 - tolerance) * costs[j]
        for g in complex_groups[group]:
            known = limits.get(g)
            if known is None:
                continue
            if known[1] == group:
                del limits[g]
            elif moved is not None and moved < known[0]:
                limits[g] = (moved, group)
        if top_n is None or len(out) < top_n:
            out.append(_simpler_notes(entries, costs, i, simpler_groups, complex_groups, cheapest_left, tolerance))
        if plain_to_come and not entries[i].candidate.cfg.cpu_offload:
            plain, plain_to_come = entries[i], False
    return _caveats(out, plain)


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


def _caveats(out: list[Entry], gpu_only: Entry | None) -> list[Entry]:
    """A first note on each offload setup whose host RAM is unverified, or that runs at under SLOW_SHARE of
    ``gpu_only``, the first-ranked setup without offload."""
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


def unqualified_offers(ctx: PlanContext, scan: Scan) -> list[list[PricedSetup]]:
    """Offers with fitting setups none of which meets the budget and deadline under any pricing (only
    with a budget or a deadline: without them every fitting setup qualifies), each with its setups priced
    (from the arrays of ``_full_prices``), in catalog order."""
    c = ctx.constraints
    if c.budget_usd is None and c.deadline_hours is None:
        return []
    meets = np.zeros(len(scan.offers), dtype=bool)
    parts = []
    for b in scan.bounds.values():
        if b.cost is None or b.hours is None or b.qualifies is None:
            continue  # not priced in full: never the case with a budget or a deadline
        n = b.pairs
        spot_cost = np.full(n, np.nan)
        spot_hours = np.full(n, np.nan)
        spot_cost[b.spot_pair], spot_hours[b.spot_pair] = b.cost[n:], b.hours[n:]
        pair_ok = b.qualifies[:n].copy()
        pair_ok[b.spot_pair] |= b.qualifies[n:]
        meets[b.offer[:n][pair_ok]] = True
        parts.append((b.offer[:n], b.position[:n], b.cost[:n], b.hours[:n], spot_cost, spot_hours))
    if not parts:
        return []
    index, position, cost, hours, spot_cost, spot_hours = (np.concatenate(p) for p in zip(*parts, strict=True))
    left = ~meets[index]
    index, position, cost, hours, spot_cost, spot_hours = (
        a[left] for a in (index, position, cost, hours, spot_cost, spot_hours)
    )
    order = np.lexsort((position, index))
    out: list[list[PricedSetup]] = []
    last = -1
    for i, p, od, od_h, sp, sp_h in zip(
        *(a[order].tolist() for a in (index, position, cost, hours, spot_cost, spot_hours)), strict=True
    ):
        if i != last:
            out.append([])
            last = i
        spot = not math.isnan(sp)
        out[-1].append(
            PricedSetup(scan.offers[i], scan.setups_of(i)[p], od, od_h, sp if spot else None, sp_h if spot else None)
        )
    return out
