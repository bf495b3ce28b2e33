from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import PlainTextResponse

from services.api.deps import DbDep, PrincipalDep
from services.api.routing import OffLoopRoute, off_loop
from services.catalog import service
from services.catalog.pricelist import export_csv
from services.catalog.tables import CatalogFeed, GpuOfferRow
from services.core.errors import Forbidden, Unprocessable
from services.orgs.service import Principal

# Bodies are parsed and validated off the event loop (services/api/routing.py).
router = APIRouter(prefix="/v1", tags=["catalog"], route_class=OffLoopRoute)

MAX_PRICE_LIST_BYTES = 5_000_000


def _offer_json(row: GpuOfferRow, own_version_id: str | None) -> dict[str, Any]:
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
        "whole_nodes_only": row.whole_nodes_only,
        "inter_node_gbit_per_s": row.inter_node_gbit_per_s,
        "billing_increment_s": row.billing_increment_s,
        "billing_minimum_s": row.billing_minimum_s,
        "startup_s": row.startup_s,
        "download_gbit_per_s": row.download_gbit_per_s,
        "preemption_per_hour": row.preemption_per_hour,
        "host_ram_gib_per_node": row.host_ram_gib_per_node,
        # "organization": the caller's own negotiated price, seen by its organization alone.
        "catalog": "organization" if own_version_id is not None and row.version_id == own_version_id else "public",
    }


@router.get(
    "/catalog/offers",
    operation_id="catalog-offers",
    responses={200: {"content": {"text/csv": {"schema": {"type": "string"}}}}},
)
def list_offers(
    db: DbDep,
    principal: PrincipalDep,
    provider: Annotated[str | None, Query(max_length=100)] = None,
    gpu: Annotated[str | None, Query(max_length=100)] = None,
    region: Annotated[str | None, Query(max_length=100)] = None,
    min_memory_gib: Annotated[float | None, Query(ge=0, le=10_000)] = None,
    max_usd_per_hour: Annotated[float | None, Query(ge=0, le=100_000)] = None,
    spot: Annotated[bool | None, Query()] = None,
    format: Annotated[Literal["json", "csv"], Query(description="csv: a price list that imports back")] = "json",
) -> Any:
    """The offers the caller's organization plans on: the public catalog with its own prices laid over it."""
    for name, value in (("provider", provider), ("gpu", gpu), ("region", region)):
        if value is not None and "\x00" in value:
            raise Unprocessable(f"{name}: may not contain a NUL byte", field=name)
    with db.transaction() as (session, _pending):
        rows = service.active_offers(
            session,
            principal.organization_id,
            provider=provider,
            gpu=gpu,
            region=region,
            min_memory_gib=min_memory_gib,
            max_usd_per_hour=max_usd_per_hour,
            spot=spot,
        )
        if format == "csv":
            return PlainTextResponse(export_csv(service.as_offers(rows)), media_type="text/csv")
        own = service.own_version_id(session, principal.organization_id)
        return {"items": [_offer_json(r, own) for r in rows]}


def _feed_json(feed: CatalogFeed) -> dict[str, Any]:
    return {
        "provider": feed.provider,
        "last_attempt_at": feed.last_attempt_at,
        "last_success_at": feed.last_success_at,
        "last_error": feed.last_error,
        "offers": feed.offers,
        # What the last good fetch left out (cards without a spec, dropped spot prices): docs/catalog.md promises it.
        "note": feed.note,
        "ok": feed.last_error is None,
    }


@router.get("/catalog/feeds", operation_id="catalog-feeds")
def list_feeds(db: DbDep, _principal: PrincipalDep) -> dict[str, Any]:
    """Each live price feed's last refresh: when it succeeded, how many offers, and the last error."""
    with db.transaction() as (session, _pending):
        return {"items": [_feed_json(f) for f in service.feed_states(session)]}


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

ReplaceProvider = Annotated[
    list[str] | None,
    Query(
        max_length=50,
        description="drop all old offers of this provider first (repeatable); other providers are always kept",
    ),
]


