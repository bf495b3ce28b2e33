"""quotes: idempotency_key, so a retried POST with the same Idempotency-Key answers with the quote it issued

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-07 02:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("quotes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("idempotency_key", sa.String(length=200), nullable=True))
        batch_op.create_unique_constraint("uq_quotes_org_idempotency_key", ["organization_id", "idempotency_key"])


def downgrade() -> None:
    with op.batch_alter_table("quotes", schema=None) as batch_op:
        batch_op.drop_constraint("uq_quotes_org_idempotency_key", type_="unique")
        batch_op.drop_column("idempotency_key")
