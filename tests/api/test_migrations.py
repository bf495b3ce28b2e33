"""Migrations build the schema on both databases, and the models match them (alembic check)."""

from __future__ import annotations

from typing import Any

from alembic import command
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect, text

from services.core.db import make_engine, make_sessionmaker, unit_of_work
from services.core.migrate import alembic_config, upgrade
from services.orgs.repository import OrganizationRepository
from services.orgs.service import create_organization


def test_migrations_apply_and_match_the_models(database_url: str) -> None:
    upgrade(database_url)
    command.check(alembic_config(database_url))  # raises if the models and the migrations differ
    tables = set(inspect(create_engine(database_url)).get_table_names())
    assert {"organizations", "api_keys", "plans", "quotes", "gpu_offers", "gpu_specs", "catalog_versions"} <= tables


def _schema(url: str) -> dict[str, Any]:
    """Every table with its columns, primary key, indexes, unique constraints and foreign keys."""
    engine = create_engine(url)
    try:
        inspector = inspect(engine)
        schema: dict[str, Any] = {}
        for table in sorted(inspector.get_table_names()):
            schema[table] = {
                "columns": [(c["name"], str(c["type"]), c["nullable"]) for c in inspector.get_columns(table)],
                "primary_key": inspector.get_pk_constraint(table)["constrained_columns"],
                "indexes": sorted(
                    (i["name"], tuple(i["column_names"]), i["unique"]) for i in inspector.get_indexes(table)
                ),
                "unique": sorted(
                    (u["name"], tuple(u["column_names"])) for u in inspector.get_unique_constraints(table)
                ),
                "foreign_keys": sorted(
                    (f["name"], tuple(f["constrained_columns"]), f["referred_table"])
                    for f in inspector.get_foreign_keys(table)
                ),
            }
        return schema
    finally:
        engine.dispose()


def _revision(url: str) -> list[str]:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return [row[0] for row in connection.execute(text("SELECT version_num FROM alembic_version"))]
    finally:
        engine.dispose()


def test_upgrade_is_idempotent(database_url: str) -> None:
    upgrade(database_url)
    head = ScriptDirectory.from_config(alembic_config(database_url)).get_heads()
    schema, revision = _schema(database_url), _revision(database_url)
    factory = make_sessionmaker(make_engine(database_url))
    with unit_of_work(factory) as session:
        create_organization(session, "kept")
    upgrade(database_url)
    # A second upgrade is a no-op: same schema at the same single head revision, the data untouched.
    assert revision == head and len(head) == 1
    assert _revision(database_url) == revision
    assert _schema(database_url) == schema
    assert "organizations" in schema and len(schema) >= 7
    with unit_of_work(factory) as session:
        assert OrganizationRepository(session).by_name("kept") is not None
    command.check(alembic_config(database_url))


def _bundled_host_ram(url: str) -> dict[tuple[str, str], float | None]:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            rows = connection.execute(
                text(
                    "SELECT o.provider, o.gpu, o.host_ram_gib_per_node FROM gpu_offers o "
                    "JOIN catalog_versions v ON v.id = o.version_id WHERE v.active = :yes AND v.kind = 'offers'"
                ),
                {"yes": True},
            ).all()
        return {(p, g): r for p, g, r in rows}
    finally:
        engine.dispose()


def test_0013_adds_host_ram_and_reseeds_the_bundled_list_and_downgrades(database_url: str) -> None:
    config = alembic_config(database_url)
    command.upgrade(config, "0012")
    columns = {c["name"] for c in inspect(create_engine(database_url)).get_columns("gpu_offers")}
    assert "host_ram_gib_per_node" not in columns
    command.upgrade(config, "head")
    ram = _bundled_host_ram(database_url)
    # Still on the bundled list: it comes back with the host RAM of its AWS nodes (p5.48xlarge, g5.48xlarge);
    # cloudrux's is unknown.
    assert ram[("aws", "H100 SXM")] == 2048.0 and ram[("aws", "A10G")] == 768.0
    assert ram[("cloudrux", "H100 SXM")] is None
    command.downgrade(config, "0012")
    columns = {c["name"] for c in inspect(create_engine(database_url)).get_columns("gpu_offers")}
    assert "host_ram_gib_per_node" not in columns
    command.upgrade(config, "head")
    command.check(config)


def test_0020_replaces_a_bundled_list_that_still_holds_the_demo_provider(database_url: str) -> None:
    config = alembic_config(database_url)
    command.upgrade(config, "0019")
    engine = create_engine(database_url)
    try:
        with engine.begin() as conn:
            version = conn.execute(
                text(
                    "SELECT id FROM catalog_versions "
                    "WHERE kind = 'offers' AND active = :yes AND organization_id IS NULL"
                ),
                {"yes": True},
            ).scalar_one()
            # As a database seeded before the snapshot is: the old list's demo provider among its rows.
            conn.execute(
                text(
                    "INSERT INTO gpu_offers (id, version_id, provider, gpu, gpu_memory_gib, gpus_per_node, "
                    "on_demand_usd_per_hour, currency, region, country, interconnect, fetched_at, source, "
                    "whole_nodes_only) VALUES ('demo0000000000000000000000000000', :v, 'example-cloud', 'A100 80GB', "
                    "80, 8, 1.5, 'USD', '', '', '', '2026-11-01', 'old', :no)"
                ),
                {"v": version, "no": False},
            )
        command.upgrade(config, "head")
        with engine.connect() as conn:
            providers = set(
                conn.execute(
                    text(
                        "SELECT o.provider FROM gpu_offers o JOIN catalog_versions v ON o.version_id = v.id "
                        "WHERE v.kind = 'offers' AND v.active = :yes AND v.organization_id IS NULL"
                    ),
                    {"yes": True},
                ).scalars()
            )
        assert "example-cloud" not in providers and {"aws", "gcp", "azure", "lambda", "runpod", "vast"} <= providers
    finally:
        engine.dispose()
