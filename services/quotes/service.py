"""Quotes for multi-GPU setups: priced line items from the planner's estimate, issued once."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from services.catalog.gpus import find_gpu
from services.catalog.service import catalog_offers
from services.core.db import utcnow
from services.core.errors import Conflict, NotFound, Unprocessable
from services.estimator.errors import EstimatorError
from services.estimator.estimate import resolve_architecture
from services.hub.service import stored_request
from services.orgs.service import Principal
from services.planner.spot import checkpoint_bytes
from services.plans.recommend import recommend
from services.plans.schemas import PlanRequest
from services.plans.service import get_plan
from services.quotes.schemas import LineItem, QuoteOut, QuoteRequest
from services.quotes.tables import QuoteRow

# Object storage for checkpoints, per GB-month: the S3 Standard list price (us-east-1), used as the
# default when the provider's own storage price is not in the catalog.
STORAGE_USD_PER_GB_MONTH = 0.023


def _pick(recs: list[dict[str, Any]], request: QuoteRequest) -> dict[str, Any]:
    if request.spot:
        # A spot quote needs a spot price; among those, the cheapest expected spot total first.
        recs = sorted((r for r in recs if r.get("spot_cost_usd") is not None), key=lambda r: r["spot_cost_usd"])
    if request.best_for_gpus is not None:
        matching = [r for r in recs if r["gpus"] == request.best_for_gpus]
        if not matching:
            raise Unprocessable(
                f"no setup with {request.best_for_gpus} GPUs{' and a spot price' if request.spot else ''} fits this "
                "plan within its constraints",
                field="best_for_gpus",
            )
        return matching[0]
    try:
        gpu = find_gpu(request.gpu or "").name
    except EstimatorError as exc:
        raise Unprocessable(exc.message, field="gpu") from None
    matching = [
        r
        for r in recs
        if r["gpu"] == gpu
        and r["gpus"] == request.gpus
        and (request.provider is None or r["provider"] == request.provider)
    ]
    if not matching:
        if request.spot:
            raise Unprocessable(f"no spot price for {request.gpus} x {gpu} in the catalog", field="spot")
        raise Unprocessable(
            f"{request.gpus} x {gpu}{' at ' + request.provider if request.provider else ''} is not a fitting setup for "
            "this plan (see the plan's recommendations and rejections)",
            field="gpu",
        )
    return matching[0]


def create_quote(
    session: Session,
    principal: Principal,
    plan_id: str,
    request: QuoteRequest,
    safety_margin: float,
    validity_days: int = 14,
) -> QuoteRow:
    plan_row = get_plan(session, principal, plan_id)
    if plan_row.status != "done":
        raise Conflict(f"plan {plan_id} is {plan_row.status}; quotes are issued for estimated plans", field="id")
    plan_request = stored_request(session, PlanRequest.model_validate(plan_row.request))
    # Re-plan with room for the requested GPU count, so any fitting setup can be quoted.
    wanted = request.best_for_gpus or request.gpus or 1
    constraints = plan_request.constraints.model_copy(
        update={"max_gpus": max(wanted, plan_request.constraints.max_gpus)}
    )
    offers = catalog_offers(session, principal.organization_id)
    if request.gpu is not None:
        try:
            gpu_name = find_gpu(request.gpu).name
        except EstimatorError as exc:
            raise Unprocessable(exc.message, field="gpu") from None
        offers = tuple(
            o for o in offers if o.gpu == gpu_name and (request.provider is None or o.provider == request.provider)
        )
        if not offers:
            raise Unprocessable(f"no offer for {gpu_name} in the catalog", field="gpu")
    recs, _rejections, _warnings = recommend(plan_request.to_plan(), constraints, offers, safety_margin, top_n=10_000)
    rec = _pick(recs, request)

    hours = rec["spot_hours"] if request.spot else rec["hours"]
    per_gpu_hour = (rec["spot_price_usd_per_hour"] if request.spot else rec["price_usd_per_hour"]) / rec["gpus"]
    gpu_hours = hours * rec["gpus"]
    items = [
        LineItem(
            description=f"{rec['gpus']} x {rec['gpu']} ({rec['provider']}, {'spot' if request.spot else 'on-demand'})",
            quantity=round(gpu_hours, 2),
            unit="GPU-hour",
            unit_price_usd=round(per_gpu_hour, 4),
            amount_usd=round(gpu_hours * per_gpu_hour, 2),
        )
    ]
    checkpoint_gb = _checkpoint_gb(plan_request)
    if request.checkpoint_storage_months > 0 and checkpoint_gb > 0:
        gb_months = checkpoint_gb * request.checkpoint_storage_months
        items.append(
            LineItem(
                description="checkpoint storage (S3-compatible)",
                quantity=round(gb_months, 2),
                unit="GB-month",
                unit_price_usd=STORAGE_USD_PER_GB_MONTH,
                amount_usd=round(gb_months * STORAGE_USD_PER_GB_MONTH, 2),
            )
        )
    total = round(sum(i.amount_usd for i in items), 2)
    setup: dict[str, Any] = {
        k: rec[k]
        for k in (
            "provider",
            "gpu",
            "gpus",
            "gpus_per_node",
            "nodes",
            "sharding",
            "micro_batch_size",
            "gradient_accumulation_steps",
            "gradient_checkpointing",
            "peak_gib_per_gpu",
            "gpu_memory_gib",
            "headroom_gib",
            "tokens_per_s",
            "scaling_efficiency",
            "links",
            "hours",
            "region",
        )
        if k in rec
    }
    setup["pricing"] = "spot" if request.spot else "on-demand"
    setup["expected_hours"] = round(hours, 3)
    assumptions = [
        f"predicted peak {rec['peak_gib_per_gpu']:.1f} GiB per GPU on a {rec['gpu_memory_gib']:.0f} GiB card "
        f"({rec['headroom_gib']:.1f} GiB headroom)",
        f"{rec['tokens_per_s']:,.0f} tokens/s over {rec['gpus']} GPUs, scaling efficiency "
        f"{rec['scaling_efficiency']:.0%} over {rec.get('links') or 'the interconnect'}",
        f"data: {(plan_row.estimate or {}).get('total_tokens') or 0:,.0f} tokens in total (data set x epochs)",
        "prices from the provider catalog at quote time; taxes not included",
    ]
    if request.spot:
        assumptions.append(
            f"spot: {rec.get('expected_preemptions') or 0:.1f} expected preemptions with checkpoints every "
            f"{rec.get('checkpoint_interval_minutes') or 0:.0f} min, rework included"
        )
    if checkpoint_gb:
        assumptions.append(
            f"checkpoints: {checkpoint_gb:.1f} GB kept for {request.checkpoint_storage_months:g} month(s) at "
            f"${STORAGE_USD_PER_GB_MONTH}/GB-month"
        )
    row = QuoteRow(
        organization_id=principal.organization_id,
        plan_id=plan_row.id,
        setup=setup,
        line_items=[i.model_dump() for i in items],
        assumptions=assumptions,
        total_usd=total,
        currency="USD",
        valid_until=utcnow() + timedelta(days=validity_days),
    )
    session.add(row)
    session.flush()
    return row


def _checkpoint_gb(request: PlanRequest) -> float:
    """The last checkpoint kept, in GB (10^9 bytes, as storage is billed): the bytes the planner charges a
    checkpoint write with (services/planner/spot.py), so the quote and the planner agree."""
    plan = request.to_plan()
    _, arch = resolve_architecture(plan)
    return checkpoint_bytes(plan, arch) / 1e9


def get_quote(session: Session, principal: Principal, quote_id: str) -> QuoteRow:
    row = session.scalar(
        select(QuoteRow).where(QuoteRow.id == quote_id, QuoteRow.organization_id == principal.organization_id)
    )
    if row is None:
        raise NotFound(f"no quote {quote_id!r}", field="id")
    return row


def to_out(row: QuoteRow) -> QuoteOut:
    return QuoteOut(
        id=row.id,
        plan_id=row.plan_id,
        created_at=row.created_at,
        valid_until=row.valid_until,
        setup=row.setup,
        line_items=[LineItem.model_validate(i) for i in row.line_items],
        total_usd=row.total_usd,
        currency=row.currency,
        assumptions=row.assumptions,
    )
