"""One exact setup, priced as the planner prices it: a card, a GPU count (and nodes), a pricing, over given offers.

The planner's search keeps only the GPU counts worth ranking (1, 2, 4, 8, ... and whole nodes) and stops
adding nodes once one fits; a quote asks for a setup the user picked, which may be any count an offer can
be rented in. This prices that layout with the planner's own context, configuration search and cost model
(services.planner.planner.plan_context, services.planner.search), so a setup the plan ranked is priced to
the cent as the plan priced it, and any other count that fits is priced the same way.

Rentable counts (Offer schema v2, services.planner.layouts): an offer sold per GPU runs 1 to
``gpus_per_node`` GPUs on one node; one sold as whole nodes runs whole nodes only; more GPUs than a node
means whole nodes over the provider's network, impossible without one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import NamedTuple

from services.catalog.gpus import GpuSpec, find_gpu, gpu_specs
from services.catalog.offers import Offer
from services.estimator.errors import EstimatorError
from services.estimator.memory import GIB
from services.estimator.plan import Plan
from services.planner.constraints import Constraints
from services.planner.context import Entry, PlanContext
from services.planner.errors import PlannerError
from services.planner.host_ram import host_ram_fits
from services.planner.layouts import Layout
from services.planner.models import PricingMode, Recommendation
from services.planner.planner import _assumptions, _recommendation, plan_context
from services.planner.ranking import price_setup
from services.planner.rejections import precision_rejection
from services.planner.search import layout_setups


def offer_layout(offer: Offer, gpus: int) -> Layout | None:
    """The layout ``gpus`` GPUs of ``offer`` are rented in, or None where the offer cannot be rented so."""
    if not offer.rents(gpus):
        return None
    per_node = max(1, offer.gpus_per_node)
    return Layout(gpus, 1) if gpus <= per_node and not offer.whole_nodes_only else Layout(per_node, gpus // per_node)


def nearest_counts(offer: Offer, gpus: int) -> tuple[int, ...]:
    """The rentable GPU counts of ``offer`` nearest below and above ``gpus`` (one or two of them)."""
    per_node = max(1, offer.gpus_per_node)
    below = [n for n in range(gpus - 1, 0, -1) if offer_layout(offer, n) is not None][:1]
    # A rentable count above is at most a node away (the next whole node), where there is one.
    above = [n for n in range(gpus + 1, gpus + per_node + 1) if offer_layout(offer, n) is not None][:1]
    return (*below, *above)


def _count_problem(card: str, gpus: int, offers: Sequence[Offer]) -> PlannerError:
    counts = sorted({n for o in offers for n in nearest_counts(o, gpus)}, key=lambda n: (abs(n - gpus), n))
    shapes = "; ".join(
        sorted(
            {
                f"{o.provider} rents "
                + (f"whole nodes of {o.gpus_per_node}" if o.whole_nodes_only else f"up to {o.gpus_per_node} per node")
                + ("" if o.inter_node_gbit_per_s is not None else ", one node at most")
                for o in offers
            }
        )
    )
    nearest = " or ".join(str(n) for n in sorted(counts[:2])) if counts else "none"
    return PlannerError(
        "gpus",
        f"gpus: {gpus} x {card} cannot be rented ({shapes}); the nearest counts are {nearest}",
    )


class ExactSetup(NamedTuple):
    """A priced exact setup: the recommendation, the planner's assumptions, and the offer it rents (where offers of one
    provider, card, region and node size differ in billing or source, the one priced, not the first that matches)."""

    recommendation: Recommendation
    assumptions: list[str]
    offer: Offer


def price_exact_setup(
    plan: Plan,
    offers: Sequence[Offer],
    gpu: str | None,
    gpus: int,
    pricing: PricingMode,
    constraints: Constraints,
    *,
    nodes: int | None = None,
    specs: tuple[GpuSpec, ...] | None = None,
    utilisation: Mapping[str, tuple[float, str]] | None = None,
    now: datetime | None = None,
) -> ExactSetup:
    """The setup ``gpus`` x ``gpu`` (None: any card) under ``pricing`` on the cheapest of ``offers`` that rents that
    many (ties to the first), in the fastest configuration that fits, priced as the planner prices it.

    Raises :class:`PlannerError` naming the field: ``gpu`` (no offer of the card, or the card cannot run the
    plan's precision), ``gpus`` (no offer rents that count: the nearest counts are named; or nothing fits
    that many), ``nodes`` (the count runs on another number of nodes), ``spot`` (no spot price).
    """
    specs = specs if specs is not None else gpu_specs()
    if pricing == "spot" and not constraints.spot_allowed:
        raise PlannerError("spot", "spot: the plan does not allow spot prices (constraints.spot_allowed)")
    _, ctx = plan_context(plan, constraints, utilisation)
    if gpu is not None:
        spec = find_gpu(gpu, specs)
        best = _best_on_card(ctx, spec, [o for o in offers if _card_of(o, specs) == spec.name], gpus, pricing, nodes)
    else:
        found: list[Entry] = []
        for card in dict.fromkeys(c for o in offers if (c := _card_of(o, specs)) is not None):
            spec = find_gpu(card, specs)
            try:
                found.append(
                    _best_on_card(ctx, spec, [o for o in offers if _card_of(o, specs) == card], gpus, pricing, nodes)
                )
            except PlannerError:
                continue
        if not found:
            raise PlannerError(
                "gpus", f"gpus: no card fits the job on {gpus} GPUs{' with a spot price' if pricing == 'spot' else ''}"
            )
        best = min(found, key=lambda e: e.rank_key()[:5])  # the planner's order; equals: the card met first
    return ExactSetup(_recommendation(ctx, best, now), _assumptions(ctx), best.candidate.offer)


def _best_on_card(
    ctx: PlanContext, spec: GpuSpec, card_offers: list[Offer], gpus: int, pricing: PricingMode, nodes: int | None
) -> Entry:
    if not card_offers:
        raise PlannerError("gpu", f"gpu: no offer for {spec.name} in the catalog (within the plan's constraints)")
    rentable = [(o, layout) for o in card_offers if (layout := offer_layout(o, gpus)) is not None]
    if not rentable:
        raise _count_problem(spec.name, gpus, card_offers)
    if nodes is not None:
        on_nodes = [(o, layout) for o, layout in rentable if layout.nodes == nodes]
        if not on_nodes:
            runs_on = sorted({layout.nodes for _, layout in rentable})
            raise PlannerError(
                "nodes",
                f"nodes: {gpus} x {spec.name} runs on {' or '.join(map(str, runs_on))} node(s), not {nodes}",
            )
        rentable = on_nodes
    if pricing == "spot":
        rentable = [(o, layout) for o, layout in rentable if o.spot_usd_per_hour is not None]
        if not rentable:
            # Named by provider where few are left: "no offer has one" read as none in the catalog (a quote probe).
            providers = sorted({o.provider for o in card_offers})
            among = f" of {', '.join(providers)}" if len(providers) <= 3 else ""
            raise PlannerError("spot", f"spot: no offer{among} has a spot price for {gpus} x {spec.name}")
    unsupported = precision_rejection(ctx.plan, spec, rentable[0][0])
    if unsupported is not None:
        raise PlannerError("gpu", f"gpu: {unsupported.reason}")
    best: Entry | None = None
    ram_short: float | None = None
    for offer, layout in rentable:
        setups = layout_setups(ctx, spec, layout, ctx.links(spec, offer, layout), offload=True)
        kept = [s for s in setups if host_ram_fits(ctx, offer, s)]
        if setups and not kept:
            ram_short = min(s.host_ram_bytes_per_node for s in setups) / GIB
        if not kept:
            continue
        # The fastest configuration, first of equals: the one the planner keeps per GPU count.
        fastest = min(kept, key=lambda s: s.training_s)
        candidate = price_setup(ctx, card_offers.index(offer), offer, fastest)
        cost = candidate.on_demand if pricing == "on_demand" else candidate.spot
        if cost is not None and (best is None or Entry(candidate, cost).rank_key() < best.rank_key()):
            best = Entry(candidate, cost)  # the planner's order (Entry.rank_key), first of equals
    if best is not None:
        return best
    if ram_short is not None:
        raise PlannerError(
            "gpus",
            f"gpus: {gpus} x {spec.name} fits only with CPU offload, which needs about {ram_short:,.0f} GiB of "
            "host RAM per node, more than the nodes have",
        )
    raise PlannerError(
        "gpus", f"gpus: the job does not fit on {gpus} x {spec.name} (see the plan's rejections for what it needs)"
    )


def _card_of(offer: Offer, specs: tuple[GpuSpec, ...]) -> str | None:
    """The card name of an offer, or None for a card the specs do not know."""
    try:
        return find_gpu(offer.gpu, specs).name
    except EstimatorError:
        return None
