"""quotes: the customer it is addressed to, and the document's content (number, job, notes, price list)

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-02 14:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Quotes issued before this revision have no customer and no document: they render from setup and lines.
    with op.batch_alter_table("quotes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("customer_name", sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column("customer_email", sa.String(length=320), nullable=True))
        batch_op.add_column(sa.Column("document", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("quotes", schema=None) as batch_op:
        for column in ("document", "customer_email", "customer_name"):
            batch_op.drop_column(column)
