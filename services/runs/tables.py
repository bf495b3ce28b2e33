from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from services.core.db import Base, IdMixin, TimestampMixin, UtcDateTime


class RunRow(IdMixin, TimestampMixin, Base):
    """A plan being executed on one or more nodes, with its checkpoint schedule."""

    __tablename__ = "runs"

    organization_id: Mapped[str] = mapped_column(ForeignKey("organizations.id", ondelete="CASCADE"), index=True)
    plan_id: Mapped[str] = mapped_column(ForeignKey("plans.id", ondelete="CASCADE"), index=True)
    node_ids: Mapped[list[Any]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16), default="active")  # active, finished
    bucket: Mapped[str] = mapped_column(String(255))
    prefix: Mapped[str] = mapped_column(String(1024))
    checkpoint_dir: Mapped[str] = mapped_column(Text)
    spot: Mapped[bool] = mapped_column(Boolean, default=False)
    preemptions_per_node_hour: Mapped[float] = mapped_column(Float)
    upload_bytes_per_s: Mapped[float | None] = mapped_column(Float, default=None)  # measured by the node
    schedule: Mapped[dict[str, Any]] = mapped_column(JSON)
    retention: Mapped[dict[str, Any]] = mapped_column(JSON)
    last_durable_step: Mapped[int | None] = mapped_column(Integer, default=None)
    progress_step: Mapped[int | None] = mapped_column(Integer, default=None)
    progress_loss: Mapped[float | None] = mapped_column(Float, default=None)
    progress_at: Mapped[datetime | None] = mapped_column(UtcDateTime, default=None)


class CheckpointRow(IdMixin, TimestampMixin, Base):
    """A durable checkpoint (its manifest is in the bucket) or one retention deleted."""

    __tablename__ = "checkpoints"
    __table_args__ = (UniqueConstraint("run_id", "step", name="uq_checkpoints_run_step"),)

    organization_id: Mapped[str] = mapped_column(ForeignKey("organizations.id", ondelete="CASCADE"), index=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    step: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16), default="durable")  # durable, deleted
    manifest: Mapped[dict[str, Any]] = mapped_column(JSON)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    metric: Mapped[float | None] = mapped_column(Float, default=None)
    final: Mapped[bool] = mapped_column(Boolean, default=False)
    deleted_at: Mapped[datetime | None] = mapped_column(UtcDateTime, default=None)
