"""A transient database fault during an estimate re-runs the work with backoff; the plan fails only after
a bounded number of attempts, with the last error shown (issue 21, row 6: `pg_terminate_backend` mid-load
left one of 331 acknowledged plans failed for good)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session

from services.core.db import make_engine, make_sessionmaker
from services.core.retry import RetryPolicy, backoff_s, is_transient, retry_transient
from services.plans import service as plans_service
from tests.api.conftest import QLORA_PLAN, Api


def _terminating_compute(calls: list[int]) -> Any:
    """``compute`` whose first call kills its own database connection (as pg_terminate_backend from an
    operator or a failover does) before estimating."""
    real = plans_service.compute

    def compute(session: Session, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            session.execute(text("SELECT pg_terminate_backend(pg_backend_pid())"))
        return real(session, *args, **kwargs)

    return compute


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_a_connection_killed_mid_estimate_is_retried_and_the_plan_finishes(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    monkeypatch.setattr(plans_service, "compute", _terminating_compute(calls))
    created = api.client.post("/v1/plans", json=QLORA_PLAN, headers=api.headers())
    assert created.status_code == 202, created.text
    body = api.wait_for_plan(created.json()["id"])
    assert body["status"] == "done", body
    assert body["recommendations"]
    assert len(calls) == 2  # the killed attempt and the one that finished


def _failing_compute(session: Session, *args: Any, **kwargs: Any) -> Any:
    raise OperationalError("SELECT 1", {}, Exception("server closed the connection unexpectedly"))


@pytest.mark.parametrize("database_url", ["sqlite", "postgres"], indirect=True)
def test_a_fault_that_persists_fails_the_plan_after_the_attempts_with_the_last_error(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    created = api.client.post("/v1/plans", json=QLORA_PLAN, headers=api.headers())
    plan_id = created.json()["id"]
    assert api.wait_for_plan(plan_id)["status"] == "done"
    # Run the stored plan again as a worker would, with a fault on every attempt.
    factory = make_sessionmaker(make_engine(api.url))
    with factory() as session, session.begin():
        session.execute(text("UPDATE plans SET status = 'queued', attempts = 0 WHERE id = :id"), {"id": plan_id})
    monkeypatch.setattr(plans_service, "compute", _failing_compute)
    plans_service.run_plan(factory, plan_id, 0.1, retries=RetryPolicy(attempts=3, base_s=0.0))
    body = api.client.get(f"/v1/plans/{plan_id}", headers=api.headers()).json()
    assert body["status"] == "failed"
    assert "failed 3 times" in body["error"] and "server closed the connection" in body["error"], body["error"]
    with factory() as session:
        assert session.execute(text("SELECT attempts FROM plans WHERE id = :id"), {"id": plan_id}).scalar() == 3


def test_only_transient_faults_are_retried() -> None:
    assert is_transient(OperationalError("x", {}, Exception("connection refused")))
    assert not is_transient(IntegrityError("x", {}, Exception("duplicate key")))
    assert not is_transient(ValueError("bad plan"))
    from redis.exceptions import ConnectionError as RedisConnectionError

    assert is_transient(RedisConnectionError("Connection refused"))

    calls: list[int] = []
    slept: list[float] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise OperationalError("x", {}, Exception("gone"))
        return "ok"

    assert retry_transient(flaky, attempts=5, base_s=0.5, max_s=30, sleep=slept.append) == "ok"
    assert slept == [0.5, 1.0]  # exponential backoff between the three attempts

    def broken() -> None:
        calls.append(1)
        raise ValueError("a bug is not retried")

    calls.clear()
    with pytest.raises(ValueError):
        retry_transient(broken, attempts=5, base_s=0, max_s=0, sleep=slept.append)
    assert len(calls) == 1
    assert [backoff_s(n, 0.5, 3.0) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]
