"""catalog: a database still on the old bundled price list (with its "example-cloud" demo provider) gets
the bundled snapshot of real providers' list prices as a new version; nothing else changes

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-02 15:20:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

BUNDLED_SOURCE = "bundled: services/catalog/data/offers.csv"

# The gpu_offers columns at this revision (later revisions may add more; the seed writes only these).
OFFER_COLUMNS_0020 = (
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


def upgrade() -> None:
    """Only a public catalog that is still the bundled list and still holds example-cloud is replaced (a
    fresh database was seeded with the new snapshot already; an imported or fed catalog is left alone)."""
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
    offers = sa.table("gpu_offers", sa.column("version_id", sa.String), sa.column("provider", sa.String))
    active = bind.execute(
        sa.select(versions.c.id, versions.c.source).where(
            versions.c.kind == "offers", versions.c.active.is_(True), versions.c.organization_id.is_(None)
        )
    ).all()
    if len(active) != 1 or active[0].source != BUNDLED_SOURCE:
        return
    demo = bind.execute(
        sa.select(sa.func.count()).where(offers.c.version_id == active[0].id, offers.c.provider == "example-cloud")
    ).scalar()
    if not demo:
        return
    bind.execute(sa.update(versions).where(versions.c.id == active[0].id).values(active=False))
    seed_bundled_offers(bind, OFFER_COLUMNS_0020, BUNDLED_SOURCE)


def downgrade() -> None:
    """The snapshot stays: prices are data, and the older list's demo provider is not restored."""
