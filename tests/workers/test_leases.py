"""Task leases on a real database: the outbox row, claims, renewals, the sweep, abandonment, and an API
whose broker is down at enqueue time still finishing the plan through the sweep."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from services.api.app import create_app
from services.core.db import make_engine, make_sessionmaker, unit_of_work, utcnow
from services.core.leases import (
    ABANDONED,
    QUEUED,
    RUNNING,
    TaskLease,
    claim,
    record_outbox,
    release,
    renew,
    run_leased,
    sweep_expired,
)
from services.core.settings import Settings
from services.core.tasks import InProcessRunner, sweep_leases
from services.orgs.repository import OrganizationRepository
from services.orgs.service import create_key, create_organization
from services.plans.service import ESTIMATE_TASK, estimate_task, give_up_abandoned
from services.plans.tables import PlanRow
from tests.api.conftest import QLORA_PLAN
from tests.api.conftest import database_url as database_url  # the SQLite and Postgres fixture
from tests.conftest import bounded_test_client
from tests.databases import migrate


@pytest.fixture
def factory(database_url: str) -> Iterator[sessionmaker[Session]]:
    migrate(database_url)
    engine = make_engine(database_url)
    yield make_sessionmaker(engine)
    engine.dispose()


def _lease(factory: sessionmaker[Session], name: str = "t.task", subject: str = "s1") -> TaskLease | None:
    with unit_of_work(factory) as session:
        return session.scalar(select(TaskLease).where(TaskLease.task_name == name, TaskLease.subject_id == subject))


def _expire(factory: sessionmaker[Session], name: str = "t.task", subject: str = "s1") -> None:
    with unit_of_work(factory) as session:
        row = session.scalar(select(TaskLease).where(TaskLease.task_name == name, TaskLease.subject_id == subject))
        assert row is not None
        row.lease_expires_at = utcnow() - timedelta(seconds=1)


def test_a_live_lease_refuses_a_second_worker_and_an_expired_one_is_taken_over(
    factory: sessionmaker[Session],
) -> None:
    with unit_of_work(factory) as session:
        record_outbox(session, [("t.task", ("s1",))], lease_s=60)
        record_outbox(session, [("t.task", ("s1",))], lease_s=60)  # the same task twice: one row
    lease = _lease(factory)
    assert lease is not None and lease.status == QUEUED and lease.args == ["s1"]
    assert claim(factory, "t.task", "s1", "worker-a", 60)
    assert not claim(factory, "t.task", "s1", "worker-b", 60)  # duplicate delivery while a is alive
    assert renew(factory, "t.task", "s1", "worker-a", 60)
    _expire(factory)  # worker a died: it stopped renewing
    assert claim(factory, "t.task", "s1", "worker-b", 60)
    assert not renew(factory, "t.task", "s1", "worker-a", 60)  # a's lease is gone
    release(factory, "t.task", "s1", "worker-a")  # not a's to release
    assert _lease(factory) is not None
    release(factory, "t.task", "s1", "worker-b")
    assert _lease(factory) is None


def test_the_sweep_resends_an_expired_lease_once_and_abandons_after_the_delivery_cap(
    factory: sessionmaker[Session],
) -> None:
    with unit_of_work(factory) as session:
        record_outbox(session, [("t.task", ("s1",)), ("t.other", ("s2",))], lease_s=60)
    assert sweep_expired(factory, 60, max_deliveries=3) == []  # nothing expired yet
    _expire(factory)
    first = sweep_expired(factory, 60, max_deliveries=3)
    assert [(d.task_name, d.subject_id, d.args, d.action, d.was_status) for d in first] == [
        ("t.task", "s1", ("s1",), "resend", QUEUED)
    ]
    assert sweep_expired(factory, 60, max_deliveries=3) == []  # a second sweep finds a fresh lease
    for _ in range(3):  # three deliveries, each killing its worker
        _expire(factory)
        assert claim(factory, "t.task", "s1", "w", 60)
        _expire(factory)
        decisions = sweep_expired(factory, 60, max_deliveries=3)
        assert len(decisions) == 1 and decisions[0].was_status == RUNNING
    assert decisions[0].action == "abandon"
    lease = _lease(factory)
    assert lease is not None and lease.status == ABANDONED and lease.expiries == 4
    _expire(factory)
    assert sweep_expired(factory, 60, max_deliveries=3) == []  # abandoned rows are not swept again


def test_the_heartbeat_keeps_a_long_task_s_lease_alive(factory: sessionmaker[Session]) -> None:
    seen: list[bool] = []

    def slow(subject: str) -> None:
        time.sleep(1.2)  # four times the lease: only the renewals keep it
        lease = _lease(factory, subject=subject)
        seen.append(lease is not None and lease.lease_expires_at > utcnow())
        seen.append(not sweep_expired(factory, 0.3, max_deliveries=5))

    run_leased(factory, "t.task", ("s1",), slow, lease_s=0.3)
    assert seen == [True, True]
    assert _lease(factory) is None  # released at the end


def test_an_abandoned_plan_is_recorded_as_failed(factory: sessionmaker[Session]) -> None:
    with unit_of_work(factory) as session:
        create_organization(session, "acme")
        org = OrganizationRepository(session).by_name("acme")
        assert org is not None
        plan = PlanRow(organization_id=org.id, status="running", request=QLORA_PLAN, model_name="m", method="qlora")
        session.add(plan)
        session.flush()
        record_outbox(session, [(ESTIMATE_TASK, (plan.id,))], lease_s=60)
    _expire(factory, ESTIMATE_TASK, plan.id)
    settings = Settings(database_url="sqlite://", task_max_deliveries=1)
    runner = InProcessRunner(1, {ESTIMATE_TASK: lambda _pid: None})
    with unit_of_work(factory) as session:
        lease = session.scalar(select(TaskLease).where(TaskLease.subject_id == plan.id))
        assert lease is not None
        lease.deliveries = 1
    decisions = sweep_leases(factory, runner, settings, (lambda d: give_up_abandoned(factory, d),))
    runner.shutdown()
    assert [d.action for d in decisions] == ["abandon"]
    with unit_of_work(factory) as session:
        row = session.get(PlanRow, plan.id)
        assert row is not None and row.status == "failed"
        assert row.error is not None and "worker died 1 times" in row.error


def test_the_in_process_runner_forgets_finished_tasks() -> None:
    gate = threading.Event()
    runner = InProcessRunner(2, {"t.wait": lambda _x: gate.wait(10), "t.quick": lambda _x: None})
    for i in range(200):
        runner.send("t.quick", (str(i),))
    runner.send("t.wait", ("w",))
    deadline = time.monotonic() + 10
    while len(runner.futures) > 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(runner.futures) == 1  # only the unfinished task is held
    gate.set()
    runner.shutdown()
    assert not runner.futures


def test_a_plan_submitted_while_the_broker_is_down_is_finished_by_the_lease_sweep(
    database_url: str, tmp_path: Path
) -> None:
    migrate(database_url)
    factory = make_sessionmaker(make_engine(database_url))
    with unit_of_work(factory) as session:
        create_organization(session, "acme")
        key = create_key(session, "acme")
    # Nothing listens on port 9: every send fails, as with Redis down.
    settings = Settings(database_url=database_url, redis_url="redis://127.0.0.1:9/0", task_lease_s=1.0)
    with bounded_test_client(create_app(settings)) as client:
        started = time.monotonic()
        created = client.post("/v1/plans", json=QLORA_PLAN, headers={"Authorization": f"Bearer {key}"})
        elapsed_s = time.monotonic() - started
        assert created.status_code == 202, created.text
    assert elapsed_s < 10  # the request did not wait for the broker
    plan_id = created.json()["id"]
    lease = _lease(factory, ESTIMATE_TASK, plan_id)
    assert lease is not None and lease.status == QUEUED  # the outbox kept the task
    # Redis is back (here: a worker in this process); the sweep sends what expired.
    runner = InProcessRunner(1, {ESTIMATE_TASK: estimate_task(factory, 0.1)}, factory=factory, lease_s=1.0)
    time.sleep(1.1)
    decisions = sweep_leases(factory, runner, settings)
    runner.shutdown()
    assert [(d.subject_id, d.action) for d in decisions] == [(plan_id, "resend")]
    with unit_of_work(factory) as session:
        row = session.get(PlanRow, plan_id)
        assert row is not None and row.status == "done" and row.attempts == 1
    assert _lease(factory, ESTIMATE_TASK, plan_id) is None


def test_a_process_starting_resumes_only_work_no_live_worker_holds(factory: sessionmaker[Session]) -> None:
    """`serve --workers 2`: the second process starts while the first is estimating. It must not put
    the first one's plans back to queued nor run them again; a dead holder's plan resumes at once."""
    import os
    import socket
    import subprocess

    from services.core.tasks import PendingTasks
    from services.plans.service import resume_unfinished

    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid on this host with no process behind it
    host = socket.gethostname()
    owners = {
        "other-host": "another-host:1:1",
        "live-sibling": f"{host}:{os.getppid()}:7",
        "dead-sibling": f"{host}:{gone.pid}:7",
        "this-pid": f"{host}:{os.getpid()}:7",  # an earlier process that had this pid (a container restart)
        "this-thread": f"{host}:{os.getpid()}:{threading.get_ident()}",  # another app in this very process
    }
    with unit_of_work(factory) as session:
        create_organization(session, "acme")
        org = OrganizationRepository(session).by_name("acme")
        assert org is not None
        ids = {}
        for label in [*owners, "queued-no-lease"]:
            row = PlanRow(
                organization_id=org.id,
                status="queued" if label == "queued-no-lease" else "running",
                request=QLORA_PLAN,
                model_name="m",
                method="qlora",
                attempts=0 if label == "queued-no-lease" else 1,
            )
            session.add(row)
            session.flush()
            ids[label] = row.id
    for label, owner in owners.items():
        assert claim(factory, ESTIMATE_TASK, ids[label], owner, 60)
    pending = PendingTasks()
    assert resume_unfinished(factory, pending) == 3
    assert {args[0] for _, args in pending.items} == {ids["dead-sibling"], ids["this-pid"], ids["queued-no-lease"]}
    with unit_of_work(factory) as session:
        status = {label: session.get(PlanRow, plan_id).status for label, plan_id in ids.items()}  # type: ignore[union-attr]
    assert status == {
        "other-host": "running",
        "live-sibling": "running",
        "this-thread": "running",
        "dead-sibling": "queued",
        "this-pid": "queued",
        "queued-no-lease": "queued",
    }
    # A plan finished by its holder between the listing and the update stays done.
    with unit_of_work(factory) as session:
        from services.plans.repository import PlanRepository

        session.get(PlanRow, ids["dead-sibling"]).status = "done"  # type: ignore[union-attr]
        session.flush()
        PlanRepository(session).requeue_running([ids["dead-sibling"]])
    with unit_of_work(factory) as session:
        assert session.get(PlanRow, ids["dead-sibling"]).status == "done"  # type: ignore[union-attr]
    # The resumed deliveries run each plan once.
    runner = InProcessRunner(2, {ESTIMATE_TASK: estimate_task(factory, 0.1)}, factory=factory, lease_s=60)
    pending.flush(runner)
    runner.shutdown()
    with unit_of_work(factory) as session:
        finished = {label: session.get(PlanRow, ids[label]) for label in ("this-pid", "queued-no-lease")}
        assert all(r is not None and r.status == "done" for r in finished.values())
        assert [r.attempts for r in finished.values()] == [2, 1]  # type: ignore[union-attr]
