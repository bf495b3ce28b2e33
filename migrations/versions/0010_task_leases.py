"""task leases (the outbox of background tasks); the keyset index and summary column of plan lists

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 01:45:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "task_leases",
        sa.Column("task_name", sa.String(length=100), nullable=False),
        sa.Column("subject_id", sa.String(length=64), nullable=False),
        sa.Column("args", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("owner", sa.String(length=200), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("deliveries", sa.Integer(), server_default="0", nullable=False),
        sa.Column("expiries", sa.Integer(), server_default="0", nullable=False),
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_task_leases")),
        sa.UniqueConstraint("task_name", "subject_id", name="uq_task_leases_task_subject"),
    )
    with op.batch_alter_table("task_leases", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_task_leases_lease_expires_at"), ["lease_expires_at"], unique=False)
    with op.batch_alter_table("plans", schema=None) as batch_op:
        batch_op.add_column(sa.Column("cheapest", sa.JSON(), nullable=True))
        batch_op.create_index("ix_plans_org_created_id", ["organization_id", "created_at", "id"], unique=False)
    # Fill the summary column of the plans already done.
    plans = sa.table(
        "plans", sa.column("id", sa.String), sa.column("recommendations", sa.JSON), sa.column("cheapest", sa.JSON)
    )
    connection = op.get_bind()
    done = connection.execute(
        sa.select(plans.c.id, plans.c.recommendations).where(plans.c.recommendations.is_not(None))
    )
    for plan_id, recommendations in done.all():
        if recommendations:
            connection.execute(plans.update().where(plans.c.id == plan_id).values(cheapest=recommendations[0]))


def downgrade() -> None:
    with op.batch_alter_table("plans", schema=None) as batch_op:
        batch_op.drop_index("ix_plans_org_created_id")
        batch_op.drop_column("cheapest")
    with op.batch_alter_table("task_leases", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_task_leases_lease_expires_at"))
    op.drop_table("task_leases")
