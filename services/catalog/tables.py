"""The live, editable copy of the catalog: versioned price lists and GPU specs."""

from __future__ import annotations

from sqlalchemy import Boolean, Float, ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from services.core.db import Base, IdMixin, TimestampMixin


class CatalogVersion(IdMixin, TimestampMixin, Base):
    """One imported price list or spec table; the newest active version of a kind is in use."""

    __tablename__ = "catalog_versions"

    kind: Mapped[str] = mapped_column(String(16))  # "offers" or "gpus"
    source: Mapped[str] = mapped_column(String(500))
    rows: Mapped[int] = mapped_column(Integer)
    active: Mapped[bool] = mapped_column(Boolean, default=True)


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
    fetched_at: Mapped[str] = mapped_column(String(10))
    source: Mapped[str] = mapped_column(String(500))


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
