"""A database that drops its connections (a restart, a failover) costs one retryable 503, never a 500.

The engine does not ping each checkout (a round trip per request, see services/core/db.py), so a dropped
connection shows on use: the request that meets it is answered 503 with Retry-After, and the pool
reconnects for the next one.
"""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, text

from tests.api.conftest import QLORA_PLAN, Api


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_dropped_connections_give_one_retryable_503_then_service(api: Api) -> None:
    assert api.client.get("/v1/plans", headers=api.headers()).status_code == 200
    database = api.url.rsplit("/", 1)[1]
    admin = create_engine(api.url.rsplit("/", 1)[0] + "/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        killed = conn.execute(
            text("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = :db"),
            {"db": database},
        ).scalar()
    admin.dispose()
    assert killed and killed >= 1
    body = {k: v for k, v in QLORA_PLAN.items() if k not in ("dataset", "epochs")}
    # The pooled connection is dead: the request that meets it is a 503 to retry, not a 500.
    first = api.client.post("/v1/estimate", json=body, headers=api.headers())
    assert first.status_code == 503, first.text
    assert first.headers["Retry-After"] == "1" and "retry" in first.json()["message"]
    statuses = [api.client.get("/v1/plans", headers=api.headers()).status_code for _ in range(3)]
    assert statuses == [200, 200, 200]
