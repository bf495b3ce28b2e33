"""Quotes: the setup the user picked (card, GPU count, nodes, provider, pricing), priced as the plan prices it,
issued once as a document addressed to the customer."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from services.catalog.gpus import find_gpu, gpu_name_key
from services.catalog.offers import Offer
from services.catalog.service import catalog_offers
from services.core.db import once_more_if_raced, utcnow
from services.core.errors import Conflict, NotFound, Unprocessable
from services.core.idempotency import idempotency_key as checked_idempotency_key
from services.core.money import usd
from services.core.pages import keyset_page
from services.estimator.errors import EstimatorError
from services.estimator.estimate import resolve_architecture
from services.estimator.plan import Plan
from services.nodes.calibration import calibrated_utilisation
from services.orgs.service import Principal
from services.planner.constraints import Constraints
from services.planner.exact import nearest_counts, offer_layout, price_exact_setup
from services.planner.models import PricingMode, Recommendation
from services.planner.spot import checkpoint_bytes
from services.plans.schemas import PlanRequest
from services.plans.service import get_plan, resolved_plan
from services.quotes.document import gib
from services.quotes.schemas import Customer, LineItem, PriceList, QuoteOut, QuoteRequest
from services.quotes.tables import QuoteRow

# Object storage for checkpoints, per GB-month: the S3 Standard list price (us-east-1), used as the
# default when the provider's own storage price is not in the catalog.
STORAGE_USD_PER_GB_MONTH = 0.023

# The planner's cost_breakdown keys, in the order the document lists them, and what each line is.
BREAKDOWN_LINES = (
    ("compute", "training"),
    ("startup", "start-up (provisioning and boot)"),
    ("model_download", "base model download"),
    ("checkpoint_writes", "checkpoint writes and final upload"),
    ("preemption_rework", "expected preemption rework (restarts and lost work)"),
    ("billing_rounding", "billing increment and minimum"),
    ("on_demand_fallback", "expected on-demand finish where spot capacity does not come back (on-demand excess)"),
)
# Per-GPU prices closer than this (USD per GPU-hour) are the same price: the plan stores them to 4 decimals.
PRICE_TOLERANCE_USD = 0.0001
# The currency quotes are issued in: every price list row is USD (services.catalog.pricelist refuses others).
QUOTE_CURRENCY = "USD"


def create_quote(
    session: Session,
    principal: Principal,
    plan_id: str,
    request: QuoteRequest,
    safety_margin: float,
    validity_days: int = 14,
    now: datetime | None = None,
    idempotency_key: str | None = None,
) -> QuoteRow:
    """Quote the setup ``request`` names on a done plan, at the catalog's prices, as the plan priced it.

    422 naming the field for a setup that cannot be rented or does not fit (``gpus`` names the nearest
    rentable counts); 409 when the picked offer's price changed or vanished since the plan, or the plan
    priced the same setup at another cost. ``idempotency_key``: stored with the quote (:func:`issue`)."""
    plan_row = get_plan(session, principal, plan_id)
    if plan_row.status != "done":
        raise Conflict(f"plan {plan_id} is {plan_row.status}; quotes are issued for estimated plans", field="id")
    plan_request = PlanRequest.model_validate(plan_row.request)
    plan, _ = resolved_plan(session, plan_request)
    stored = [Recommendation.model_validate(r) for r in plan_row.recommendations or []]
    constraints = _constraints(plan_request.constraints, safety_margin)
    pricing: PricingMode = "spot" if request.spot else "on_demand"
    now = now if now is not None else datetime.now(UTC)

    offers = catalog_offers(session, principal.organization_id)
    gpu = _card(request.gpu) if request.gpu is not None else None
    picked, emptied_by = _offers_for(offers, constraints, request, gpu)
    if gpu is not None:
        _vanished(stored, picked, request, gpu, pricing)
        if not picked:
            raise _none_left(request, gpu, emptied_by)
    else:
        _check_best_for(picked, request, emptied_by)
    try:
        rec, plan_assumptions, offer = price_exact_setup(
            plan,
            picked,
            gpu,
            request.gpus or request.best_for_gpus or 1,
            pricing,
            constraints,
            nodes=request.nodes,
            utilisation=calibrated_utilisation(session, principal.organization_id, plan.method),
            now=now,
        )
    except EstimatorError as exc:
        field, message = exc.field, exc.message
        if request.best_for_gpus is not None and exc.field == "gpus":
            field, message = "best_for_gpus", "best_for_gpus: " + message.removeprefix("gpus: ")
        raise Unprocessable(message, field=field) from None
    _unchanged(stored, rec)
    _dearer_than_planned(stored, rec, request)
    rec = _with_ranking_notes(stored, rec)

    items = cost_lines(rec)
    job_cost = rec.expected_cost_usd
    checkpoint_gb = _checkpoint_gb(plan)
    if request.checkpoint_storage_months > 0 and checkpoint_gb > 0:
        gb_months = round(checkpoint_gb * request.checkpoint_storage_months, 2)
        # The quantity shown times the price, to the cent, so the line multiplies out as printed.
        storage_usd = float(_to_cents(Decimal(str(gb_months)) * Decimal(str(STORAGE_USD_PER_GB_MONTH))))
        if storage_usd > 0:  # under a cent is no line (cost_lines leaves such lines out too): never a $0.00 charge
            items.append(
                LineItem(
                    description="checkpoint storage (S3-compatible), the last checkpoint kept",
                    quantity=gb_months,
                    unit="GB-month",
                    unit_price_usd=STORAGE_USD_PER_GB_MONTH,
                    amount_usd=storage_usd,
                )
            )
    total = round(sum(i.amount_usd for i in items), 2)
    row = QuoteRow(
        organization_id=principal.organization_id,
        plan_id=plan_row.id,
        setup=_setup(rec),
        line_items=[i.model_dump() for i in items],
        assumptions=[
            *_read_as(request.gpu, gpu),
            *_assumptions(rec, plan_row.estimate or {}, request, checkpoint_gb, constraints, offer, total),
        ],
        total_usd=total,
        currency=QUOTE_CURRENCY,
        valid_until=utcnow() + timedelta(days=validity_days),
        customer_name=request.customer_name,
        customer_email=request.customer_email,
        idempotency_key=idempotency_key,
        document={
            "request": _request_of(plan_id, request),
            "issuer": principal.organization_name,
            "model": plan_row.model_name or plan.model.name or "",
            "method": plan.method,
            "job": job_description(plan, plan_row.estimate or {}),
            "job_cost_usd": job_cost,
            "notes": list(rec.notes),
            "plan_assumptions": plan_assumptions,
            "price_list": PriceList(
                provider=rec.provider,
                region=rec.region,
                source=offer.source,
                fetched_at=offer.fetched_at,
                age_hours=rec.price_age_hours,
            ).model_dump(),
        },
    )
    session.add(row)
    session.flush()
    return row


def issue(
    transaction: Callable[[], AbstractContextManager[tuple[Session, Any]]],
    principal: Principal,
    plan_id: str,
    request: QuoteRequest,
    safety_margin: float,
    validity_days: int,
    idempotency_key: str | None,
) -> tuple[QuoteOut, bool]:
    """(the quote, whether it is new): :func:`create_quote` in its own transaction. A repeated Idempotency-Key with
    the same plan and body answers with the quote it issued, whatever the catalog says since; with another body it
    is a 409, and so it is once that quote has expired (its ``valid_until`` passed): a 200 with a quote no longer
    valid read as a quote to accept, and a new one under the same key would be two quotes for one key.

    Two requests with one new key both find no quote and both insert: the later runs again (once_more_if_raced)."""
    idempotency_key = checked_idempotency_key(idempotency_key)

    def once() -> tuple[QuoteOut, bool]:
        with transaction() as (session, _pending):
            if idempotency_key is not None:
                existing = _issued_with(session, principal, plan_id, request, idempotency_key)
                if existing is not None:
                    _still_valid(existing)
                    return to_out(existing), False
            row = create_quote(
                session, principal, plan_id, request, safety_margin, validity_days, idempotency_key=idempotency_key
            )
            return to_out(row), True

    return once_more_if_raced(once, idempotency_key is not None)


def _request_of(plan_id: str, request: QuoteRequest) -> dict[str, Any]:
    """What a quote was asked for: the plan and the body, as a replayed Idempotency-Key is compared."""
    return {"plan_id": plan_id, **request.model_dump(mode="json")}


def _issued_with(
    session: Session, principal: Principal, plan_id: str, request: QuoteRequest, key: str
) -> QuoteRow | None:
    """The organization's quote issued with ``key``, if any; 409 where it was asked for another plan or body."""
    get_plan(session, principal, plan_id)  # another organization's plan is a 404, whatever the key
    row = session.scalar(
        select(QuoteRow).where(QuoteRow.organization_id == principal.organization_id, QuoteRow.idempotency_key == key)
    )
    if row is not None and (row.document or {}).get("request") != _request_of(plan_id, request):
        raise Conflict(
            "Idempotency-Key was already used with a different quote request (another plan or body)",
            field="Idempotency-Key",
        )
    return row


