"""A stop given up (``stop_failed``) on a node that keeps reporting idle is retried at the backoff's cap, on a real
(SQLite) database: a provider outage longer than the streak of attempts left an idle machine billing until someone
acted. The retry is an attempt like the others (a provider call, a ``node.stop`` audit row), raises no second
``node.stop_failed`` alert, and the node stays ``stop_failed`` until a stop succeeds; a silent node is never stopped;
and a sweep that read the node before another sweep's attempt cannot send a second stop."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from services.core.db import unit_of_work
from services.core.leases import worker_identity
from services.core.settings import Settings
from services.nodes import lifecycle
from services.nodes.drivers import DriverError, NodeTarget
from services.nodes.lifecycle import run_sweep
from services.nodes.schemas import NodeRegistration
from services.nodes.tables import NodeEventRow, NodeRow
from services.orgs.tables import AuditEvent
from tests.nodes.helpers import Db, beat, load_node, node_database

T0 = datetime(2026, 12, 9, 9, 0, tzinfo=UTC)
# Two attempts a minute apart, then given up; retried every 10 min (the cap). Lost after 15 min of silence.
SETTINGS = Settings(
    node_lost_after_s=900, node_stop_max_attempts=2, node_stop_backoff_s=60, node_stop_backoff_max_s=600
)


class Provider:
    """A provider whose stop API is down (HTTP 503) until ``down`` is cleared."""

    name = "outage"

    def __init__(self) -> None:
        self.down = True
        self.calls: list[str] = []

    def stop(self, node: NodeTarget) -> str:
        self.calls.append(node.id)
        if self.down:
            raise DriverError("the provider answered stop with HTTP 503")
        return "stopped"

    def start(self, node: NodeTarget) -> str:
        return "started"


@pytest.fixture
def db(tmp_path: Path) -> Db:
    return node_database(tmp_path / "stop_failed.db", "stop-failed", NodeRegistration(name="h100x8", gpu="H100 80GB"))


def _at(minutes: float, seconds: float = 0) -> datetime:
    return T0 + timedelta(minutes=minutes, seconds=seconds)


def _idle_until(db: Db, first: int, last: int) -> None:
    """The node's agent reporting idle every minute from minute ``first`` to ``last``."""
    factory, principal, node_id, token = db
    for minute in range(first, last + 1):
        beat(factory, SETTINGS, principal, node_id, token, _at(minute))


def _given_up_total() -> float:
    return REGISTRY.get_sample_value("gpuplan_node_stop_failed_total") or 0.0


def _audits(factory: sessionmaker[Session], node_id: str) -> list[str]:
    with unit_of_work(factory) as session:
        return list(
            session.scalars(
                select(AuditEvent.action)
                .where(AuditEvent.target == f"node:{node_id}")
                .order_by(AuditEvent.created_at, AuditEvent.id)
            ).all()
        )


def _give_up(db: Db, provider: Provider) -> None:
    """Idle from minute 0; attempts at 16:00 and 17:01 fail: stop_failed, its retry due at 27:01."""
    factory, _, node_id, _ = db
    _idle_until(db, 0, 16)
    run_sweep(factory, SETTINGS, now=_at(16), driver=provider)
    _idle_until(db, 17, 17)
    summary = run_sweep(factory, SETTINGS, now=_at(17, 1), driver=provider)
    row = load_node(factory, node_id)
    assert summary.given_up == [node_id] and row.status == "stop_failed" and row.stop_attempts == 2
    assert row.next_stop_at == _at(27, 1), row.next_stop_at


