"""The live catalog: the public price list every organization plans on, each organization's own
negotiated prices laid over it, additive imports, and the state of the live price feeds.

Services take the session first and never commit; the request, command or task boundary commits, so an
import is one transaction: it lands whole or not at all.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Boolean, Connection, Integer, String, insert, select, table
from sqlalchemy import column as sql_column
from sqlalchemy.orm import Session

from services.catalog.gpus import find_gpu, gpu_specs
from services.catalog.market import Market
from services.catalog.offers import Offer, bundled_offers
from services.catalog.pricelist import PriceListError, offer_key, overlay_key, parse_price_list, parse_rows
from services.catalog.repository import CatalogRepository
from services.catalog.tables import CatalogFeed, CatalogVersion, GpuOfferRow
from services.core.db import UtcDateTime, new_id, utcnow
from services.core.errors import Unprocessable, listed

log = logging.getLogger("gpuplan.catalog")

# Older versions are kept for a look back (and a manual rollback); beyond this many per owner they go.
KEEP_INACTIVE_VERSIONS = 20

# The columns of gpu_offers that carry an offer (beside id and version_id), in Offer's field order.
OFFER_COLUMNS = (
    "provider",
    "gpu",
    "gpu_memory_gib",
    "gpus_per_node",
    "on_demand_usd_per_hour",
    "spot_usd_per_hour",
    "currency",
    "region",
    "country",
    "interconnect",
    "fetched_at",
    "source",
    "whole_nodes_only",
    "inter_node_gbit_per_s",
    "billing_increment_s",
    "billing_minimum_s",
    "startup_s",
    "download_gbit_per_s",
    "preemption_per_hour",
    "host_ram_gib_per_node",
)


@dataclass(frozen=True)
class ImportResult:
    """What an import did: the new version, and how many offers it added, updated, kept and removed."""

    version: CatalogVersion
    added: int
    updated: int
    kept: int
    removed: int

    def summary(self) -> dict[str, Any]:
        return {
            "version": self.version.id,
            "rows": self.version.rows,
            "added": self.added,
            "updated": self.updated,
            "kept": self.kept,
            "removed": self.removed,
            "catalog": "public" if self.version.organization_id is None else "organization",
        }


def offer_values(offer: Offer) -> dict[str, Any]:
    """The gpu_offers column values of an offer (the card's memory is looked up for the list filters)."""
    values = {name: getattr(offer, name) for name in OFFER_COLUMNS if name != "gpu_memory_gib"}
    values["gpu_memory_gib"] = find_gpu(offer.gpu).memory_gib
    return values


def seed_bundled_offers(bind: Connection, offer_columns: Sequence[str], source: str) -> None:
    """Insert the bundled price list as the active public offers version, writing only ``offer_columns``.

    Used by migrations, which name the columns that exist at their revision (an ORM insert would write the
    columns of today's models, which an older revision does not have yet).
    """
    offers = bundled_offers()
    versions = _versions_table()
    offers_table = table("gpu_offers", *(sql_column(c) for c in ("id", "version_id", *offer_columns)))
    version_id = new_id()
    bind.execute(
        insert(versions).values(
            id=version_id, kind="offers", source=source, rows=len(offers), active=True, created_at=utcnow()
        )
    )
    rows = []
    for offer in offers:
        values = offer_values(offer)
        rows.append({"id": new_id(), "version_id": version_id, **{c: values[c] for c in offer_columns}})
    if rows:
        bind.execute(insert(offers_table), rows)


def _versions_table() -> Any:
    """catalog_versions as it was at 0001 (typed, so each database gets its own time and boolean format)."""
    return table(
        "catalog_versions",
        sql_column("id", String),
        sql_column("kind", String),
        sql_column("source", String),
        sql_column("rows", Integer),
        sql_column("active", Boolean),
        sql_column("created_at", UtcDateTime()),
    )


SPEC_COLUMNS = (
    "name",
    "memory_gib",
    "bf16_tflops",
    "fp16_tflops",
    "hbm_bandwidth_gb_per_s",
    "nvlink_gb_per_s",
    "pcie_gb_per_s",
    "gpu_class",
    "source",
)


def seed_bundled_specs(bind: Connection, source: str) -> None:
    """Insert the bundled GPU specs as the active specs version (a reference copy; the planner reads the file)."""
    specs = gpu_specs()
    versions = _versions_table()
    specs_table = table("gpu_specs", *(sql_column(c) for c in ("id", "version_id", *SPEC_COLUMNS)))
    version_id = new_id()
    bind.execute(
        insert(versions).values(
            id=version_id, kind="gpus", source=source, rows=len(specs), active=True, created_at=utcnow()
        )
    )
    bind.execute(
        insert(specs_table),
        [{"id": new_id(), "version_id": version_id, **{c: getattr(s, c) for c in SPEC_COLUMNS}} for s in specs],
    )


def _row_offer(r: GpuOfferRow) -> Offer:
    return Offer(
        provider=r.provider,
        gpu=r.gpu,
        gpus_per_node=r.gpus_per_node,
        on_demand_usd_per_hour=r.on_demand_usd_per_hour,
        spot_usd_per_hour=r.spot_usd_per_hour,
        currency=r.currency,
        region=r.region,
        country=r.country,
        interconnect=r.interconnect,
        fetched_at=r.fetched_at,
        source=r.source,
        whole_nodes_only=r.whole_nodes_only,
        inter_node_gbit_per_s=r.inter_node_gbit_per_s,
        billing_increment_s=r.billing_increment_s,
        billing_minimum_s=r.billing_minimum_s,
        startup_s=r.startup_s,
        download_gbit_per_s=r.download_gbit_per_s,
        preemption_per_hour=r.preemption_per_hour,
        host_ram_gib_per_node=r.host_ram_gib_per_node,
    )


def as_offers(rows: Sequence[GpuOfferRow]) -> tuple[Offer, ...]:
    """The planner's offers from catalog rows."""
    return tuple(_row_offer(r) for r in rows)


def _check_provider_names(names: Iterable[str], field: str) -> list[str]:
    out = []
    for name in names:
        name = name.strip()
        if not name or len(name) > 100 or "\x00" in name:
            raise Unprocessable(f"{field}: a provider name of 1-100 characters", field=field)
        out.append(name)
    return out


def _one_spelling(offer: Offer, spelling: dict[str, str]) -> Offer:
    """The offer under its provider's one spelling (recorded in ``spelling`` when it is the first)."""
    name = spelling.setdefault(offer.provider.casefold(), offer.provider)
    return offer if name == offer.provider else dataclasses.replace(offer, provider=name)


def import_offers(
    session: Session,
    offers: Sequence[Offer],
    *,
    source: str,
    organization_id: str | None = None,
    replace_providers: Sequence[str] = (),
    replace_field: str = "replace_provider",
) -> ImportResult:
    """Upsert ``offers`` into the public catalog (or one organization's own) as a new version.

    Offers of every provider not in the import are kept as they are. An offer with the same provider, gpu,
    region and gpus_per_node as an imported one is replaced; the provider's other offers stay, unless the
    provider is named in ``replace_providers``, whose old offers are all dropped first (a provider named
    there but absent from the import is removed from the catalog).
    """
    repo = CatalogRepository(session)
    repo.lock_for_import()
    current = repo.active_version("offers", organization_id)
    old_rows = repo.offers(current.id) if current is not None else []
    known = {r.provider for r in old_rows}
    # One provider, one name: "acme" and "ACME" are the catalog's spelling (or the import's first one).
    spelling = {name.casefold(): name for name in sorted(known)}
    offers = [_one_spelling(o, spelling) for o in offers]
    # Regions in any case too, as the planner's and the quote's filters read them: "EU" over "eu" was added beside it,
    # and every quote of the card then met the two prices and answered a false 409.
    keys = [overlay_key(*offer_key(o)) for o in offers]
    if len(set(keys)) < len(keys):
        twice = next(o for o, k in zip(offers, keys, strict=True) if keys.count(k) > 1)
        raise Unprocessable(
            f"price_list: the offer {twice.provider} {twice.gpu} x{twice.gpus_per_node} region {twice.region!r} "
            "appears twice (provider or region names differing only in case are one)",
            field="price_list",
        )
    replace = {spelling.get(n.casefold(), n) for n in _check_provider_names(replace_providers, replace_field)}
    unknown = sorted(replace - known - {o.provider for o in offers})
    if unknown:
        allowed = ", ".join(sorted(known)) or "none"
        raise Unprocessable(
            f"{replace_field}: no offers of {', '.join(unknown)}; providers in this catalog: {allowed}",
            field=replace_field,
        )
    incoming = set(keys)
    kept: list[dict[str, Any]] = []
    updated = removed = 0
    for r in old_rows:
        if overlay_key(r.provider, r.gpu, r.region, r.gpus_per_node) in incoming:
            updated += 1
        elif r.provider in replace:
            removed += 1
        else:
            kept.append({name: getattr(r, name) for name in OFFER_COLUMNS})
    new_values = kept + [offer_values(o) for o in offers]
    version = repo.add_version(
        CatalogVersion(kind="offers", source=source[:500], rows=len(new_values), organization_id=organization_id),
        new_values,
    )
    repo.prune_inactive("offers", organization_id, KEEP_INACTIVE_VERSIONS)
    return ImportResult(version=version, added=len(offers) - updated, updated=updated, kept=len(kept), removed=removed)


def remove_providers(
    session: Session, providers: Sequence[str], *, source: str, organization_id: str | None = None
) -> ImportResult:
    """Drop every offer of these providers from the public catalog (or the organization's own) as a new version."""
    if not providers:
        raise Unprocessable("provider: name at least one provider to remove", field="provider")
    return import_offers(
        session,
        [],
        source=source,
        organization_id=organization_id,
        replace_providers=providers,
        replace_field="provider",
    )


def _rejected(exc: PriceListError) -> Unprocessable:
    return Unprocessable(
        f"price list rejected: {len(exc.problems)} problem(s); nothing was imported",
        field="price_list",
        details=listed(exc.problems),
    )


def import_price_list(
    session: Session,
    text: str,
    fmt: str,
    source: str,
    *,
    organization_id: str | None = None,
    replace_providers: Sequence[str] = (),
) -> ImportResult:
    """Validate the whole file first; a single bad row rejects it (422 with every row's problem)."""
    try:
        offers = parse_price_list(text, fmt)
    except PriceListError as exc:
        raise _rejected(exc) from None
    return import_offers(
        session, offers, source=source, organization_id=organization_id, replace_providers=replace_providers
    )


def import_price_list_file(
    session: Session, path: Path, *, organization_id: str | None = None, replace_providers: Sequence[str] = ()
) -> ImportResult:
    fmt = "json" if path.suffix.lower() == ".json" else "csv"
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise Unprocessable(f"{path.name}: a price list must be UTF-8 text", field="file") from None
    return import_price_list(
        session,
        text,
        fmt,
        f"file: {path.name}",
        organization_id=organization_id,
        replace_providers=replace_providers,
    )


def active_offers(session: Session, organization_id: str | None = None, **filters: Any) -> list[GpuOfferRow]:
    """The offers an organization plans on: the public catalog with the organization's own offers laid over
    it (an own offer replaces the public one with the same provider, gpu, region and gpus_per_node, provider and
    region in any case: pricelist.overlay_key). Without an organization: the public catalog alone. ``filters`` are those
    of CatalogRepository.offers."""
    repo = CatalogRepository(session)
    public = repo.active_version("offers", None)
    rows: list[GpuOfferRow] = list(repo.offers(public.id, **filters)) if public is not None else []
    if organization_id is None:
        return rows
    own = repo.active_version("offers", organization_id)
    if own is None:
        return rows
    own_keys = {overlay_key(*k) for k in repo.offer_keys(own.id)}
    merged = [r for r in rows if overlay_key(r.provider, r.gpu, r.region, r.gpus_per_node) not in own_keys]
    merged.extend(repo.offers(own.id, **filters))
    merged.sort(key=lambda r: (r.on_demand_usd_per_hour, r.id))
    return merged


def own_version_id(session: Session, organization_id: str | None) -> str | None:
    """The id of the organization's own active offers version (its rows are its own prices)."""
    if organization_id is None:
        return None
    own = CatalogRepository(session).active_version("offers", organization_id)
    return own.id if own is not None else None


# Catalog versions never change once written (an import writes a new one), so the planner's offers of a
# (public version, own version) pair are computed once per process and shared: loading 5,000 offers
# through the ORM costs 250-450 ms on the 2-core machine, the cache lookup two indexed queries.
_OFFERS_CACHE: dict[tuple[str | None, str | None], Market] = {}
_OFFERS_CACHE_SIZE = 64
_OFFERS_CACHE_LOCK = threading.Lock()


def _version_offers(session: Session, version_id: str) -> list[Offer]:
    """A version's offers priced in dollars. Every price gpuplan works out is USD and it holds no exchange rate, so
    a row stored in another currency before imports refused them (services.catalog.pricelist) is left out, with a
    warning, rather than ranked and quoted with its number read as dollars."""
    table = GpuOfferRow.__table__
    names = [n for n in OFFER_COLUMNS if n != "gpu_memory_gib"]
    rows = session.execute(select(*(table.c[n] for n in names)).where(table.c.version_id == version_id)).all()
    offers = [Offer(**dict(zip(names, row, strict=True))) for row in rows]
    other = sorted({o.currency for o in offers if o.currency.upper() != "USD"})
    if other:
        kept = [o for o in offers if o.currency.upper() == "USD"]
        log.warning(
            "catalog version %s: %d offer(s) priced in %s left out of planning and quotes (prices are USD only)",
            version_id,
            len(offers) - len(kept),
            ", ".join(other),
        )
        return kept
    return offers


def catalog_offers(session: Session, organization_id: str | None = None) -> Market:
    """The planner's offers for an organization (the public catalog with its own offers laid over it), or
    the public catalog alone; cheapest on demand first. Cached per version as a Market, so the columns plans
    read of the offers are read once per version."""
    repo = CatalogRepository(session)
    public = repo.active_version("offers", None)
    own = repo.active_version("offers", organization_id) if organization_id is not None else None
    key = (public.id if public else None, own.id if own else None)
    cached = _OFFERS_CACHE.get(key)
    if cached is not None:
        return cached
    offers = _version_offers(session, public.id) if public is not None else []
    if own is not None:
        mine = _version_offers(session, own.id)
        own_keys = {overlay_key(*offer_key(o)) for o in mine}
        offers = [o for o in offers if overlay_key(*offer_key(o)) not in own_keys] + mine
    result = Market(sorted(offers, key=lambda o: (o.on_demand_usd_per_hour, offer_key(o))))
    with _OFFERS_CACHE_LOCK:
        if len(_OFFERS_CACHE) >= _OFFERS_CACHE_SIZE:
            _OFFERS_CACHE.pop(next(iter(_OFFERS_CACHE)))
        _OFFERS_CACHE[key] = result
    # The cached offers live as long as the process: the cyclic garbage collector stops scanning them
    # (gc.freeze, as the API does for its modules at start). A full collection otherwise walks every offer of
    # every cached version, which made a 70B plan over 5,000 offers about a quarter slower.
    gc.freeze()
    return result


# --- live feeds -------------------------------------------------------------------------------------


def record_feed_success(
    session: Session, provider: str, rows: list[dict[str, Any]], when: datetime, note: str | None = None
) -> ImportResult:
    """Store a provider's freshly fetched offers (replacing all its old public offers) and mark the feed good.

    The rows are validated like any price list; a row the checks refuse fails the whole refresh, which
    then keeps the last good prices (the feed has already skipped such rows, naming them in its note, and
    dropped odd spot prices: FeedOffers.keep).
    """
    try:
        offers = parse_rows(rows, gpu_specs())
    except PriceListError as exc:
        raise FeedDataError(f"{len(exc.problems)} offer(s) failed the price-list checks: {exc.problems[0]}") from None
    stray = sorted({o.provider for o in offers} - {provider})
    if stray:
        raise FeedDataError(f"the {provider} feed returned offers of other providers: {', '.join(stray)}")
    repo = CatalogRepository(session)
    repo.lock_for_import()
    current = repo.active_version("offers", None)
    # In any case, as an import names one provider ("RunPod" from a file is the runpod feed's): matched exactly, a
    # refresh upserted beside the file's offers and left those it no longer lists in the catalog.
    has_old = current is not None and provider.casefold() in {p.casefold() for p in repo.providers(current.id)}
    result = import_offers(
        session,
        offers,
        source=f"feed: {provider} at {when:%Y-%m-%dT%H:%M:%SZ}",
        replace_providers=[provider] if has_old else [],
    )
    feed = _feed(session, provider)
    feed.last_attempt_at = when
    feed.last_success_at = when
    feed.last_error = None
    feed.note = note
    feed.offers = len(offers)
    return result


def record_feed_failure(session: Session, provider: str, error: str, when: datetime) -> datetime | None:
    """Keep the provider's last good prices; remember when and why the fetch failed. Returns when those
    prices were fetched (None: no fetch of this provider ever succeeded, so there are none to keep)."""
    feed = _feed(session, provider)
    feed.last_attempt_at = when
    feed.last_error = error[:2000]
    return feed.last_success_at


def _feed(session: Session, provider: str) -> CatalogFeed:
    feed = CatalogRepository(session).feed(provider)
    if feed is None:
        feed = CatalogFeed(provider=provider, offers=0)
        session.add(feed)
    return feed


def feed_states(session: Session) -> Sequence[CatalogFeed]:
    return CatalogRepository(session).feeds()


class FeedDataError(ValueError):
    """A feed answered, but with offers the catalog cannot take."""
