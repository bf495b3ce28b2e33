"""Scanning a catalog: its offers grouped by what their setups depend on, each group searched once, and every
pricing's cost bounded as arrays.

What fits and how fast depends on the card and the node shape, not on the price. Offers are grouped by what
their setups depend on (card, node size, whole nodes only, intra-node link kind, inter-node network, host RAM),
each group is searched once (services.planner.search), and every (offer, setup, pricing) of a card gets a lower
bound of its expected cost in one array pass: start-up, model download and training at the hourly price (the
full cost only adds checkpoints, rework and billing rounding). With a budget or a deadline, every full price is
computed in the same pass. services.planner.ranking then prices entries in order of that bound.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from services.catalog.gpus import GpuSpec, exact_gpu_names, find_gpu, gpu_name_key
from services.catalog.market import Market, as_market
from services.catalog.offers import Offer
from services.estimator.communication import intra_node_kind
from services.estimator.errors import EstimatorError
from services.planner.context import HostRamBlocked, PlanContext, Setup, ShapeKey
from services.planner.costs import OfferColumns, RunShape, offer_columns, run_costs
from services.planner.models import Rejection
from services.planner.rejections import filter_rejection, lacks_precision, precision_rejection
from services.planner.search import offer_search, settled_setups, shape_key
from services.planner.spot import spot_risk

# Entries of a card put in rank order at first (then four times as many each time more are needed): the ranking
# visits a card's entries only until its first one left out, a handful over thousands of offers.
FIRST_CHUNK = 64
# What decides an offer's setups (services.planner.search.offer_search reads nothing else of it), as written.
# The card as written with its interconnect (which decide the card and its link kind), and the node shape.
_CARD = ("gpu", "interconnect")
_NODE = ("gpus_per_node", "whole_nodes_only", "inter_node_gbit_per_s", "host_ram_gib_per_node")
# What the provider and region constraints read of an offer (services.planner.rejections.filter_rejection).
_PLACE = ("provider", "region", "country")
# What a plan over its CPU budget is told (services.estimator.budget): the scan checks it between groups.
NARROW_SEARCH = (
    "narrow the search: fewer GPUs (constraints.max_gpus), or fewer offers (constraints.providers, constraints.regions)"
)
# An entry in rank order: lower bound, GPUs, nodes, seconds, offer index, setup position, spot (on demand first).
EntryKey = tuple[float, int, int, float, int, int, bool]


@dataclass(slots=True)
class OfferGroup:
    """The offers of one layout (card, node size, whole nodes only, intra-node link kind, network, host RAM), or of
    one node shape (the same but network and host RAM) where those do not change the search: one search gives all
    of them the same setups, or the same ones their host RAM cannot hold."""

    spec: GpuSpec
    indices: np.ndarray  # the offers' positions in the catalog, ascending
    first: int  # the first of them (the group's searches read its offer)
    shape: ShapeKey | None = None  # the search's key of its node shape (services.planner.search.shape_key)
    # Set by the scan: the setups its search keeps, or those its host RAM cannot hold where it keeps none (a plan
    # builds thousands of groups, so the empty ones share one tuple).
    setups: Sequence[Setup] = ()
    ram_blocked: Sequence[HostRamBlocked] = ()


@dataclass
class CardBounds:
    """Every (offer, setup, pricing) of one card with the lower bound of its cost, as arrays (unordered): first
    each (offer, setup) on demand, then on spot those with a spot price (``spot_pair``: which pair each is)."""

    bound: np.ndarray
    gpus: np.ndarray
    nodes: np.ndarray
    seconds: np.ndarray
    offer: np.ndarray
    position: np.ndarray  # of the setup among the offer's setups
    spot: np.ndarray
    offload: np.ndarray  # whether the setup offloads to CPU memory
    spot_pair: np.ndarray
    # With a budget or a deadline: each entry's full expected cost and hours, and whether it meets both.
    cost: np.ndarray | None = None
    hours: np.ndarray | None = None
    qualifies: np.ndarray | None = None

    @property
    def pairs(self) -> int:
        return len(self.bound) - len(self.spot_pair)

    def in_rank_order(self, first: int = FIRST_CHUNK) -> Iterator[tuple[EntryKey, int]]:
        """(key, row) of the entries in rank order, sorted a chunk at a time: the ``first`` lowest bounds (with
        every tie of the last), then four times as many, and so on."""
        rest = np.arange(len(self.bound))
        size = first
        keys = (self.spot, self.position, self.offer, self.seconds, self.nodes, self.gpus, self.bound)
        while len(rest):
            if len(rest) > size:
                values = self.bound[rest]
                cut = np.partition(values, size - 1)[size - 1]
                low = values <= cut
                chunk, rest = rest[low], rest[~low]
            else:
                chunk, rest = rest, rest[:0]
            chunk = chunk[np.lexsort(tuple(k[chunk] for k in keys))]
            yield from zip(zip(*(k[chunk].tolist() for k in reversed(keys)), strict=True), chunk.tolist(), strict=True)
            size *= 4


@dataclass
class Scan:
    """One pass over the catalog: what was filtered out, the cards seen, the offers grouped by layout, and the
    lower bounds of every pricing per card."""

    offers: Market
    rejections: list[Rejection] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    cards: dict[str, GpuSpec] = field(default_factory=dict)  # in order of their first offer
    fitting_cards: set[str] = field(default_factory=set)
    groups: list[OfferGroup] = field(default_factory=list)  # in order of their first offer
    # Per offer, the position in ``groups`` of its group where it has fitting setups, else -1.
    fitting_group: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    bounds: dict[str, CardBounds] = field(default_factory=dict)

    def setups_of(self, index: int) -> Sequence[Setup]:
        return self.groups[int(self.fitting_group[index])].setups

    def card_offers(self, name: str) -> list[Offer]:
        """The offers of a card, in catalog order."""
        of_card = [g.indices for g in self.groups if g.spec.name == name]
        return [self.offers[i] for i in np.sort(np.concatenate(of_card)).tolist()]

    def fitting_offers(self) -> np.ndarray:
        """The offers with fitting setups, ascending."""
        return np.flatnonzero(self.fitting_group >= 0)

    def ram_blocked_groups(self) -> list[OfferGroup]:
        """Groups with no setup because their nodes' host RAM cannot hold the offloaded states."""
        return [g for g in self.groups if g.ram_blocked]


