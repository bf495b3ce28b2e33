"""calibration that cannot poison: the GPU NVML reported per node; per result the GPU count, whether the
measured device was verified, whether the result is used and why not

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-01 23:50:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

LEGACY_REASON = (
    "stored before the server checked the measured device against the node's NVML report (migration 0015): "
    "calibrate again"
)


def upgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("gpu_nvml", sa.String(length=100), server_default="", nullable=False))
    with op.batch_alter_table("benchmark_results", schema=None) as batch_op:
        batch_op.add_column(sa.Column("gpu_count", sa.Integer(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("verified", sa.Boolean(), server_default=sa.false(), nullable=False))
        batch_op.add_column(sa.Column("used", sa.Boolean(), server_default=sa.false(), nullable=False))
        batch_op.add_column(sa.Column("unused_reason", sa.Text(), nullable=True))
    # Nothing recorded what NVML said for the nodes of earlier results (a CPU host registered with --gpu was
    # stored as that GPU), so none is trusted; they stay listed with the reason.
    results = sa.table("benchmark_results", sa.column("unused_reason", sa.Text()))
    op.execute(results.update().values(unused_reason=LEGACY_REASON))


def downgrade() -> None:
    with op.batch_alter_table("benchmark_results", schema=None) as batch_op:
        batch_op.drop_column("unused_reason")
        batch_op.drop_column("used")
        batch_op.drop_column("verified")
        batch_op.drop_column("gpu_count")
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_column("gpu_nvml")
