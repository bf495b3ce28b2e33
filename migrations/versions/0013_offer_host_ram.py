"""catalog: host RAM per node on each offer (Offer schema v2, optional column host_ram_gib_per_node)

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01 04:20:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

BUNDLED_SOURCE = "bundled: services/catalog/data/offers.csv"


def upgrade() -> None:
    with op.batch_alter_table("gpu_offers", schema=None) as batch_op:
        batch_op.add_column(sa.Column("host_ram_gib_per_node", sa.Float(), nullable=True))
    _reseed_bundled_offers()


def _reseed_bundled_offers() -> None:
    """A database still on the bundled price list gets it again with its host RAM, as a new version; an
    imported or fed catalog is left alone (its RAM stays unknown until its next import or refresh)."""
    from services.catalog.service import seed_bundled_offers

    bind = op.get_bind()
    versions = sa.table(
        "catalog_versions",
        sa.column("id", sa.String),
        sa.column("kind", sa.String),
        sa.column("source", sa.String),
        sa.column("active", sa.Boolean),
        sa.column("organization_id", sa.String),
    )
    active = bind.execute(
        sa.select(versions.c.id, versions.c.source).where(
            versions.c.kind == "offers", versions.c.active.is_(True), versions.c.organization_id.is_(None)
        )
    ).all()
    if len(active) != 1 or active[0].source != BUNDLED_SOURCE:
        return
    bind.execute(sa.update(versions).where(versions.c.id == active[0].id).values(active=False))
    seed_bundled_offers(bind, OFFER_COLUMNS_0013, BUNDLED_SOURCE)


# The gpu_offers columns at this revision (later revisions may add more; the seed writes only these).
OFFER_COLUMNS_0013 = (
    "provider",
    "gpu",
    "gpu_memory_gib",
    "gpus_per_node",
    "on_demand_usd_per_hour",
    "spot_usd_per_hour",
    "currency",
    "region",
    "country",
    "interconnect",
    "fetched_at",
    "source",
    "whole_nodes_only",
    "inter_node_gbit_per_s",
    "billing_increment_s",
    "billing_minimum_s",
    "startup_s",
    "download_gbit_per_s",
    "preemption_per_hour",
    "host_ram_gib_per_node",
)


def downgrade() -> None:
    with op.batch_alter_table("gpu_offers", schema=None) as batch_op:
        batch_op.drop_column("host_ram_gib_per_node")
