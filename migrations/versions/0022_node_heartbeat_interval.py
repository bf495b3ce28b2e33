"""nodes: heartbeat_interval_s, the seconds the agent declares between heartbeats (idle time accrues only across
gaps its cadence allows, at a heartbeat and at a sweep alike: services/nodes/idle.py cadence_gap_s)

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-06 17:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("heartbeat_interval_s", sa.Float(), nullable=False, server_default="15"))


def downgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_column("heartbeat_interval_s")