def _still_valid(row: QuoteRow) -> None:
    """409 on Idempotency-Key where the quote issued with the key has expired: the retry names it (to read back with
    GET /v1/quotes/{id}) and a new key asks for a quote at today's prices."""
    if row.valid_until <= utcnow():
        raise Conflict(
            f"Idempotency-Key was used for quote {quote_number(row)} (id {row.id}), which expired at "
            f"{row.valid_until.astimezone(UTC):%Y-%m-%d %H:%M} UTC; send a new Idempotency-Key for a new quote",
            field="Idempotency-Key",
        )


def _card(name: str) -> str:
    try:
        return find_gpu(name).name
    except EstimatorError as exc:
        raise Unprocessable(f"gpu: {exc.message}", field="gpu") from None


def _read_as(name: str | None, gpu: str | None) -> list[str]:
    """An assumption line where the card asked for is not the card's own name (an alias, or ``find_gpu``'s forgiving
    match): "A100" is quoted as the A100 80GB, and the quote says so rather than leave the A100 40GB unmentioned (a
    probe of the quote path)."""
    if name is None or gpu is None or gpu_name_key(name) == gpu_name_key(gpu):
        return []
    return [f"the card asked for, {name.strip()[:80]!r}, is read as the {gpu}"]


def _card_name(offer: Offer) -> str | None:
    try:
        return find_gpu(offer.gpu).name
    except EstimatorError:
        return None


