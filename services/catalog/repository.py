from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from services.catalog.tables import CatalogVersion, GpuOfferRow, GpuSpecRow


class CatalogRepository:
    def __init__(self, session: Session) -> None:
        self.session = session

    def active_version(self, kind: str) -> CatalogVersion | None:
        return self.session.scalar(
            select(CatalogVersion)
            .where(CatalogVersion.kind == kind, CatalogVersion.active.is_(True))
            .order_by(CatalogVersion.created_at.desc())
            .limit(1)
        )

    def add_version(self, version: CatalogVersion, rows: Sequence[GpuOfferRow | GpuSpecRow]) -> CatalogVersion:
        self.session.execute(update(CatalogVersion).where(CatalogVersion.kind == version.kind).values(active=False))
        self.session.add(version)
        self.session.flush()
        for row in rows:
            row.version_id = version.id
        self.session.add_all(rows)
        self.session.flush()
        return version

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
