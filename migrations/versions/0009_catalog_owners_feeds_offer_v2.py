"""catalog: organization price lists, platform-admin keys, live feeds, Offer schema v2 columns

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 01:40:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

BUNDLED_SOURCE = "bundled: services/catalog/data/offers.csv"


def upgrade() -> None:
    op.create_table(
        "catalog_feeds",
        sa.Column("provider", sa.String(length=32), nullable=False),
        sa.Column("last_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_success_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("offers", sa.Integer(), nullable=False),
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_catalog_feeds")),
        sa.UniqueConstraint("provider", name=op.f("uq_catalog_feeds_provider")),
    )
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.add_column(sa.Column("platform_admin", sa.Boolean(), server_default=sa.false(), nullable=False))

    with op.batch_alter_table("catalog_versions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("organization_id", sa.String(length=32), nullable=True))
        batch_op.create_index(batch_op.f("ix_catalog_versions_organization_id"), ["organization_id"], unique=False)
        batch_op.create_foreign_key(
            batch_op.f("fk_catalog_versions_organization_id_organizations"),
            "organizations",
            ["organization_id"],
            ["id"],
            ondelete="CASCADE",
        )

    with op.batch_alter_table("gpu_offers", schema=None) as batch_op:
        batch_op.add_column(sa.Column("whole_nodes_only", sa.Boolean(), server_default=sa.false(), nullable=False))
        batch_op.add_column(sa.Column("inter_node_gbit_per_s", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("billing_increment_s", sa.Integer(), server_default="1", nullable=False))
        batch_op.add_column(sa.Column("billing_minimum_s", sa.Integer(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("startup_s", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("download_gbit_per_s", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("preemption_per_hour", sa.Float(), nullable=True))
        batch_op.alter_column(
            "fetched_at", existing_type=sa.String(length=10), type_=sa.String(length=20), existing_nullable=False
        )
    _reseed_bundled_offers()


def _reseed_bundled_offers() -> None:
    """A database still on the bundled price list gets it again with the v2 columns (billing, nodes,
    network...), as a new version; an imported or fed catalog is left alone."""
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
    seed_bundled_offers(bind, V2_OFFER_COLUMNS, BUNDLED_SOURCE)


# The gpu_offers columns at this revision (later revisions add more; the seed writes only these).
V2_OFFER_COLUMNS = (
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
)


def downgrade() -> None:
    # Organizations' own price lists have no place in the older schema; left in, they would become public.
    op.execute(
        "DELETE FROM gpu_offers WHERE version_id IN (SELECT id FROM catalog_versions WHERE organization_id IS NOT NULL)"
    )
    op.execute("DELETE FROM catalog_versions WHERE organization_id IS NOT NULL")
    with op.batch_alter_table("gpu_offers", schema=None) as batch_op:
        batch_op.alter_column(
            "fetched_at", existing_type=sa.String(length=20), type_=sa.String(length=10), existing_nullable=False
        )
        for name in (
            "preemption_per_hour",
            "download_gbit_per_s",
            "startup_s",
            "billing_minimum_s",
            "billing_increment_s",
            "inter_node_gbit_per_s",
            "whole_nodes_only",
        ):
            batch_op.drop_column(name)
    with op.batch_alter_table("catalog_versions", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("fk_catalog_versions_organization_id_organizations"), type_="foreignkey")
        batch_op.drop_index(batch_op.f("ix_catalog_versions_organization_id"))
        batch_op.drop_column("organization_id")
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.drop_column("platform_admin")
    op.drop_table("catalog_feeds")