def _constraints(constraints: Constraints, margin: float) -> Constraints:
    """The plan's constraints as its estimation ran them (services.plans.recommend: the server's margin unless
    the plan set one)."""
    if "safety_margin" in constraints.model_fields_set:
        return constraints
    return constraints.model_copy(update={"safety_margin": margin})


def _offers_for(
    offers: Sequence[Offer], constraints: Constraints, request: QuoteRequest, gpu: str | None
) -> tuple[list[Offer], str]:
    """The offers the quote may price: the card's, at the provider and region asked for, else those the plan's
    provider and region constraints allow, of the node size asked for; and the field whose filter left none
    (gpu where none did)."""
    # One filter at a time, so a 422 names the input that matches nothing (a region the provider lacks is the
    # region's fault, not the provider's); the plan's own constraints count against the card.
    keeps: list[tuple[str, Callable[[Offer], bool]]] = [("gpu", lambda o: gpu is None or _card_name(o) == gpu)]
    if request.provider is not None:
        provider = request.provider.strip().lower()
        keeps.append(("provider", lambda o: o.provider.lower() == provider))
    else:
        keeps.append(("gpu", lambda o: constraints.allows_provider(o.provider)))
    if request.region is not None:
        region = request.region.strip().lower()
        keeps.append(("region", lambda o: o.region.lower() == region))
    elif request.provider is None:
        keeps.append(("gpu", lambda o: constraints.allows_region(o.region, o.country)))
    if request.offer_gpus_per_node is not None:
        node_gpus = request.offer_gpus_per_node
        keeps.append(("offer_gpus_per_node", lambda o: o.gpus_per_node == node_gpus))
    picked = list(offers)
    for field, keep in keeps:
        picked = [o for o in picked if keep(o)]
        if not picked:
            return picked, field
    return picked, "gpu"


