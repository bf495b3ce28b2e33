"""node agent tokens, proven agent pids, instances tied to one organization, comparable calibrations

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 01:45:00.000000

Nodes registered before this revision have no token: their agents must register again (a restarted
`gpuplan agent` does), and until then no stop is sent for them. Instances are not back-filled from
existing nodes: before this revision any organization could name any instance, so the first
registration after it decides the owner.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "node_instances",
        sa.Column("organization_id", sa.String(length=32), nullable=False),
        sa.Column("instance_id", sa.String(length=200), nullable=False),
        sa.Column("provider", sa.String(length=100), nullable=False),
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["organization_id"],
            ["organizations.id"],
            name=op.f("fk_node_instances_organization_id_organizations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_node_instances")),
        sa.UniqueConstraint("instance_id", name=op.f("uq_node_instances_instance_id")),
    )
    with op.batch_alter_table("node_instances", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_node_instances_organization_id"), ["organization_id"], unique=False)

    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("token_hash", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("agent_verified_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("verified_pid", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("verified_pid_start_ticks", sa.BigInteger(), nullable=True))

    with op.batch_alter_table("benchmark_results", schema=None) as batch_op:
        batch_op.add_column(sa.Column("measured_gpus", sa.Integer(), server_default="1", nullable=False))
        batch_op.add_column(sa.Column("comparable", sa.Boolean(), server_default=sa.true(), nullable=False))
        batch_op.add_column(sa.Column("notes", sa.JSON(), server_default="[]", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("benchmark_results", schema=None) as batch_op:
        batch_op.drop_column("notes")
        batch_op.drop_column("comparable")
        batch_op.drop_column("measured_gpus")

    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_column("verified_pid_start_ticks")
        batch_op.drop_column("verified_pid")
        batch_op.drop_column("agent_verified_at")
        batch_op.drop_column("token_hash")

    with op.batch_alter_table("node_instances", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_node_instances_organization_id"))

    op.drop_table("node_instances")
