from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Float, ForeignKey, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from services.core.db import Base, IdMixin, TimestampMixin, UtcDateTime


class QuoteRow(IdMixin, TimestampMixin, Base):
    """An issued quote: a snapshot that is never updated."""

    __tablename__ = "quotes"
    # A retried POST with the same Idempotency-Key answers with the quote it issued (services.quotes.service.issue).
    __table_args__ = (UniqueConstraint("organization_id", "idempotency_key", name="uq_quotes_org_idempotency_key"),)

    organization_id: Mapped[str] = mapped_column(ForeignKey("organizations.id", ondelete="CASCADE"), index=True)
    plan_id: Mapped[str] = mapped_column(ForeignKey("plans.id", ondelete="CASCADE"), index=True)
    setup: Mapped[dict[str, Any]] = mapped_column(JSON)
    line_items: Mapped[list[Any]] = mapped_column(JSON)
    assumptions: Mapped[list[Any]] = mapped_column(JSON)
    total_usd: Mapped[float] = mapped_column(Float)
    currency: Mapped[str] = mapped_column(String(3))
    valid_until: Mapped[datetime] = mapped_column(UtcDateTime)
    customer_name: Mapped[str | None] = mapped_column(String(200), default=None)
    customer_email: Mapped[str | None] = mapped_column(String(320), default=None)
    # What the document shows besides setup and lines: number, model, method, job, notes, the plan's
    # assumptions, the price list's source and date (services.quotes.service.create_quote).
    document: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    idempotency_key: Mapped[str | None] = mapped_column(String(200), default=None)
