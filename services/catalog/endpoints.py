from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from services.api.deps import DbDep, PrincipalDep
from services.catalog import service
from services.core.errors import Forbidden, Unprocessable

router = APIRouter(prefix="/v1", tags=["catalog"])

MAX_PRICE_LIST_BYTES = 5_000_000


def _offer_json(row: Any) -> dict[str, Any]:
    return {
        "provider": row.provider,
        "gpu": row.gpu,
        "gpu_memory_gib": row.gpu_memory_gib,
        "gpus_per_node": row.gpus_per_node,
        "on_demand_usd_per_hour": row.on_demand_usd_per_hour,
        "spot_usd_per_hour": row.spot_usd_per_hour,
        "currency": row.currency,
        "region": row.region,
        "country": row.country,
        "interconnect": row.interconnect,
        "fetched_at": row.fetched_at,
        "source": row.source,
    }


@router.get("/catalog/offers", operation_id="catalog-offers")
def list_offers(
    db: DbDep,
    _principal: PrincipalDep,
    provider: Annotated[str | None, Query(max_length=100)] = None,
    gpu: Annotated[str | None, Query(max_length=100)] = None,
    region: Annotated[str | None, Query(max_length=100)] = None,
    min_memory_gib: Annotated[float | None, Query(ge=0, le=10_000)] = None,
    max_usd_per_hour: Annotated[float | None, Query(ge=0, le=100_000)] = None,
    spot: Annotated[bool | None, Query()] = None,
) -> dict[str, Any]:
    with db.transaction() as (session, _pending):
        rows = service.active_offers(
            session,
            provider=provider,
            gpu=gpu,
            region=region,
            min_memory_gib=min_memory_gib,
            max_usd_per_hour=max_usd_per_hour,
            spot=spot,
        )
        return {"items": [_offer_json(r) for r in rows]}


_PRICE_LIST_BODY = {
    "requestBody": {
        "required": True,
        "description": "a price list: CSV with a header row, or a JSON list of offer objects",
        "content": {
            "text/csv": {"schema": {"type": "string"}},
            "application/json": {"schema": {"type": "array", "items": {"type": "object"}}},
        },
    }
}


@router.post(
    "/admin/catalog/offers", operation_id="catalog-import-offers", status_code=201, openapi_extra=_PRICE_LIST_BODY
)
async def import_offers(request: Request, db: DbDep, principal: PrincipalDep) -> dict[str, Any]:
    if not principal.admin:
        raise Forbidden("importing a price list needs an admin API key (gpuplan admin create-key --admin)")
    raw = await request.body()
    if len(raw) > MAX_PRICE_LIST_BYTES:
        raise Unprocessable(f"price list larger than {MAX_PRICE_LIST_BYTES} bytes", field="body")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise Unprocessable("price list must be UTF-8 text", field="body") from None
    fmt = "json" if "json" in request.headers.get("content-type", "") else "csv"
    with db.transaction() as (session, _pending):
        version = service.import_price_list(session, text, fmt, f"api import by {principal.organization_name}")
        return {"version": version.id, "rows": version.rows}
