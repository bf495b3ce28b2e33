"""The live catalog: seeding from the bundled data files, importing price lists, querying offers."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from sqlalchemy.orm import Session

from services.catalog.gpus import GpuSpec, find_gpu, gpu_specs
from services.catalog.offers import Offer, bundled_offers
from services.catalog.pricelist import PriceListError, parse_price_list
from services.catalog.repository import CatalogRepository
from services.catalog.tables import CatalogVersion, GpuOfferRow, GpuSpecRow
from services.core.errors import Unprocessable


def _offer_row(offer: Offer) -> GpuOfferRow:
    return GpuOfferRow(
        provider=offer.provider,
        gpu=offer.gpu,
        gpu_memory_gib=find_gpu(offer.gpu).memory_gib,
        gpus_per_node=offer.gpus_per_node,
        on_demand_usd_per_hour=offer.on_demand_usd_per_hour,
        spot_usd_per_hour=offer.spot_usd_per_hour,
        currency=offer.currency,
        region=offer.region,
        country=offer.country,
        interconnect=offer.interconnect,
        fetched_at=offer.fetched_at,
        source=offer.source,
    )


def _spec_row(spec: GpuSpec) -> GpuSpecRow:
    return GpuSpecRow(
        name=spec.name,
        memory_gib=spec.memory_gib,
        bf16_tflops=spec.bf16_tflops,
        fp16_tflops=spec.fp16_tflops,
        hbm_bandwidth_gb_per_s=spec.hbm_bandwidth_gb_per_s,
        nvlink_gb_per_s=spec.nvlink_gb_per_s,
        pcie_gb_per_s=spec.pcie_gb_per_s,
        gpu_class=spec.gpu_class,
        source=spec.source,
    )


def seed_bundled(session: Session) -> None:
    """Load the bundled price lists and GPU specs when the database has none yet."""
    repo = CatalogRepository(session)
    if repo.active_version("offers") is None:
        offers = bundled_offers()
        repo.add_version(
            CatalogVersion(kind="offers", source="bundled: services/catalog/data/offers.csv", rows=len(offers)),
            [_offer_row(o) for o in offers],
        )
    if repo.active_version("gpus") is None:
        specs = gpu_specs()
        repo.add_version(
            CatalogVersion(kind="gpus", source="bundled: services/catalog/data/gpus.csv", rows=len(specs)),
            [_spec_row(s) for s in specs],
        )


def import_price_list(session: Session, text: str, fmt: str, source: str) -> CatalogVersion:
    """Validate the whole file first; a single bad row rejects it (422 with every row's problem)."""
    try:
        offers = parse_price_list(text, fmt)
    except PriceListError as exc:
        raise Unprocessable(
            f"price list rejected: {len(exc.problems)} problem(s); nothing was imported",
            field="price_list",
            details=exc.problems,
        ) from None
    return CatalogRepository(session).add_version(
        CatalogVersion(kind="offers", source=source[:500], rows=len(offers)), [_offer_row(o) for o in offers]
    )


def import_price_list_file(session: Session, path: Path) -> CatalogVersion:
    fmt = "json" if path.suffix.lower() == ".json" else "csv"
    return import_price_list(session, path.read_text(encoding="utf-8"), fmt, f"file: {path.name}")


def active_offers(session: Session, **filters: object) -> Sequence[GpuOfferRow]:
    repo = CatalogRepository(session)
    version = repo.active_version("offers")
    if version is None:
        return []
    return repo.offers(version.id, **filters)  # type: ignore[arg-type]


def as_offers(rows: Sequence[GpuOfferRow]) -> tuple[Offer, ...]:
    return tuple(
        Offer(
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
        )
        for r in rows
    )
