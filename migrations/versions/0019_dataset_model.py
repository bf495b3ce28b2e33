"""datasets: the model a data set trains (its Hub tokenizer counts the tokens)

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-02 14:40:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Data sets stored before this revision have no model: their counts stay as checked.
    with op.batch_alter_table("datasets", schema=None) as batch_op:
        batch_op.add_column(sa.Column("model", sa.String(length=200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("datasets", schema=None) as batch_op:
        batch_op.drop_column("model")
