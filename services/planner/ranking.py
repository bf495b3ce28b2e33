"""Ranking a scanned catalog: entries priced in full in increasing order of their cost's lower bound
(services.planner.scan), until a bound can reach neither the top N nor the first entry of a card (both widened by
what the simpler-first rule can move up): over thousands of offers only a few dozen are priced.

A setup is priced on one offer by ``price_setup`` (on demand and spot, services.planner.costs); the priced
entries are then ordered by the simpler-first rule (services.planner.simpler): cheapest first, except that a setup
with more GPUs, more nodes, spot or CPU offload ranks above a simpler one only when it is cheaper by more than
``constraints.prefer_simpler_within``; the pruning keeps every entry that tolerance could bring into the top N, and
prices what the notes name (``_exact_notes``).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Callable, Iterator

import numpy as np

from services.catalog.offers import Offer
from services.planner.constraints import Constraints
from services.planner.context import Candidate, Entry, PlanContext, PricedSetup, Setup
from services.planner.costs import RunCost, RunShape, run_cost
from services.planner.models import PricingMode
from services.planner.scan import CardBounds, EntryKey, Scan
from services.planner.simpler import SIMPLEST, Complexity, Ranked, complexity, ranking

CENT = 0.005
# The chain of entries the simpler-first rule moves up (8 GPUs spot -> 1 GPU spot -> 1 GPU on demand -> ...) that
# the pruning first assumes: it keeps entries up to kth / (1 - tolerance) ** this, then checks (rank_entries).
SIMPLER_CHAIN = 3
# How many entries left out ``_price_left`` puts in bound order at a time.
FEW = 8


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
    entry among its own, cheapest first: the first of its card's own ranking, with that ranking's notes. Other
    cards' setups do not hold it back, so it does not depend on what else the catalog sells (``best_per_gpu``; as the
    card's first in the whole ranking, a simpler setup of another card could hold back its cheapest one, which
    pricing part of the catalog could not see: a planner probe of stop 50).

    Entries are priced in bound order as far as ``_priced_entries`` needs, assuming a simpler-first chain of at most
    SIMPLER_CHAIN steps, then both answers are checked against what was left unpriced. An entry left out could change
    the top N only by being cheaper than one of it or by holding one back (a simpler entry within the tolerance of
    it), so where every entry of the top N costs less than ``1 - tolerance`` times the least bound left out, it is
    the top N of the whole ranking; a card's first likewise against the least bound left out of that card. Where a
    check fails (a longer chain: a planner probe of stop 49 found the first pick changing with ``top_n``), more is
    priced until it passes. Their notes are then made exact (``_exact_notes``)."""
    tolerance = ctx.constraints.prefer_simpler_within
    for chain in (SIMPLER_CHAIN, 2 * SIMPLER_CHAIN, None):
        priced = _priced_entries(ctx, scan, pricer, top_n, _widening(tolerance, chain))
        whole = ranking(priced.entries, tolerance, top_n)
        by_card: dict[str, list[Entry]] = {}
        for e in priced.entries:
            by_card.setdefault(e.candidate.spec.name, []).append(e)
        own = {card: ranking(mine, tolerance, 1) for card, mine in by_card.items()}
        settled = [(e, priced.left_out) for e in whole.shown]
        settled += [(r.shown[0], priced.card_left_out[card]) for card, r in own.items()]
        if all(b == math.inf or e.cost.expected_cost_usd + CENT < (1.0 - tolerance) * b for e, b in settled):
            break
    whole = _exact_notes(ctx, scan, pricer, priced, list(scan.bounds), whole, priced.entries, priced.left_out, top_n)
    for card, mine in by_card.items():
        if card in priced.extra:  # the whole ranking's notes priced more of the card
            mine = sorted([*mine, *priced.extra[card]], key=Entry.rank_key)
            own[card] = ranking(mine, tolerance, 1)
        own[card] = _exact_notes(ctx, scan, pricer, priced, [card], own[card], mine, priced.card_left_out[card], 1)
    return whole.shown, sorted((r.shown[0] for r in own.values()), key=Entry.rank_key)


