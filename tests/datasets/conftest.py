"""Data set API fixtures: the real app on SQLite and PostgreSQL with a loopback S3 server."""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from services.api.app import create_app
from services.core.db import make_engine, make_sessionmaker, unit_of_work
from services.core.settings import Settings
from services.orgs.service import create_key, create_organization
from tests.api.conftest import Api, database_url  # noqa: F401  (the SQLite/PostgreSQL parametrised fixture)
from tests.conftest import bounded_test_client
from tests.databases import migrate

PART_BYTES = 5 * 2**20  # S3's smallest part
MAX_BYTES = 40 * 2**20


@dataclass
class DataApi(Api):
    def create(self, data: bytes, name: str = "train.jsonl", org: str = "alpha", **fields: Any) -> dict[str, Any]:
        body = {"name": name, "size_bytes": len(data), **fields}
        response = self.client.post("/v1/datasets", json=body, headers=self.headers(org))
        assert response.status_code == 201, response.text
        out: dict[str, Any] = response.json()
        return out

    def put_part(self, dataset_id: str, data: bytes, n: int, org: str = "alpha") -> Any:
        chunk = data[(n - 1) * PART_BYTES : n * PART_BYTES]
        return self.client.put(f"/v1/datasets/{dataset_id}/parts/{n}", content=chunk, headers=self.headers(org))

    def upload(self, data: bytes, name: str = "train.jsonl", org: str = "alpha", **fields: Any) -> dict[str, Any]:
        """Create, send every part, complete; returns the data set once its check has finished."""
        created = self.create(data, name, org, **fields)
        for n in range(1, math.ceil(len(data) / PART_BYTES) + 1):
            assert self.put_part(created["id"], data, n, org).status_code == 200
        response = self.client.post(f"/v1/datasets/{created['id']}/complete", headers=self.headers(org))
        assert response.status_code == 200, response.text
        return self.wait_for_dataset(created["id"], org)

    def wait_for_dataset(self, dataset_id: str, org: str = "alpha", timeout_s: float = 120.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            body: dict[str, Any] = self.client.get(f"/v1/datasets/{dataset_id}", headers=self.headers(org)).json()
            if body["status"] in ("done", "failed") or time.monotonic() > deadline:
                return body
            time.sleep(0.05)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def data_api(database_url: str, s3_settings: Settings) -> Iterator[DataApi]:  # noqa: F811
    migrate(database_url)
    factory = make_sessionmaker(make_engine(database_url))
    keys = {}
    with unit_of_work(factory) as session:
        for org in ("alpha", "beta"):
            create_organization(session, org)
            keys[org] = create_key(session, org)
    settings = s3_settings.model_copy(
        update={"database_url": database_url, "dataset_part_bytes": PART_BYTES, "dataset_max_bytes": MAX_BYTES}
    )
    with bounded_test_client(create_app(settings)) as client:
        yield DataApi(client=client, url=database_url, keys=keys)