def _where(request: QuoteRequest) -> str:
    where = f" at {request.provider}" if request.provider else ""
    if request.region is not None:
        where += f" in {request.region}" if request.region.strip() else " without a region"
    return where + (f" in nodes of {request.offer_gpus_per_node} GPUs" if request.offer_gpus_per_node else "")


def _none_left(request: QuoteRequest, gpu: str, field: str) -> Unprocessable:
    return Unprocessable(f"{field}: no offer for {gpu}{_where(request)} in the catalog", field=field)


def _check_best_for(picked: Sequence[Offer], request: QuoteRequest, emptied_by: str) -> None:
    """422 naming the field for a ``best_for_gpus`` request that no offer can answer: the provider, region or node
    size it names has none, no offer rents that many GPUs, or none runs them on the ``nodes`` given."""
    gpus = request.best_for_gpus or 1
    if not picked:
        field = "best_for_gpus" if emptied_by == "gpu" else emptied_by  # "gpu": the plan's own constraints
        raise Unprocessable(f"{field}: no offer{_where(request)} in the catalog", field=field)
    runs_on = sorted({layout.nodes for o in picked if (layout := offer_layout(o, gpus)) is not None})
    if not runs_on:
        counts = sorted({n for o in picked for n in nearest_counts(o, gpus)}, key=lambda n: (abs(n - gpus), n))
        nearest = " or ".join(str(n) for n in sorted(counts[:2])) or "none"
        raise Unprocessable(
            f"best_for_gpus: no offer{_where(request)} rents {gpus} GPUs; the nearest counts are {nearest}",
            field="best_for_gpus",
        )
    if request.nodes is not None and request.nodes not in runs_on:
        raise Unprocessable(
            f"nodes: {gpus} GPUs run on {' or '.join(map(str, runs_on))} node(s), not {request.nodes}", field="nodes"
        )


def _same_offer(rec: Recommendation, provider: str, region: str, node_gpus: int | None = None) -> bool:
    """Whether ``rec`` rents the offer of that provider and region (and node size, where both know it: a provider
    may sell one card in several node sizes at different prices)."""
    same_node = node_gpus is None or rec.offer_gpus_per_node is None or rec.offer_gpus_per_node == node_gpus
    return rec.provider.lower() == provider.lower() and rec.region.lower() == region.lower() and same_node


def _vanished(
    stored: Sequence[Recommendation], picked: Sequence[Offer], request: QuoteRequest, gpu: str, pricing: PricingMode
) -> None:
    """409 when the provider asked for had an offer of the card (or its spot price) the plan priced, and the
    catalog has it no longer. Only the plan's offers of the region and node size asked for count: a node size
    the plan never priced there is a bad input (422 from _none_left), not an offer gone."""
    if request.provider is None:
        return
    for s in stored:
        region = s.region if request.region is None else request.region.strip()
        if s.gpu != gpu or not _same_offer(s, request.provider.strip(), region, request.offer_gpus_per_node):
            continue
        now = [o for o in picked if o.provider.lower() == s.provider.lower() and o.region.lower() == s.region.lower()]
        if not now:
            raise Conflict(
                f"the {gpu} offer of {s.provider} ({s.region}) the plan priced at "
                f"${s.price_usd_per_hour / s.gpus:,.4f} per GPU-hour is no longer in the catalog; re-plan to quote "
                "today's offers",
                field="provider",
            )
        if (
            pricing == "spot"
            and s.spot_price_usd_per_hour is not None
            and all(o.spot_usd_per_hour is None for o in now)
        ):
            raise Conflict(
                f"the spot price of {gpu} at {s.provider} ({s.region}) the plan priced at "
                f"${s.spot_price_usd_per_hour / s.gpus:,.4f} per GPU-hour is no longer offered; re-plan or quote on "
                "demand",
                field="spot",
            )


