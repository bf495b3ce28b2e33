from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from services.core.db import Base, IdMixin, TimestampMixin, UtcDateTime


class PlanRow(IdMixin, TimestampMixin, Base):
    __tablename__ = "plans"
    __table_args__ = (
        UniqueConstraint("organization_id", "idempotency_key", name="uq_plans_org_idempotency_key"),
        # Keyset pagination of an organization's plans, newest first (GET /v1/plans).
        Index("ix_plans_org_created_id", "organization_id", "created_at", "id"),
    )

    organization_id: Mapped[str] = mapped_column(ForeignKey("organizations.id", ondelete="CASCADE"), index=True)
    status: Mapped[str] = mapped_column(String(16), default="queued")  # queued, running, done, failed
    request: Mapped[dict[str, Any]] = mapped_column(JSON)
    model_name: Mapped[str] = mapped_column(String(200))
    method: Mapped[str] = mapped_column(String(16))
    estimate: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    recommendations: Mapped[list[Any] | None] = mapped_column(JSON, default=None)
    # The first recommendation, kept apart so list pages read one small value, not every setup.
    cheapest: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    rejections: Mapped[list[Any] | None] = mapped_column(JSON, default=None)
    warnings: Mapped[list[Any] | None] = mapped_column(JSON, default=None)
    error: Mapped[str | None] = mapped_column(Text, default=None)
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    trace_status: Mapped[str | None] = mapped_column(String(16), default=None)  # queued, running, done, failed
    trace: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    idempotency_key: Mapped[str | None] = mapped_column(String(200), default=None)
    started_at: Mapped[datetime | None] = mapped_column(UtcDateTime, default=None)
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime, default=None)
