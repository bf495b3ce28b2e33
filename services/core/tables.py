"""Imports every domain's tables so the metadata is complete (Alembic, tests)."""

from __future__ import annotations


def import_all_tables() -> None:
    import services.catalog.tables
    import services.core.leases
    import services.datasets.tables
    import services.hub.tables
    import services.nodes.tables
    import services.orgs.tables
    import services.plans.tables
    import services.quotes.tables
    import services.runs.tables  # noqa: F401