def _with_ranking_notes(stored: Sequence[Recommendation], rec: Recommendation) -> Recommendation:
    """The setup with the notes the plan's ranking gave it (what it was ranked above or below, and at what
    cost), so the quote says what the plan page says of it; a setup the plan did not list has none.

    The ranking's notes are the plan's, where the plan put them (first or last: services.planner.planner._notes);
    the setup's own notes are today's, so what they say of the price list (its age, its date) is what the quote's
    price list says."""
    for s in stored:
        same = (s.gpu, s.gpus, s.nodes, s.pricing) == (rec.gpu, rec.gpus, rec.nodes, rec.pricing)
        if same and _same_offer(s, rec.provider, rec.region, rec.offer_gpus_per_node) and s.ranking_notes:
            # The same setup at the same cost (_unchanged).
            lead, tail = _split_ranking_notes(s.notes, s.ranking_notes)
            notes = [*lead, *(n for n in rec.notes if n not in s.ranking_notes), *tail]
            return rec.model_copy(update={"notes": notes, "ranking_notes": list(s.ranking_notes)})
    return rec


def _split_ranking_notes(notes: Sequence[str], ranking: Sequence[str]) -> tuple[list[str], list[str]]:
    """The ranking's notes that come before a setup's own notes and those after (the longest tail that fits)."""
    for cut in range(len(ranking) + 1):
        lead, tail = list(ranking[:cut]), list(ranking[cut:])
        if list(notes[:cut]) == lead and list(notes[len(notes) - len(tail) :]) == tail and len(notes) >= len(ranking):
            return lead, tail
    return [], list(ranking)


def _unchanged(stored: Sequence[Recommendation], rec: Recommendation) -> None:
    """409 when the plan priced the picked offer at another price (a spot quote: its spot price or the on-demand
    price its run falls back to), or the same setup at another cost."""
    for s in stored:
        if s.gpu != rec.gpu or not _same_offer(s, rec.provider, rec.region, rec.offer_gpus_per_node):
            continue
        # A spot run bills its on-demand finish at the on-demand price (cost_lines), so both prices count for it.
        prices: list[tuple[str, float | None, float | None]] = []
        if rec.pricing == "spot":
            prices.append(("spot", s.spot_price_usd_per_hour, rec.spot_price_usd_per_hour))
        prices.append(("on-demand", s.price_usd_per_hour, rec.price_usd_per_hour))
        for kind, was_setup, now_setup in prices:
            if was_setup is None or now_setup is None:
                # No spot price when the plan priced the offer: the quote's is one the plan never ranked
                # (_vanished answers the other way round).
                if now_setup is not None:
                    raise Conflict(
                        f"the {kind} price of {rec.gpu} at {rec.provider} ({rec.region}) is new since the plan: none "
                        f"then, ${now_setup / rec.gpus:,.4f} per GPU-hour now; re-plan to quote it",
                        field="price",
                    )
                continue
            was, now = was_setup / s.gpus, now_setup / rec.gpus
            if abs(was - now) > PRICE_TOLERANCE_USD:
                raise Conflict(
                    f"the {kind} price of {rec.gpu} at {rec.provider} ({rec.region}) changed since the plan: "
                    f"${was:,.4f} per GPU-hour then, ${now:,.4f} now; re-plan to quote today's price",
                    field="price",
                )
    for s in stored:
        same = (s.gpu, s.gpus, s.nodes, s.pricing) == (rec.gpu, rec.gpus, rec.nodes, rec.pricing)
        if (
            same
            and _same_offer(s, rec.provider, rec.region, rec.offer_gpus_per_node)
            and s.expected_cost_usd != rec.expected_cost_usd
        ):
            raise Conflict(
                f"the plan priced {rec.gpus} x {rec.gpu} at {rec.provider} at {usd(s.expected_cost_usd)}; it now "
                f"estimates {usd(rec.expected_cost_usd)} (a price it also depends on, such as the on-demand price "
                "a spot run falls back to, the calibration or the catalog's defaults changed); "
                "re-plan to quote it",
                field="price",
            )


