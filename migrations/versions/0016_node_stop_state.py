"""nodes: the stop in progress (attempts, next attempt, last provider answer, the sweep's lease)

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-02 10:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nodes stored before this revision have no stop in progress: zero attempts, no lease.
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("stop_attempts", sa.Integer(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("next_stop_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("last_stop_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("last_stop_answer", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("stop_lease_owner", sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column("stop_lease_expires_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        for column in (
            "stop_lease_expires_at",
            "stop_lease_owner",
            "last_stop_answer",
            "last_stop_at",
            "next_stop_at",
            "stop_attempts",
        ):
            batch_op.drop_column(column)