class _CardNames:
    """``find_gpu`` for the card names of one catalog, each name matched once: the exact pass from one table of the
    cards' normalised names (services.catalog.gpus.exact_gpu_names), the forgiving pass for the names it misses."""

    def __init__(self, specs: tuple[GpuSpec, ...]) -> None:
        self.specs = specs
        self.exact = exact_gpu_names(specs)
        self.found: dict[str, GpuSpec | EstimatorError] = {}

    def find(self, name: str) -> GpuSpec | EstimatorError:
        """The card ``name`` means, or the error ``find_gpu`` raises for it."""
        found = self.found.get(name)
        if found is None:
            found = self.exact.get(gpu_name_key(name))
            if found is None:
                try:
                    found = find_gpu(name, self.specs)
                except EstimatorError as exc:
                    found = exc
            self.found[name] = found
        return found


def _allowed(ctx: PlanContext, scan: Scan) -> np.ndarray | None:
    """The offers the provider and region constraints allow (None: all), each excluded one with its rejection."""
    c = ctx.constraints
    if not (c.providers or c.regions):
        return None
    ids, places = scan.offers.codes(_PLACE)
    firsts = _firsts(ids, len(places)).tolist()
    verdicts = np.array([filter_rejection(c, scan.offers[first]) is None for first in firsts])
    ok = verdicts[ids] if len(ids) else np.zeros(0, dtype=bool)
    for index in np.flatnonzero(~ok).tolist():
        scan.rejections.append(filter_rejection(c, scan.offers[index]))  # type: ignore[arg-type]
    return np.flatnonzero(ok)


def _firsts(ids: np.ndarray, count: int) -> np.ndarray:
    """Per code below ``count``, the position of its first occurrence in ``ids`` (``len(ids)`` where it has none)."""
    first = np.full(count, len(ids), dtype=np.int64)
    np.minimum.at(first, ids, np.arange(len(ids)))
    return first


