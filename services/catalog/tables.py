"""The live, editable copy of the catalog: versioned price lists and GPU specs, public or one
organization's own, and the state of each provider's live price feed."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Boolean, Float, ForeignKey, Integer, String, Text, false
from sqlalchemy.orm import Mapped, mapped_column

import services.orgs.tables  # noqa: F401  (catalog_versions.organization_id refers to organizations)
from services.core.db import Base, IdMixin, TimestampMixin, UtcDateTime


class CatalogVersion(IdMixin, TimestampMixin, Base):
    """One imported price list or spec table; the newest active version of a kind (per owner) is in use.

    ``organization_id`` None is the public catalog every organization plans on (managed by the platform
    admin); a set ``organization_id`` is that organization's own negotiated prices, laid over the public
    ones for it alone.
    """

    __tablename__ = "catalog_versions"

    kind: Mapped[str] = mapped_column(String(16))  # "offers" or "gpus"
    source: Mapped[str] = mapped_column(String(500))
    rows: Mapped[int] = mapped_column(Integer)
    active: Mapped[bool] = mapped_column(Boolean, default=True)
    organization_id: Mapped[str | None] = mapped_column(
        ForeignKey("organizations.id", ondelete="CASCADE"), index=True, default=None
    )


class GpuOfferRow(IdMixin, Base):
    __tablename__ = "gpu_offers"

    version_id: Mapped[str] = mapped_column(ForeignKey("catalog_versions.id", ondelete="CASCADE"), index=True)
    provider: Mapped[str] = mapped_column(String(100), index=True)
    gpu: Mapped[str] = mapped_column(String(100), index=True)
    gpu_memory_gib: Mapped[float] = mapped_column(Float)
    gpus_per_node: Mapped[int] = mapped_column(Integer)
    on_demand_usd_per_hour: Mapped[float] = mapped_column(Float)
    spot_usd_per_hour: Mapped[float | None] = mapped_column(Float, nullable=True)
    currency: Mapped[str] = mapped_column(String(3))
    region: Mapped[str] = mapped_column(String(100))
    country: Mapped[str] = mapped_column(String(2))
    interconnect: Mapped[str] = mapped_column(String(100))
    # An ISO date "YYYY-MM-DD" (price lists) or a UTC time "YYYY-MM-DDTHH:MM:SSZ" (live feeds).
    fetched_at: Mapped[str] = mapped_column(String(20))
    source: Mapped[str] = mapped_column(String(500))
    # Offer schema v2 (services/catalog/offers.py documents each field).
    whole_nodes_only: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    inter_node_gbit_per_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    billing_increment_s: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    billing_minimum_s: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    startup_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    download_gbit_per_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    preemption_per_hour: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Host RAM of one node of gpus_per_node GPUs (GiB); None: unknown.
    host_ram_gib_per_node: Mapped[float | None] = mapped_column(Float, nullable=True)


class GpuSpecRow(IdMixin, Base):
    __tablename__ = "gpu_specs"

    version_id: Mapped[str] = mapped_column(ForeignKey("catalog_versions.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(100))
    memory_gib: Mapped[float] = mapped_column(Float)
    bf16_tflops: Mapped[float | None] = mapped_column(Float, nullable=True)
    fp16_tflops: Mapped[float] = mapped_column(Float)
    hbm_bandwidth_gb_per_s: Mapped[float] = mapped_column(Float)
    nvlink_gb_per_s: Mapped[float] = mapped_column(Float)
    pcie_gb_per_s: Mapped[float] = mapped_column(Float)
    gpu_class: Mapped[str] = mapped_column(String(32))
    source: Mapped[str] = mapped_column(String(1000))


class CatalogFeed(IdMixin, Base):
    """The last refresh of one provider's live price feed: when it last succeeded, and the last error.

    A failed fetch records its error here and leaves the provider's last good prices in the catalog.
    """

    __tablename__ = "catalog_feeds"

    provider: Mapped[str] = mapped_column(String(32), unique=True)
    last_attempt_at: Mapped[datetime | None] = mapped_column(UtcDateTime, default=None)
    last_success_at: Mapped[datetime | None] = mapped_column(UtcDateTime, default=None)
    last_error: Mapped[str | None] = mapped_column(Text, default=None)
    # What the last good fetch left out (offers of cards gpuplan has no spec for).
    note: Mapped[str | None] = mapped_column(Text, default=None)
    offers: Mapped[int] = mapped_column(Integer, default=0)
