"""The Hub config cache: a model looked up once is estimated again without the network."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, String
from sqlalchemy.orm import Mapped, mapped_column

from services.core.db import Base, UtcDateTime, utcnow


class HubModelRow(Base):
    """One fetched config.json (public model facts, shared by every organization), keyed by the
    lower-cased repo id, as the Hub's ids are case-insensitive."""

    __tablename__ = "hub_models"

    key: Mapped[str] = mapped_column(String(200), primary_key=True)
    repo_id: Mapped[str] = mapped_column(String(200))
    revision: Mapped[str] = mapped_column(String(64))
    endpoint: Mapped[str] = mapped_column(String(500))
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    checkpoint: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    fetched_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
