"""benchmark results: the calibrated large-GEMM utilisation beside the measured hardware utilisation

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-01 18:40:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Results stored before this revision keep NULL and count with their hardware utilisation
    # (services/nodes/calibration.py).
    with op.batch_alter_table("benchmark_results", schema=None) as batch_op:
        batch_op.add_column(sa.Column("gemm_utilisation", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("benchmark_results", schema=None) as batch_op:
        batch_op.drop_column("gemm_utilisation")
