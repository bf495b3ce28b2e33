"""Migrations build the schema on both databases, and the models match them (alembic check)."""

from __future__ import annotations

from alembic import command
from sqlalchemy import create_engine, inspect

from services.core.migrate import alembic_config, upgrade


def test_migrations_apply_and_match_the_models(database_url: str) -> None:
    upgrade(database_url)
    command.check(alembic_config(database_url))  # raises if the models and the migrations differ
    tables = set(inspect(create_engine(database_url)).get_table_names())
    assert {"organizations", "api_keys", "plans", "quotes", "gpu_offers", "gpu_specs", "catalog_versions"} <= tables


def test_upgrade_is_idempotent(database_url: str) -> None:
    upgrade(database_url)
    upgrade(database_url)
