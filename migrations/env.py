"""Alembic environment: the metadata of every domain's tables, the URL from gpuplan's settings."""

from __future__ import annotations

from alembic import context
from sqlalchemy import engine_from_config, pool

from services.core.db import Base
from services.core.settings import Settings


def import_all_tables() -> None:
    """Imports every domain's tables so the metadata is complete. It lives here, not in services.core,
    since core sits below every domain (tests/test_import_layers.py)."""
    import services.catalog.tables
    import services.core.leases
    import services.datasets.tables
    import services.hub.tables
    import services.nodes.tables
    import services.orgs.tables
    import services.plans.tables
    import services.quotes.tables
    import services.runs.tables  # noqa: F401


import_all_tables()
config = context.config
target_metadata = Base.metadata


def _url() -> str:
    explicit = config.attributes.get("url")
    return str(explicit) if explicit else Settings().sqlalchemy_url


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connectable = config.attributes.get("connection")
    if connectable is None:
        connectable = engine_from_config({"sqlalchemy.url": _url()}, prefix="sqlalchemy.", poolclass=pool.NullPool)
        with connectable.connect() as connection:
            _run(connection)
    else:
        _run(connectable)


def _run(connection) -> None:  # type: ignore[no-untyped-def]
    # render_as_batch lets ALTERs run on SQLite too.
    context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