def _exact_notes(
    ctx: PlanContext,
    scan: Scan,
    pricer: Pricer,
    priced: _Priced,
    cards: list[str],
    ranked: Ranked,
    entries: list[Entry],
    least: float,
    top_n: int,
) -> Ranked:
    """``ranked``, the first ``top_n`` of the ranking of ``entries`` (of ``cards``; ``least``: the least bound of
    theirs left unpriced), with its notes as the ranking of all their entries would have them.

    Notes can name entries left unpriced, whose bounds passed the limits though their full prices are lower than
    those of entries priced (billing rounding, checkpoints and rework fall differently), so they changed with
    ``top_n`` and with the offers around (a planner probe of stop 52): the cheapest simpler setup left below an
    entry, and the first setup without offload that an offload entry's caution compares it with. Where an entry left
    out could be either (``_unsettled``), those that could be are priced (``_price_left``, marked as priced, so each
    scope prices what the others did not) and the ranking is made again, until nothing is left that could. They are
    dearer than what the checks of ``rank_entries`` settled, so they change notes, never the order. The whole
    ranking's extra entries go into its cards' entries too: the cards come after it."""
    tolerance = ctx.constraints.prefer_simpler_within
    more = _unsettled(ctx, scan, pricer, priced, cards, ranked, least)
    while more:
        for e in more:
            priced.extra.setdefault(e.candidate.spec.name, []).append(e)
        entries = sorted([*entries, *more], key=Entry.rank_key)
        ranked = ranking(entries, tolerance, top_n)
        more = _unsettled(ctx, scan, pricer, priced, cards, ranked, least)
    return ranked


def _unsettled(
    ctx: PlanContext, scan: Scan, pricer: Pricer, priced: _Priced, cards: list[str], ranked: Ranked, least: float
) -> list[Entry]:
    """The entries of ``cards`` left unpriced (``least``: their least bound) that could change the notes of
    ``ranked``, priced: those simpler than a shown entry and as cheap as the simpler setup its note names, and where
    a shown entry offloads, those without offload that could rank before its caution's setup without offload
    (under its cost plus a cent over ``1 - tolerance``, the check of ``rank_entries``)."""
    if least == math.inf:
        return []  # nothing of them was left out
    tolerance = ctx.constraints.prefer_simpler_within
    out: list[Entry] = []
    for e, named in zip(ranked.shown, ranked.named, strict=True):
        key = complexity(e)
        if named >= least and key != SIMPLEST:
            named = min(named, _unpriced_twin_cost(ctx, scan, priced, e))
            out += _price_left(ctx, scan, pricer, priced, cards, _simpler_than(key), named, 1.0, 0.0)
    if any(e.candidate.cfg.cpu_offload for e in ranked.shown):
        reach = math.inf if tolerance >= 1.0 else 1.0 / (1.0 - tolerance)
        plain = math.inf if ranked.plain is None else (ranked.plain.cost.expected_cost_usd + CENT) * reach
        if plain >= least:
            out += _price_left(ctx, scan, pricer, priced, cards, _without_offload, plain, reach, CENT)
    return out


def _unpriced_twin_cost(ctx: PlanContext, scan: Scan, priced: _Priced, e: Entry) -> float:
    """For a spot entry, the cost of the same setup on demand where that entry is left unpriced and meets the
    constraints (infinity otherwise): a simpler entry left, so the note names one no dearer. It bounds the search of
    ``_price_left``, which otherwise, where no simpler entry was priced, goes over every simpler entry of the catalog
    (thousands at 50,000 offers: a measurement of stop 52)."""
    c = e.candidate
    if e.cost.pricing != "spot" or not qualifies(ctx.constraints, c.on_demand):
        return math.inf
    b = scan.bounds[c.spec.name]
    pairs = b.pairs
    on_demand = np.flatnonzero((b.offer[:pairs] == c.offer_index) & (b.position[:pairs] == _position(scan, c)))
    if not len(on_demand) or priced.popped[c.spec.name][on_demand[0]]:
        return math.inf
    if b.qualifies is not None and not b.qualifies[on_demand[0]]:
        return math.inf
    return c.on_demand.expected_cost_usd


def _position(scan: Scan, c: Candidate) -> int:
    """The position of a candidate's setup among its offer's setups (its bounds' ``position``)."""
    return scan.setups_of(c.offer_index).index(c.setup)


def _simpler_than(key: Complexity) -> Callable[[CardBounds, np.ndarray], np.ndarray]:
    """Which of the rows ``at`` of a card's bounds are simpler than complexity ``key`` (``is_simpler``)."""
    gpus, nodes, spot, offload = key

    def rows(b: CardBounds, at: np.ndarray) -> np.ndarray:
        g, n, s, o = b.gpus[at], b.nodes[at], b.spot[at], b.offload[at]
        no_more: np.ndarray = (g <= gpus) & (n <= nodes) & (s <= spot) & (o <= offload)
        simpler: np.ndarray = no_more & ((g < gpus) | (n < nodes) | (s < spot) | (o < offload))
        return simpler

    return rows


