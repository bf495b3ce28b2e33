from __future__ import annotations

from datetime import datetime

from sqlalchemy import Boolean, ForeignKey, String, false
from sqlalchemy.orm import Mapped, mapped_column

from services.core.db import Base, IdMixin, TimestampMixin, UtcDateTime


class Organization(IdMixin, TimestampMixin, Base):
    __tablename__ = "organizations"

    name: Mapped[str] = mapped_column(String(100), unique=True)


class ApiKey(IdMixin, TimestampMixin, Base):
    __tablename__ = "api_keys"

    organization_id: Mapped[str] = mapped_column(ForeignKey("organizations.id", ondelete="CASCADE"), index=True)
    # The key itself is shown once; only its SHA-256 is stored (keys are 256-bit random, so a fast
    # hash is enough: there is nothing to brute-force).
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    admin: Mapped[bool] = mapped_column(Boolean, default=False)
    # The platform admin manages the public catalog every organization plans on. Only the server's
    # own CLI (`gpuplan admin create-key --platform-admin`, direct database access) can mint such a key.
    platform_admin: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    revoked_at: Mapped[datetime | None] = mapped_column(UtcDateTime, default=None)