async def _price_list_text(request: Request) -> tuple[str, str]:
    raw = await request.body()
    if len(raw) > MAX_PRICE_LIST_BYTES:
        raise Unprocessable(f"body: a price list larger than {MAX_PRICE_LIST_BYTES} bytes", field="body")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise Unprocessable("body: a price list must be UTF-8 text", field="body") from None
    fmt = "json" if "json" in request.headers.get("content-type", "") else "csv"
    return text, fmt


def _import(
    db: Any, text: str, fmt: str, source: str, organization_id: str | None, replace: list[str] | None
) -> dict[str, Any]:
    with db.transaction() as (session, _pending):
        result = service.import_price_list(
            session, text, fmt, source, organization_id=organization_id, replace_providers=replace or ()
        )
        return result.summary()


@router.post(
    "/admin/catalog/offers",
    operation_id="catalog-import-organization-offers",
    status_code=201,
    openapi_extra=_PRICE_LIST_BODY,
    responses={403: {"description": "not an admin key of the organization"}},
)
@off_loop  # reads the raw price list (up to 10,000 rows) and stores it
async def import_organization_offers(
    request: Request, db: DbDep, principal: PrincipalDep, replace_provider: ReplaceProvider = None
) -> dict[str, Any]:
    """Import the organization's own negotiated prices: seen and planned on by this organization alone,
    over the public catalog. Additive: offers of providers not in the file are kept."""
    _require_admin(principal)
    text, fmt = await _price_list_text(request)
    source = f"api import by {principal.organization_name}"
    return _import(db, text, fmt, source, principal.organization_id, replace_provider)


@router.post(
    "/platform/catalog/offers",
    operation_id="catalog-import-public-offers",
    status_code=201,
    openapi_extra=_PRICE_LIST_BODY,
    responses={403: {"description": "not a platform-admin key"}},
)
@off_loop  # reads the raw price list (up to 10,000 rows) and stores it
async def import_public_offers(
    request: Request, db: DbDep, principal: PrincipalDep, replace_provider: ReplaceProvider = None
) -> dict[str, Any]:
    """Import into the public catalog every organization plans on (platform-admin keys only).
    Additive: offers of providers not in the file are kept."""
    _require_platform_admin(principal)
    text, fmt = await _price_list_text(request)
    return _import(db, text, fmt, f"platform api import by {principal.organization_name}", None, replace_provider)


RemoveProvider = Annotated[
    list[str], Query(min_length=1, max_length=50, description="the provider whose offers are removed (repeatable)")
]


@router.delete(
    "/admin/catalog/offers",
    operation_id="catalog-remove-organization-offers",
    responses={403: {"description": "not an admin key of the organization"}},
)
def remove_organization_offers(db: DbDep, principal: PrincipalDep, provider: RemoveProvider) -> dict[str, Any]:
    """Remove the organization's own offers of these providers; it plans on the public ones again."""
    _require_admin(principal)
    with db.transaction() as (session, _pending):
        source = f"api removal by {principal.organization_name}"
        return service.remove_providers(
            session, provider, source=source, organization_id=principal.organization_id
        ).summary()


@router.delete(
    "/platform/catalog/offers",
    operation_id="catalog-remove-public-offers",
    responses={403: {"description": "not a platform-admin key"}},
)
def remove_public_offers(db: DbDep, principal: PrincipalDep, provider: RemoveProvider) -> dict[str, Any]:
    """Remove every offer of these providers from the public catalog (platform-admin keys only)."""
    _require_platform_admin(principal)
    with db.transaction() as (session, _pending):
        source = f"platform api removal by {principal.organization_name}"
        return service.remove_providers(session, provider, source=source).summary()


def _require_platform_admin(principal: Principal) -> None:
    if not principal.platform_admin:
        raise Forbidden(
            "the public catalog is managed by the platform admin: `gpuplan admin import-offers` on the server, "
            "or a key from `gpuplan admin create-key --platform-admin`; an organization admin imports its own "
            "prices with POST /v1/admin/catalog/offers"
        )


def _require_admin(principal: Principal) -> None:
    if not principal.admin:
        raise Forbidden("importing a price list needs an admin API key (gpuplan admin create-key --admin)")