def _without_offload(b: CardBounds, at: np.ndarray) -> np.ndarray:
    plain: np.ndarray = ~b.offload[at]
    return plain


def _price_left(
    ctx: PlanContext,
    scan: Scan,
    pricer: Pricer,
    priced: _Priced,
    cards: list[str],
    selected: Callable[[CardBounds, np.ndarray], np.ndarray],
    limit: float,
    reach: float,
    slack: float,
) -> list[Entry]:
    """The entries of ``cards`` left unpriced that ``selected`` picks and that meet the constraints, priced in bound
    order while a bound is no more than ``limit``, which falls to ``(cost + slack) * reach`` of each one priced; each
    is marked as priced."""
    bounds: list[np.ndarray] = []
    where: list[tuple[str, np.ndarray]] = []
    for card in cards:
        if priced.card_left_out[card] > limit:
            continue  # every entry of the card left out has a larger bound
        b = scan.bounds[card]
        rows = np.flatnonzero(b.bound <= limit)  # the other tests on these rows alone
        chosen = selected(b, rows) & ~priced.popped[card][rows]
        if b.qualifies is not None:
            chosen &= b.qualifies[rows]  # priced as arrays: the others break the budget or the deadline
        rows = rows[chosen]
        if len(rows):
            bounds.append(b.bound[rows])
            where.append((card, rows))
    if not where:
        return []
    card_of = np.repeat(np.arange(len(where)), [len(rows) for _, rows in where])
    rows_of = np.concatenate([rows for _, rows in where])
    bound = np.concatenate(bounds)
    out: list[Entry] = []
    # In bound order, a few at a time: the first entry priced usually brings the limit below nearly all the others
    # (where no note named a cost, every simpler entry of the catalog is a candidate: thousands at 50,000 offers).
    while len(bound):
        few = np.argpartition(bound, FEW - 1)[:FEW] if len(bound) > FEW else np.arange(len(bound))
        few = few[np.argsort(bound[few], kind="stable")]
        for at in few.tolist():
            if bound[at] > limit:
                return out
            card, row = where[int(card_of[at])][0], int(rows_of[at])
            priced.popped[card][row] = True
            b = scan.bounds[card]
            c = pricer.candidate(int(b.offer[row]), int(b.position[row]))
            cost = c.spot if b.spot[row] else c.on_demand
            if cost is None or not qualifies(ctx.constraints, cost):
                continue
            out.append(Entry(c, cost))
            limit = min(limit, (cost.expected_cost_usd + slack) * reach)
        left = bound <= limit
        left[few] = False
        card_of, rows_of, bound = card_of[left], rows_of[left], bound[left]
    return out


@dataclasses.dataclass
class _Priced:
    """What ``_priced_entries`` priced: the entries that meet the constraints, in cost order; the least bound left
    unpriced (infinity: none), and per card the least bound of its own left unpriced; and per card the rows of its
    bounds taken (priced, or left out as breaking the budget or the deadline); then per card the entries
    ``_exact_notes`` priced besides."""

    entries: list[Entry]
    left_out: float
    card_left_out: dict[str, float]
    popped: dict[str, np.ndarray]
    extra: dict[str, list[Entry]] = dataclasses.field(default_factory=dict)


def _priced_entries(ctx: PlanContext, scan: Scan, pricer: Pricer, top_n: int, widen: float) -> _Priced:
    """The entries that meet the constraints among those priced in full, with what was left unpriced (``_Priced``).

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
    popped = {card: np.zeros(len(b.bound), dtype=bool) for card, b in scan.bounds.items()}
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
        popped[card][row] = True
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
    return _Priced(entries, left_out, {card: card_left_out.get(card, stopped) for card in scan.bounds}, popped)


def _widening(tolerance: float, chain: int | None) -> float:
    """How far past the N-th cheapest cost an entry may still be moved into the top N by the simpler-first rule
    in a chain of ``chain`` steps (None: any number)."""
    if tolerance >= 1.0 or chain is None:
        return math.inf
    return float((1.0 / (1.0 - tolerance)) ** chain)


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