def _dearer_than_planned(stored: Sequence[Recommendation], rec: Recommendation, request: QuoteRequest) -> None:
    """409 when a quote that names no offer (no provider, region or node size) costs more than the plan's cheapest
    setup of the same card (any card for ``best_for_gpus``), GPU count, nodes and pricing: the offer the plan priced
    is gone, lost its spot price, or got dearer, and the quote had moved to another one without a word (a probe: a
    spot quote of 2 x A100 40GB moved from the plan's $44.71 to another provider's $305.74). Naming the provider
    asks for that offer (_vanished answers)."""
    if request.provider is not None or request.region is not None or request.offer_gpus_per_node is not None:
        return
    same = [
        s
        for s in stored
        if s.gpus == rec.gpus
        and s.pricing == rec.pricing
        and (request.gpu is None or s.gpu == rec.gpu)
        and (request.nodes is None or s.nodes == rec.nodes)
    ]
    planned = min(same, key=lambda s: s.expected_cost_usd, default=None)
    if planned is not None and rec.expected_cost_usd - planned.expected_cost_usd >= 0.005:
        pricing = "on spot" if rec.pricing == "spot" else "on demand"
        raise Conflict(
            f"the plan priced {planned.gpus} x {planned.gpu} {pricing} at {planned.provider} ({planned.region}) for "
            f"{usd(planned.expected_cost_usd)}; that offer is gone or dearer now, and today's cheapest is "
            f"{rec.provider} ({rec.region}) at {usd(rec.expected_cost_usd)}: re-plan to quote today's offers",
            field="price",
        )


def _cents(parts: Sequence[float], total_cents: int) -> list[int]:
    """Whole cents for ``parts`` (USD) that add up to ``total_cents``: largest remainders get the odd cents
    (Hamilton's method), so the lines sum to the plan's rounded total exactly."""
    raw = [p * 100.0 for p in parts]
    cents = [math.floor(r) for r in raw]
    left = total_cents - sum(cents)
    order = sorted(range(len(raw)), key=lambda i: raw[i] - cents[i], reverse=left > 0)
    step = 1 if left > 0 else -1
    for i in order[: abs(left)]:
        cents[i] += step
    return cents


def _to_cents(value: Decimal) -> Decimal:
    """To the cent, halves up (as a reader rounds a product)."""
    return value.quantize(Decimal("0.01"), ROUND_HALF_UP)


def line_quantity(amount_usd: float, unit_price_usd: float) -> float:
    """The quantity a line of ``amount_usd`` shows at ``unit_price_usd``: the amount over the price, to the fewest
    decimals (2 to 6) whose product with the price is the amount to the cent, so each line multiplies out as printed.
    The amount is the line's share of the plan's whole cents (_cents), which its own rounding may not be: the
    quantity follows the amount, not the other way round."""
    price = Decimal(str(unit_price_usd))
    amount = Decimal(str(amount_usd))
    if price <= 0:
        return 0.0
    exact = amount / price
    for places in range(2, 7):
        quantity = exact.quantize(Decimal(1).scaleb(-places), ROUND_HALF_UP)
        if _to_cents(quantity * price) == amount:
            return float(quantity)
    return float(exact.quantize(Decimal("0.000001"), ROUND_HALF_UP))


def cost_lines(rec: Recommendation) -> list[LineItem]:
    """The planner's cost breakdown of the setup as GPU-hour lines at the setup's price (the on-demand finish of a
    spot run at the on-demand price's excess over spot), adding up to the plan's expected cost to the cent, each
    line's quantity times its unit price equal to its amount to the cent."""
    per_gpu_hour = (
        rec.spot_price_usd_per_hour if rec.pricing == "spot" and rec.spot_price_usd_per_hour else rec.price_usd_per_hour
    ) / rec.gpus
    unit_price = round(per_gpu_hour, 4)
    excess = round(max(rec.price_usd_per_hour / rec.gpus - per_gpu_hour, 0.0), 4)
    keys = [k for k, _ in BREAKDOWN_LINES]
    cents = _cents([rec.cost_breakdown.get(k, 0.0) for k in keys], round(rec.expected_cost_usd * 100))
    pricing = "spot" if rec.pricing == "spot" else "on demand"
    items = []
    for (key, label), amount in zip(BREAKDOWN_LINES, cents, strict=True):
        usd = rec.cost_breakdown.get(key, 0.0)
        if amount == 0 and usd < 0.005:
            continue
        description = label
        if key == "preemption_rework" and rec.pricing != "spot":
            # On demand nothing is preempted: the line is the rework after hardware failures (FAILURES_PER_GPU_HOUR).
            description = "expected failure rework (restarts and lost work after hardware failures)"
        if key == "compute":
            where = f"{rec.provider} ({rec.region})" if rec.region else rec.provider
            description = f"{label}: {rec.gpus} x {rec.gpu} at {where}, {pricing}"
        price = excess if key == "on_demand_fallback" and excess > 0 else unit_price
        items.append(
            LineItem(
                description=description,
                quantity=line_quantity(amount / 100.0, price),
                unit="GPU-hour",
                unit_price_usd=price,
                amount_usd=amount / 100.0,
            )
        )
    return items


