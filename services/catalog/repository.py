from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import delete, insert, select, text, update
from sqlalchemy.orm import Session

from services.catalog.tables import CatalogFeed, CatalogVersion, GpuOfferRow


def _owner(organization_id: str | None) -> Any:
    if organization_id is None:
        return CatalogVersion.organization_id.is_(None)
    return CatalogVersion.organization_id == organization_id


# pg_advisory_xact_lock key of catalog imports ("gpuc" in ASCII).
CATALOG_LOCK_KEY = 0x67707563


class CatalogRepository:
    def __init__(self, session: Session) -> None:
        self.session = session

    def lock_for_import(self) -> None:
        """Serialise catalog imports until this transaction ends: two imports that both copied the same
        active version would otherwise lose one another's offers (each makes a new version from its copy)."""
        if self.session.get_bind().dialect.name == "postgresql":
            self.session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": CATALOG_LOCK_KEY})
        else:
            # SQLite has one writer at a time: a write statement first takes that lock (waiting up to the
            # busy timeout) before the import reads the version it copies.
            self.session.execute(update(CatalogVersion).where(CatalogVersion.id.is_(None)).values(active=False))

    def active_version(self, kind: str, organization_id: str | None = None) -> CatalogVersion | None:
        """The version in use: public (``organization_id`` None) or the organization's own."""
        return self.session.scalar(
            select(CatalogVersion)
            .where(CatalogVersion.kind == kind, CatalogVersion.active.is_(True), _owner(organization_id))
            .order_by(CatalogVersion.created_at.desc())
            .limit(1)
        )

    def add_version(self, version: CatalogVersion, offer_values: Sequence[dict[str, Any]]) -> CatalogVersion:
        """Make ``version`` the active one of its kind and owner, with these gpu_offers rows."""
        self.session.execute(
            update(CatalogVersion)
            .where(CatalogVersion.kind == version.kind, _owner(version.organization_id))
            .values(active=False)
        )
        self.session.add(version)
        self.session.flush()
        if offer_values:
            self.session.execute(insert(GpuOfferRow), [{**v, "version_id": version.id} for v in offer_values])
        return version

    def prune_inactive(self, kind: str, organization_id: str | None, keep: int) -> None:
        """Delete the owner's inactive versions beyond the newest ``keep`` (their rows go with them)."""
        old = self.session.scalars(
            select(CatalogVersion.id)
            .where(CatalogVersion.kind == kind, CatalogVersion.active.is_(False), _owner(organization_id))
            .order_by(CatalogVersion.created_at.desc(), CatalogVersion.id)
            .offset(keep)
        ).all()
        if old:
            # Rows first: SQLite enforces the cascade only with foreign keys on, so do not rely on it.
            self.session.execute(delete(GpuOfferRow).where(GpuOfferRow.version_id.in_(old)))
            self.session.execute(delete(CatalogVersion).where(CatalogVersion.id.in_(old)))

    def offers(
        self,
        version_id: str,
        *,
        provider: str | None = None,
        gpu: str | None = None,
        region: str | None = None,
        min_memory_gib: float | None = None,
        max_usd_per_hour: float | None = None,
        spot: bool | None = None,
    ) -> Sequence[GpuOfferRow]:
        query = select(GpuOfferRow).where(GpuOfferRow.version_id == version_id)
        if provider:
            query = query.where(GpuOfferRow.provider == provider)
        if gpu:
            query = query.where(GpuOfferRow.gpu == gpu)
        if region:
            query = query.where((GpuOfferRow.region == region) | (GpuOfferRow.country == region.upper()))
        if min_memory_gib is not None:
            query = query.where(GpuOfferRow.gpu_memory_gib >= min_memory_gib)
        if max_usd_per_hour is not None:
            query = query.where(GpuOfferRow.on_demand_usd_per_hour <= max_usd_per_hour)
        if spot is True:
            query = query.where(GpuOfferRow.spot_usd_per_hour.is_not(None))
        return self.session.scalars(query.order_by(GpuOfferRow.on_demand_usd_per_hour, GpuOfferRow.id)).all()

    def offer_keys(self, version_id: str) -> set[tuple[str, str, str, int]]:
        rows = self.session.execute(
            select(GpuOfferRow.provider, GpuOfferRow.gpu, GpuOfferRow.region, GpuOfferRow.gpus_per_node).where(
                GpuOfferRow.version_id == version_id
            )
        ).all()
        return {(p, g, r, n) for p, g, r, n in rows}

    def providers(self, version_id: str) -> set[str]:
        return set(
            self.session.scalars(
                select(GpuOfferRow.provider).where(GpuOfferRow.version_id == version_id).distinct()
            ).all()
        )

    def feed(self, provider: str) -> CatalogFeed | None:
        return self.session.scalar(select(CatalogFeed).where(CatalogFeed.provider == provider))

    def feeds(self) -> Sequence[CatalogFeed]:
        return self.session.scalars(select(CatalogFeed).order_by(CatalogFeed.provider)).all()
