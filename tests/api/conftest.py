"""API fixtures: the real app over a migrated database (SQLite file, and Postgres when reachable)."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError

from services.api.app import create_app
from services.core.db import make_engine, make_sessionmaker, unit_of_work
from services.core.settings import Settings
from services.orgs.service import create_key, create_organization
from tests.conftest import bounded_test_client, require_service
from tests.databases import migrate

POSTGRES_ADMIN_URL = os.environ.get(
    "GPUPLAN_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)


@dataclass
class Api:
    client: TestClient
    url: str
    keys: dict[str, str]

    def headers(self, org: str = "alpha") -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[org]}"}

    def wait_for_plan(self, plan_id: str, org: str = "alpha", timeout_s: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            body: dict[str, Any] = self.client.get(f"/v1/plans/{plan_id}", headers=self.headers(org)).json()
            if body["status"] in ("done", "failed") or time.monotonic() > deadline:
                return body
            time.sleep(0.05)


def _postgres_database() -> Iterator[str]:
    name = f"gpuplan_test_{uuid.uuid4().hex[:10]}"
    admin = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except OperationalError:
        admin.dispose()
        require_service("PostgreSQL", False, "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start")
        return
    url = POSTGRES_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    try:
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'gpuplan.db'}"
    else:
        yield from _postgres_database()


@pytest.fixture
def api(database_url: str) -> Iterator[Api]:
    migrate(database_url)
    factory = make_sessionmaker(make_engine(database_url))
    keys = {}
    with unit_of_work(factory) as session:
        for org in ("alpha", "beta"):
            create_organization(session, org)
            keys[org] = create_key(session, org)
        keys["admin"] = create_key(session, "alpha", admin=True)
    app = create_app(Settings(database_url=database_url))
    with bounded_test_client(app) as client:
        yield Api(client=client, url=database_url, keys=keys)


QLORA_PLAN: dict[str, Any] = {
    "model": {"name": "meta-llama/Llama-3.1-8B"},
    "method": "qlora",
    "lora": {"rank": 16, "targets": "all-linear"},
    "micro_batch_size": 4,
    "seq_len": 512,
    "gradient_checkpointing": True,
    "dataset": {"examples": 10_000, "avg_tokens": 512},
    "epochs": 3,
}
