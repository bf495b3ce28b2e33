"""keys: scopes, expiry, node/run binding, rotation; dashboard sessions; audit log

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01 01:50:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.add_column(sa.Column("name", sa.String(length=100), nullable=True))
        batch_op.add_column(sa.Column("scopes", sa.String(length=100), server_default="read,plan", nullable=False))
        batch_op.add_column(sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("node_id", sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column("run_id", sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column("rotated_from_id", sa.String(length=32), nullable=True))
    # Existing admin keys keep what they could do.
    op.execute("UPDATE api_keys SET scopes = 'read,plan,admin' WHERE admin")
    op.create_table(
        "dashboard_sessions",
        sa.Column("session_hash", sa.String(length=64), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_dashboard_sessions")),
        sa.UniqueConstraint("session_hash", name=op.f("uq_dashboard_sessions_session_hash")),
    )
    op.create_table(
        "audit_events",
        sa.Column("organization_id", sa.String(length=32), nullable=True),
        sa.Column("actor", sa.String(length=100), nullable=False),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column("target", sa.String(length=200), nullable=True),
        sa.Column("remote_addr", sa.String(length=64), nullable=True),
        sa.Column("detail", sa.JSON(), nullable=True),
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_events")),
    )
    with op.batch_alter_table("audit_events", schema=None) as batch_op:
        batch_op.create_index("ix_audit_events_org_created", ["organization_id", "created_at", "id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("audit_events", schema=None) as batch_op:
        batch_op.drop_index("ix_audit_events_org_created")
    op.drop_table("audit_events")
    op.drop_table("dashboard_sessions")
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        for column in ("rotated_from_id", "run_id", "node_id", "expires_at", "scopes", "name"):
            batch_op.drop_column(column)