def test_a_stop_failed_node_still_reporting_idle_is_retried_at_the_cap_until_a_stop_succeeds(db: Db) -> None:
    factory, _, node_id, _ = db
    provider = Provider()
    given_up_before = _given_up_total()
    _give_up(db, provider)
    row = load_node(factory, node_id)
    assert "stop given up" in (row.last_reason or "") and "retried every 10 min" in (row.last_reason or "")
    assert _given_up_total() == given_up_before + 1
    # Still idle. Sweeps before the retry is due send nothing.
    _idle_until(db, 18, 27)
    for minute, second in ((20, 0), (27, 0)):
        run_sweep(factory, SETTINGS, now=_at(minute, second), driver=provider)
    assert len(provider.calls) == 2
    # Due: the stop is sent again, an attempt like the others; the outage goes on, so the node stays stop_failed.
    summary = run_sweep(factory, SETTINGS, now=_at(27, 2), driver=provider)
    row = load_node(factory, node_id)
    assert summary.retried == [node_id] and summary.failed == [node_id] and summary.given_up == []
    assert len(provider.calls) == 3 and row.status == "stop_failed" and row.stop_attempts == 3
    assert row.next_stop_at == _at(37, 2) and "HTTP 503" in (row.last_stop_answer or "")
    assert "stop attempt 3 failed (given up after 2)" in (row.last_reason or "")
    # One alert for the streak: no second stop_failed audit row, no second count.
    assert _audits(factory, node_id) == ["node.stop", "node.stop", "node.stop_failed", "node.stop"]
    assert _given_up_total() == given_up_before + 1
    # The provider is back: the next retry stops the node, which clears stop_failed.
    provider.down = False
    _idle_until(db, 28, 37)
    run_sweep(factory, SETTINGS, now=_at(37, 3), driver=provider)
    row = load_node(factory, node_id)
    assert len(provider.calls) == 4 and row.status == "stopped" and row.stop_attempts == 4
    assert _audits(factory, node_id)[-1] == "node.stop"
    with unit_of_work(factory) as session:
        kinds = session.scalars(
            select(NodeEventRow.kind).where(NodeEventRow.node_id == node_id).order_by(NodeEventRow.created_at)
        ).all()
    assert kinds[-1] == "stop" and kinds.count("stop_failed") == 3, kinds


def test_a_silent_stop_failed_node_is_never_stopped_and_stays_stop_failed(db: Db) -> None:
    factory, _, node_id, _ = db
    provider = Provider()
    _give_up(db, provider)
    provider.down = False
    # No heartbeat since minute 17: lost by the heartbeat rule (15 min) at 32, after its retry was due (27:01).
    for minute in (33, 40, 120):
        run_sweep(factory, SETTINGS, now=_at(minute), driver=provider)
    row = load_node(factory, node_id)
    assert len(provider.calls) == 2 and row.status == "stop_failed", row.last_reason
    assert "stop given up" in (row.last_reason or "")  # the given-up stop stays what the node shows
    # It reports idle again: seen idle for its threshold (from the heartbeat after the silence), it is retried.
    _idle_until(db, 121, 136)
    run_sweep(factory, SETTINGS, now=_at(130), driver=provider)
    assert len(provider.calls) == 2  # idle 9 min since it came back: not yet
    run_sweep(factory, SETTINGS, now=_at(136, 30), driver=provider)
    assert len(provider.calls) == 3 and load_node(factory, node_id).status == "stopped"


def test_a_busy_report_brings_a_stop_failed_node_back_with_a_fresh_streak(db: Db) -> None:
    factory, principal, node_id, token = db
    provider = Provider()
    _give_up(db, provider)
    beat(factory, SETTINGS, principal, node_id, token, _at(20), job_running=True)
    run_sweep(factory, SETTINGS, now=_at(30), driver=provider)
    row = load_node(factory, node_id)
    assert row.status == "active" and row.stop_attempts == 0 and row.next_stop_at is None
    assert len(provider.calls) == 2


@pytest.mark.parametrize("given_up", [False, True], ids=["backing-off", "stop_failed"])
def test_a_sweep_that_read_the_node_before_another_sweeps_attempt_sends_no_second_stop(db: Db, given_up: bool) -> None:
    """Two sweeps (beat processes) on SQLite, which takes no row lock: A reads the node, B claims it, its provider
    call fails and puts the node back as it was (active backing off, or stop_failed), with the same last heartbeat.
    A's claim must fail: it was decided on a node whose attempt B has sent since."""
    factory, _, node_id, _ = db
    provider = Provider()
    settings = SETTINGS
    if given_up:
        _give_up(db, provider)
        due = _at(27, 2)
    else:
        settings = SETTINGS.model_copy(update={"node_stop_max_attempts": 3})  # attempt 2 is not the last
        _idle_until(db, 0, 16)
        run_sweep(factory, settings, now=_at(16), driver=provider)
        due = _at(16, 61)
    before = load_node(factory, node_id)
    with factory() as stale:  # sweep A's read
        node = stale.get(NodeRow, node_id)
        assert node is not None and node.status == before.status
        summary = run_sweep(factory, settings, now=due, driver=provider)  # sweep B's attempt, failed
        assert summary.failed == [node_id]
        after = load_node(factory, node_id)
        assert after.status == ("stop_failed" if given_up else "active")
        assert after.last_heartbeat_at == before.last_heartbeat_at
        claimed = lifecycle._claim_stop(stale, node, due, worker_identity(), 60.0)
        stale.commit()
    assert not claimed, "a second stop was claimed for the same decision"
    row = load_node(factory, node_id)
    assert row.status == after.status and row.stop_attempts == after.stop_attempts