_SETUP_KEYS = (
    "provider",
    "region",
    "gpu",
    "gpus",
    "gpus_per_node",
    "nodes",
    "sharding",
    "cpu_offload",
    "host_ram_gib_per_node",
    "optimizer",
    "micro_batch_size",
    "gradient_accumulation_steps",
    "effective_batch_size",
    "gradient_checkpointing",
    "peak_gib_per_gpu",
    "gpu_memory_gib",
    "headroom_gib",
    "tokens_per_s",
    "data_tokens_per_s",
    "scaling_efficiency",
    "links",
    "hours",
    "expected_hours",
    "expected_preemptions",
    "checkpoint_interval_minutes",
    "price_usd_per_hour",
    "spot_price_usd_per_hour",
)


def _setup(rec: Recommendation) -> dict[str, Any]:
    data = rec.model_dump(mode="json")
    setup = {k: data[k] for k in _SETUP_KEYS}
    setup["pricing"] = rec.pricing  # on_demand or spot: the plan's spelling, so a quote matches its recommendation
    setup["cost_breakdown"] = dict(rec.cost_breakdown)
    return setup


def _assumptions(
    rec: Recommendation,
    estimate: dict[str, Any],
    request: QuoteRequest,
    checkpoint_gb: float,
    constraints: Constraints,
    offer: Offer,
    total_usd: float,
) -> list[str]:
    offload = (
        f", with the optimizer states offloaded to host RAM (about {rec.host_ram_gib_per_node:,.0f} GiB per node)"
        if rec.cpu_offload and rec.host_ram_gib_per_node is not None
        else ""
    )
    out = [
        f"predicted peak {rec.peak_gib_per_gpu:.1f} GiB per GPU on a {gib(rec.gpu_memory_gib)} GiB card "
        f"({rec.headroom_gib:.1f} GiB headroom){offload}",
        f"{rec.data_tokens_per_s:,.0f} tokens/s of data over {rec.gpus} GPU{'s' if rec.gpus != 1 else ''}, "
        f"scaling efficiency {rec.scaling_efficiency:.0%} over {rec.links or 'the interconnect'}"
        + ("; the CPU optimizer step sets the pace" if rec.cpu_offload else ""),
        f"data: {estimate.get('total_tokens') or 0:,.0f} tokens in total (data set x epochs)",
        "the job's cost is the plan's expected cost for this setup: start-up, model download, training, "
        "checkpoints, preemption rework and billing rounding at the price list's price; taxes not included",
    ]
    if rec.pricing == "spot":
        out.append(
            f"spot: {rec.expected_preemptions or 0:.2f} expected preemptions with checkpoints every "
            f"{rec.checkpoint_interval_minutes or 0:.0f} min, rework included"
        )
    # A picked setup may be one the plan left out for its budget, deadline, GPU count, provider or region: the quote
    # says so.
    if constraints.budget_usd is not None and rec.expected_cost_usd > constraints.budget_usd:
        out.append(f"over the plan's budget: {usd(rec.expected_cost_usd)} against {usd(constraints.budget_usd)}")
    elif constraints.budget_usd is not None and total_usd > constraints.budget_usd:
        out.append(
            f"over the plan's budget with checkpoint storage: {usd(total_usd)} in total against "
            f"{usd(constraints.budget_usd)} (the job alone {usd(rec.expected_cost_usd)})"
        )
    if constraints.deadline_hours is not None and rec.expected_hours > constraints.deadline_hours:
        out.append(
            f"past the plan's deadline: {rec.expected_hours:,.1f} h against {constraints.deadline_hours:g} h expected"
        )
    if rec.gpus > constraints.max_gpus:
        out.append(f"more GPUs than the plan's max_gpus: {rec.gpus} against {constraints.max_gpus}")
    if not constraints.allows_provider(rec.provider):
        out.append(f"a provider the plan left out: {rec.provider}, not among {', '.join(constraints.providers)}")
    if not constraints.allows_region(offer.region, offer.country):
        where = offer.region or "no region"
        out.append(f"a region the plan left out: {where}, not among {', '.join(constraints.regions)}")
    if request.checkpoint_storage_months > 0 and checkpoint_gb:
        out.append(
            f"checkpoints: {checkpoint_gb:.1f} GB kept for {request.checkpoint_storage_months:g} month(s) at "
            f"${STORAGE_USD_PER_GB_MONTH}/GB-month"
        )
    return out


