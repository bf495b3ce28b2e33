"""nodes: drop sync_alerted_at, which nothing read (when a sync alert was raised is its sync_alert event's time)

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-02 16:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_column("sync_alerted_at")


def downgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("sync_alerted_at", sa.DateTime(timezone=True), nullable=True))