@dataclass(frozen=True)
class _Grouping:
    """How offers group by card and node shape, read of the offers and the GPU specs alone (no plan): over a whole
    price list it is kept with it (``Market.derived``), and each plan drops the cards it cannot run. Immutable:
    plans share its arrays."""

    position: np.ndarray  # the offers grouped (the catalog's, or those the constraints allow), ascending
    pair_ids: np.ndarray  # per offer grouped, the code of its (card as written, interconnect)
    found: dict[int, GpuSpec | EstimatorError]  # per code present, the card it names, or why none
    card_of_pair: np.ndarray  # per code, its (card, link kind) among ``card_specs`` (-1: no card)
    card_specs: tuple[GpuSpec, ...]
    # Per node shape (card, link kind, node size, whole nodes only), in order of its first offer: its (card, link
    # kind), its offers, the first of them, and per layout (adding the network and the host RAM) in order of its
    # first offer, the same two.
    shapes: tuple[tuple[int, np.ndarray, int, tuple[tuple[np.ndarray, int], ...]], ...]


def _grouping(offers: Market, specs: tuple[GpuSpec, ...], kept: np.ndarray | None) -> _Grouping:
    """The offers (``kept``: those the constraints allow; None: all) grouped by node shape and layout."""
    pair_ids, pairs = offers.codes(_CARD)
    rest_ids, rests = offers.codes(_NODE)
    position = np.arange(len(offers)) if kept is None else kept
    if kept is not None:
        pair_ids, rest_ids = pair_ids[kept], rest_ids[kept]
    present = np.zeros(len(pairs), dtype=bool)
    present[pair_ids] = True
    names = _CardNames(specs)
    cards: dict[tuple[str, str], int] = {}
    card_of_pair = np.full(len(pairs), -1, dtype=np.int64)
    found: dict[int, GpuSpec | EstimatorError] = {}
    card_specs: list[GpuSpec] = []
    for pair in np.flatnonzero(present).tolist():
        gpu, interconnect = pairs[pair]
        spec = found[pair] = names.find(gpu)  # type: ignore[arg-type]
        if isinstance(spec, EstimatorError):
            continue
        card_of_pair[pair] = cards.setdefault((spec.name, intra_node_kind(spec, interconnect)), len(cards))  # type: ignore[arg-type]
        if card_of_pair[pair] == len(card_specs):
            card_specs.append(spec)
    card_of = card_of_pair[pair_ids]
    # A layout is a (card, link kind) with a node shape, network and host RAM: one code per pair of them; a shape is
    # the same with only the node size and whether whole nodes only (what the single-node search reads).
    ok = card_of >= 0
    members, card_of, rest_ids = position[ok], card_of[ok], rest_ids[ok]
    members.flags.writeable = False  # the groups' offers are views of it, shared by every plan
    shape_codes: dict[tuple[object, ...], int] = {}
    shape_of_rest = np.array([shape_codes.setdefault(rest[:2], len(shape_codes)) for rest in rests], dtype=np.int64)
    shape_of_offer = card_of * len(shape_codes) + shape_of_rest[rest_ids]
    layout_of_offer = card_of * len(rests) + rest_ids
    shapes, shape_members, shape_firsts = _in_groups(shape_of_offer, len(card_specs) * len(shape_codes), members)
    layouts, layout_members, layout_firsts = _in_groups(layout_of_offer, len(card_specs) * len(rests), members)
    # Each shape's layouts (positions among ``layouts``, in order of their first offer).
    shape_of_layout = (layouts // len(rests)) * len(shape_codes) + shape_of_rest[layouts % len(rests)]
    order = np.argsort(shape_of_layout, kind="stable")
    ranked = shape_of_layout[order]
    starts = np.searchsorted(ranked, shapes, "left").tolist()
    ends = np.searchsorted(ranked, shapes, "right").tolist()
    order_list = order.tolist()
    shape_rows = zip(shapes.tolist(), shape_members, shape_firsts, starts, ends, strict=True)
    return _Grouping(
        position,
        pair_ids,
        found,
        card_of_pair,
        tuple(card_specs),
        tuple(
            (
                code // len(shape_codes),
                indices,
                first,
                tuple((layout_members[i], layout_firsts[i]) for i in order_list[start:end]),
            )
            for code, indices, first, start, end in shape_rows
        ),
    )


def _group_offers(
    ctx: PlanContext, scan: Scan, specs: tuple[GpuSpec, ...]
) -> list[tuple[OfferGroup, Callable[[], list[OfferGroup]]]]:
    """Reject the offers of unknown cards and of cards without the plan's precision, and group the others by node
    shape (card, link kind, node size, whole nodes only), each with its offers grouped by layout (adding the network
    and the host RAM) on request; shapes, their layouts and the cards in order of their first offer."""
    kept = _allowed(ctx, scan)
    if kept is None:  # the whole price list: grouped once for every plan over it
        grouping = scan.offers.derived(("offer grouping", specs), lambda: _grouping(scan.offers, specs, None))
    else:
        grouping = _grouping(scan.offers, specs, kept)
    # Per (card, link kind), whether the plan leaves its offers out (last: an unknown card, code -1).
    lacking = np.array([*(lacks_precision(ctx.plan, spec) for spec in grouping.card_specs), True])
    rejected = lacking[grouping.card_of_pair]  # per (card as written, interconnect)
    out = rejected[grouping.pair_ids]
    if out.any():
        why = {pair: spec for pair, spec in grouping.found.items() if rejected[pair]}
        _reject_cards(ctx, scan, grouping.position[out], grouping.pair_ids[out], why)
    found: list[tuple[OfferGroup, Callable[[], list[OfferGroup]]]] = []
    for card, indices, first, layouts in grouping.shapes:
        if lacking[card]:
            continue
        spec = grouping.card_specs[card]
        found.append((OfferGroup(spec, indices, first), functools.partial(_layout_groups, spec, layouts)))
        scan.cards.setdefault(spec.name, spec)  # cards in order of their first offer
    return found


def _layout_groups(spec: GpuSpec, layouts: tuple[tuple[np.ndarray, int], ...]) -> list[OfferGroup]:
    """A shape's layouts as groups: made only for the shapes whose search reads the network or the host RAM."""
    return [OfferGroup(spec, indices, first) for indices, first in layouts]


def _in_groups(codes: np.ndarray, count: int, members: np.ndarray) -> tuple[np.ndarray, list[np.ndarray], list[int]]:
    """``members`` grouped by their ``codes`` (each below ``count``): the codes present, in order of their first
    member, each one's members in order, and each one's first member. Codes are small integers, so first members
    and membership come from dense tables and a radix sort."""
    first = _firsts(codes, count)
    present = np.flatnonzero(first < len(codes))
    present = present[np.argsort(first[present])]
    rank = np.zeros(count, dtype=np.int16 if len(present) <= np.iinfo(np.int16).max else np.int64)
    rank[present] = np.arange(len(present))
    group_of = rank[codes]
    ends = np.cumsum(np.bincount(group_of, minlength=len(present))).tolist()
    starts = [0, *ends[:-1]] if ends else []
    ordered = members[np.argsort(group_of, kind="stable")]  # a radix sort for 16-bit codes
    ordered.flags.writeable = False  # the groups are views of it
    groups = [ordered[start:end] for start, end in zip(starts, ends, strict=True)]
    return present, groups, ordered[starts].tolist()


def _reject_cards(
    ctx: PlanContext, scan: Scan, indices: np.ndarray, pairs: np.ndarray, why: dict[int, GpuSpec | EstimatorError]
) -> None:
    """A rejection for each offer (``indices``, with the code of its card as written, ``pairs``) of an unknown card
    (with a warning) or of a card without the plan's precision (one per card and provider, shared by its offers).
    The planner sorts the rejections by kind, card and provider, so unknown cards can come first."""
    codes = range(int(pairs.max()) + 1)
    unknown = np.array([isinstance(why.get(pair), EstimatorError) for pair in codes])[pairs]
    for index, pair in zip(indices[unknown].tolist(), pairs[unknown].tolist(), strict=True):
        o, error = scan.offers[index], why[pair]
        assert isinstance(error, EstimatorError)
        scan.rejections.append(Rejection(gpu=o.gpu, provider=o.provider, kind="unknown_gpu", reason=error.message))
        scan.warnings.append(f"offer {o.provider} / {o.gpu}: {error.message}")
    indices, pairs = indices[~unknown], pairs[~unknown]
    if not len(indices):
        return
    # One rejection per card (as matched, whatever its interconnect) and provider.
    card_codes: dict[str, int] = {}
    card = np.array([card_codes.setdefault(getattr(why.get(pair), "name", ""), len(card_codes)) for pair in codes])
    providers = scan.offers.codes(("provider",))[0][indices]
    _, first, inverse = np.unique(card[pairs] * (int(providers.max()) + 1) + providers, True, True)
    # One rejection per card, copied for each other provider: only the provider differs.
    per_card: dict[str, Rejection] = {}
    found = []
    for pair, index in zip(pairs[first].tolist(), indices[first].tolist(), strict=True):
        spec, offer = why[pair], scan.offers[index]
        assert isinstance(spec, GpuSpec)  # the unknown cards are rejected above
        rejection = per_card.get(spec.name)
        if rejection is None:
            made = precision_rejection(ctx.plan, spec, offer)
            assert made is not None  # only cards without the plan's precision come here
            rejection = per_card[spec.name] = made
        elif rejection.provider != offer.provider:
            rejection = rejection.model_copy(update={"provider": offer.provider})
        found.append(rejection)
    scan.rejections.extend(map(found.__getitem__, inverse.reshape(-1).tolist()))


def scan_offers(ctx: PlanContext, offers: Sequence[Offer], specs: tuple[GpuSpec, ...]) -> Scan:
    """Filter the offers, match their cards, group them by layout, search each layout once, and bound each
    pricing's cost as arrays over the offers."""
    scan = Scan(as_market(offers))
    offers = scan.offers
    if ctx.constraints.deadline_hours is not None and len(offers):
        # The offer slowest to start bounds every offer's non-training hours (enough.meets_deadline).
        columns = offer_columns(offers, np.arange(len(offers)), ctx.sizes.model_download_bytes, False)
        ctx.memo.slowest_start = slowest = offers[int(np.argmax(columns.startup_s + columns.download_s))]
        if ctx.constraints.spot_allowed:
            ctx.memo.spot_risks = _spot_risks(offers, columns.spot_usd_per_hour, slowest)
    for shape, layouts in _group_offers(ctx, scan, specs):
        shape.shape = shape_key(ctx, shape.spec, offers[shape.first])
        # Where one node of the shape is enough without offload, no offer's network or host RAM changes its setups.
        shape.setups = settled_setups(ctx, offers[shape.first], shape.spec, shape.shape) or ()
        if shape.setups:
            scan.groups.append(shape)
            continue
        for group in layouts():
            group.shape = shape.shape
            scan.groups.append(group)
    scan.groups.sort(key=operator.attrgetter("first"))  # in order of their first offer
    scan.fitting_group = np.full(len(offers), -1, dtype=np.int64)
    fitting: list[int] = []
    for position, group in enumerate(scan.groups):
        # Between groups: one group's search, its walks over node counts included, is a few steps of a bounded size.
        ctx.budget.check("constraints", NARROW_SEARCH)
        if not group.setups:
            assert group.shape is not None  # set above for every group searched here
            group.setups, blocked = offer_search(ctx, offers[group.first], group.spec, group.shape)
            group.ram_blocked = () if group.setups else blocked
        if group.setups:
            scan.fitting_cards.add(group.spec.name)
            fitting.append(position)
    if fitting:
        members = [scan.groups[position].indices for position in fitting]
        scan.fitting_group[np.concatenate(members)] = np.repeat(fitting, [len(m) for m in members])
    scan.bounds = _bounds(ctx, scan)
    return scan


def _spot_risks(offers: Market, spot_usd_per_hour: np.ndarray, slowest: Offer) -> tuple[Offer, ...]:
    """With a deadline and spot allowed: one offer with a spot price per spot risk of the catalog (its provider's
    sourced figures, or its own preemption rate), starting as slowly as ``slowest``, on which a setup's spot run must
    meet the deadline too for more nodes to be pointless (enough.meets_deadline)."""
    ids, distinct = offers.codes(("provider", "preemption_per_hour"))
    spot_rows = np.flatnonzero(~np.isnan(spot_usd_per_hour))
    firsts = _firsts(ids[spot_rows], len(distinct))  # per provider and rate, its first offer with a spot price
    risks: dict[tuple[int, float | None], Offer] = {}
    for first in firsts[firsts < len(spot_rows)].tolist():
        offer = offers[int(spot_rows[first])]
        key = (id(spot_risk(offer.provider)), offer.preemption_per_hour)
        if key not in risks:
            risks[key] = replace(offer, startup_s=slowest.startup_s, download_gbit_per_s=slowest.download_gbit_per_s)
    return tuple(risks.values())


def _bounds(ctx: PlanContext, scan: Scan) -> dict[str, CardBounds]:
    """Per card, start-up, model download and training at the hourly price for every offer, setup and pricing,
    in one vector pass; with a budget or a deadline, also every full price (costs.run_costs)."""
    members = scan.fitting_offers()
    if not len(members):
        return {}
    row_of = np.full(len(scan.offers), -1, dtype=np.int64)
    row_of[members] = np.arange(len(members))
    c = ctx.constraints
    full = c.budget_usd is not None or c.deadline_hours is not None
    columns = offer_columns(scan.offers, members, ctx.sizes.model_download_bytes, full)
    spot_price = columns.spot_usd_per_hour if c.spot_allowed else np.full(len(members), np.nan)
    fixed = columns.startup_s + columns.download_s  # costs.startup_seconds + costs.download_seconds
    per_card: dict[str, list[OfferGroup]] = {}
    for g in scan.groups:
        if g.setups:
            per_card.setdefault(g.spec.name, []).append(g)
    out = {}
    for name, groups in per_card.items():
        pair_offer: list[np.ndarray] = []
        # Per (group, setup): training s, GPUs, nodes, position, offload.
        rows: list[tuple[float, int, int, int, bool]] = []
        counts: list[int] = []
        for group in groups:
            for position, s in enumerate(group.setups):
                pair_offer.append(group.indices)
                rows.append((s.training_s, s.layout.gpus, s.layout.nodes, position, s.cfg.cpu_offload))
                counts.append(len(group.indices))
        index = np.concatenate(pair_offer)
        row = row_of[index]
        repeats = np.array(counts)
        training, gpus, nodes, positions, offload = (np.array(v).repeat(repeats) for v in zip(*rows, strict=True))
        seconds = training + fixed[row]
        spot_rate = spot_price[row]
        has = ~np.isnan(spot_rate)
        spot_pair = np.flatnonzero(has)
        # Every pair on demand, then those with a spot price on spot: one take per column.
        take = np.concatenate((np.arange(len(index)), spot_pair))
        rate = np.concatenate((columns.on_demand_usd_per_hour[row], spot_rate[spot_pair]))
        entry_seconds, entry_gpus = seconds[take], gpus[take]
        bounds = CardBounds(
            bound=entry_seconds * entry_gpus * rate / 3600.0,
            gpus=entry_gpus,
            nodes=nodes[take],
            seconds=entry_seconds,
            offer=index[take],
            position=positions[take],
            spot=np.arange(len(take)) >= len(index),
            offload=offload[take],
            spot_pair=spot_pair,
        )
        if full:
            _full_prices(ctx, bounds, columns.take(row), gpus, nodes, training, has)
        out[name] = bounds
    return out


def _full_prices(
    ctx: PlanContext,
    bounds: CardBounds,
    columns: OfferColumns,
    gpus: np.ndarray,
    nodes: np.ndarray,
    training: np.ndarray,
    has: np.ndarray,
) -> None:
    """Every entry's expected cost and hours as ``price_setup`` prices it, and whether it meets the budget and
    the deadline (``qualifies``)."""
    c = ctx.constraints
    sizes = ctx.sizes
    shape = RunShape(
        0,
        1,
        0.0,
        sizes.model_download_bytes,
        sizes.checkpoint_bytes,
        sizes.final_upload_bytes,
        sizes.checkpoint_write_s,
    )
    restart_s = c.restart_s
    cost, hours = run_costs(columns, gpus, nodes, training, shape, "on_demand", restart_s=restart_s)
    if has.any():
        spot_cost, spot_hours = run_costs(
            columns.take(has),
            gpus[has],
            nodes[has],
            training[has],
            shape,
            "spot",
            preemptions_per_node_hour=c.preemptions_per_hour,
            restart_s=restart_s,
        )
        cost, hours = np.concatenate((cost, spot_cost)), np.concatenate((hours, spot_hours))
    bounds.cost, bounds.hours, bounds.qualifies = cost, hours, c.meets_budget(cost) & c.meets_deadline(hours)
