from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Boolean, ForeignKey, Index, String, false
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
    name: Mapped[str | None] = mapped_column(String(100), default=None)
    # Comma-separated subset of read, plan, agent, admin (services/orgs/scopes.py).
    scopes: Mapped[str] = mapped_column(String(100), default="read,plan", server_default="read,plan")
    expires_at: Mapped[datetime | None] = mapped_column(UtcDateTime, default=None)
    # An agent key acts for one node (and, when set, one run) only.
    node_id: Mapped[str | None] = mapped_column(String(32), default=None)
    run_id: Mapped[str | None] = mapped_column(String(32), default=None)
    # The key this one replaced (rotation), for the audit trail.
    rotated_from_id: Mapped[str | None] = mapped_column(String(32), default=None)


class DashboardSession(IdMixin, TimestampMixin, Base):
    """A signed-in dashboard session held on the server, so signing out ends it everywhere."""

    __tablename__ = "dashboard_sessions"

    # SHA-256 of the random session id the (signed) cookie carries.
    session_hash: Mapped[str] = mapped_column(String(64), unique=True)
    key_hash: Mapped[str] = mapped_column(String(64))
    expires_at: Mapped[datetime] = mapped_column(UtcDateTime)
    ended_at: Mapped[datetime | None] = mapped_column(UtcDateTime, default=None)


class AuditEvent(IdMixin, TimestampMixin, Base):
    """Who did what, when and from where: key, catalog, node, run and shutdown actions."""

    __tablename__ = "audit_events"
    __table_args__ = (Index("ix_audit_events_org_created", "organization_id", "created_at", "id"),)

    organization_id: Mapped[str | None] = mapped_column(String(32), default=None)
    actor: Mapped[str] = mapped_column(String(100))  # "key:<prefix>", "admin-cli", "system"
    action: Mapped[str] = mapped_column(String(64))  # e.g. key.revoke, node.stop
    target: Mapped[str | None] = mapped_column(String(200), default=None)
    remote_addr: Mapped[str | None] = mapped_column(String(64), default=None)
    detail: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
