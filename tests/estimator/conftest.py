"""Shared fixtures of the estimator tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import bounded_test_client


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[Any, dict[str, str]]]:
    """The API on a migrated SQLite file with one organization: (client, auth headers), for the user's path."""

    from services.api.app import create_app
    from services.core.db import make_engine, make_sessionmaker, unit_of_work
    from services.core.settings import Settings
    from services.orgs.service import create_key, create_organization
    from tests.databases import migrate

    url = f"sqlite:///{tmp_path / 'gpuplan.db'}"
    migrate(url)
    with unit_of_work(make_sessionmaker(make_engine(url))) as session:
        create_organization(session, "alpha")
        key = create_key(session, "alpha")
    with bounded_test_client(create_app(Settings(database_url=url))) as client:
        yield client, {"Authorization": f"Bearer {key}"}