def job_description(plan: Plan, estimate: dict[str, Any]) -> str:
    """The training job in one line: the data set, the epochs, the tokens and the batch."""
    data = plan.data
    parts = []
    if data is not None:
        if data.examples is not None and data.avg_tokens_per_example is not None:
            parts.append(f"{data.examples:,} examples of {data.avg_tokens_per_example:,.0f} tokens on average")
        elif data.tokens is not None:
            parts.append(f"{data.tokens:,} tokens")
        parts.append(f"{data.epochs:g} epoch{'s' if data.epochs != 1 else ''}")
        parts.append(f"{data.total_tokens():,.0f} tokens in total")
    parts.append(f"sequences of {plan.seq_len:,} tokens")
    parts.append(f"micro-batch {plan.micro_batch_size}")
    return ", ".join(parts)


def _checkpoint_gb(plan: Plan) -> float:
    """The last checkpoint kept, in GB (10^9 bytes, as storage is billed): the bytes the planner charges a
    checkpoint write with (services/planner/spot.py), so the quote and the planner agree."""
    _, arch = resolve_architecture(plan)
    return checkpoint_bytes(plan, arch) / 1e9


def get_quote(session: Session, principal: Principal, quote_id: str) -> QuoteRow:
    row = session.scalar(
        select(QuoteRow).where(QuoteRow.id == quote_id, QuoteRow.organization_id == principal.organization_id)
    )
    if row is None:
        raise NotFound(f"no quote {quote_id!r}", field="id")
    return row


def quotes_page(
    session: Session, principal: Principal, limit: int, before: str | None
) -> tuple[Sequence[QuoteRow], str | None]:
    """A page of the organization's quotes, newest first."""
    query = select(QuoteRow).where(QuoteRow.organization_id == principal.organization_id)
    return keyset_page(session, query, QuoteRow, limit, before)


def quote_number(row: QuoteRow) -> str:
    """The number printed on the document: the issue date and the first characters of the id."""
    return f"Q-{row.created_at:%Y%m%d}-{row.id[:8].upper()}"


def to_out(row: QuoteRow, now: datetime | None = None) -> QuoteOut:
    """The quote as the API answers it; ``expired`` by the server's clock at ``now`` (default: now), as a retried
    Idempotency-Key tells (:func:`_still_valid`)."""
    doc = row.document or {}
    price_list = doc.get("price_list")
    setup = dict(row.setup)
    if setup.get("pricing") == "on-demand":  # quotes issued before pricing took the plan's spelling
        setup["pricing"] = "on_demand"
    return QuoteOut(
        id=row.id,
        number=quote_number(row),
        plan_id=row.plan_id,
        created_at=row.created_at,
        valid_until=row.valid_until,
        expired=row.valid_until <= (now if now is not None else utcnow()),
        customer=Customer(name=row.customer_name, email=row.customer_email),
        issuer=str(doc.get("issuer", "")),
        model=str(doc.get("model", "")),
        method=str(doc.get("method", "")),
        job=str(doc.get("job", "")),
        setup=setup,
        line_items=[LineItem.model_validate(i) for i in row.line_items],
        job_cost_usd=float(doc.get("job_cost_usd", row.total_usd)),
        total_usd=row.total_usd,
        currency=row.currency,
        notes=list(doc.get("notes", [])),
        assumptions=row.assumptions,
        plan_assumptions=list(doc.get("plan_assumptions", [])),
        price_list=PriceList.model_validate(price_list) if price_list else None,
    )
