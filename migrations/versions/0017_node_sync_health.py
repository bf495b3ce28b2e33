"""nodes: the agent's checkpoint sync health (last error, failing since, bytes pending, unsynced since, alert)

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-02 14:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

COLUMNS = (
    "sync_error",
    "sync_failing_since",
    "sync_pending_bytes",
    "unsynced_since",
    "sync_alert",
    "sync_alerted_at",
)


def upgrade() -> None:
    # Nodes stored before this revision have reported no sync: healthy, nothing pending.
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("sync_error", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("sync_failing_since", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("sync_pending_bytes", sa.BigInteger(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("unsynced_since", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("sync_alert", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("sync_alerted_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        for name in reversed(COLUMNS):
            batch_op.drop_column(name)
