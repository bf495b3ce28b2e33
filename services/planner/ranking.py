"""Ranking a catalog: every offer's fitting setups, priced in order of a lower bound of their cost.

What fits and how fast depends on the card and the node shape, not on the price, so the setups come from
the shape cache (services.planner.search). Each (offer, setup, pricing) gets a lower bound of its
expected cost: start-up, model download and training at the hourly price (the full cost only adds
checkpoints, rework and billing rounding). Entries are priced in full in increasing order of that bound
(a heap: only the cheapest few are taken out), until a bound can reach neither the top N nor the best
of a card that still has none: over thousands of offers only a few dozen are priced.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

from services.catalog.gpus import GpuSpec, find_gpu
from services.catalog.offers import Offer
from services.estimator.errors import EstimatorError
from services.planner.context import Candidate, Entry, PlanContext, RamBlocked, Setup
from services.planner.costs import download_seconds, startup_seconds
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
    while bounds:
        bound, _, _, _, index, _, s, pricing = heapq.heappop(bounds)
        kth = -top[0] if len(top) >= top_n else math.inf
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
    return entries, qualified


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
