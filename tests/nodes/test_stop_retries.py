"""The stop's lease and retry streak on a real (SQLite) database: a sweep that died mid-call, a node that
gets busy between attempts, the default ``none`` driver, and the backoff's cap."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from services.core.db import unit_of_work
from services.core.settings import Settings
from services.nodes.drivers import DriverError, LocalDriver, NodeTarget, NoDriver
from services.nodes.idle import StopPolicy, stop_backoff_s
from services.nodes.lifecycle import run_sweep, stop_lease_s
from services.nodes.processes import start_ticks
from services.nodes.schemas import NodeRegistration
from services.nodes.tables import NodeEventRow, NodeRow
from services.orgs.tables import AuditEvent
from tests.nodes.helpers import Db, beat, load_node, node_database

T0 = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)
SETTINGS = Settings(
    node_lost_after_s=86_400, node_stop_max_attempts=3, node_stop_backoff_s=10, node_stop_backoff_max_s=15
)


class Refusing:
    """A driver whose provider refuses every stop (as an HTTP 500 would)."""

    name = "refusing"

    def __init__(self) -> None:
        self.calls = 0

    def stop(self, node: NodeTarget) -> str:
        self.calls += 1
        raise DriverError("the provider answered stop with HTTP 500")

    def start(self, node: NodeTarget) -> str:
        return "started"


@pytest.fixture
def db(tmp_path: Path) -> Db:
    factory, principal, node_id, token = node_database(
        tmp_path / "stops.db", "stops", NodeRegistration(name="n", gpu="A100 80GB")
    )
    beat(factory, SETTINGS, principal, node_id, token, T0)
    return factory, principal, node_id, token


def test_backoff_doubles_per_attempt_up_to_its_cap() -> None:
    policy = StopPolicy(backoff_s=60, backoff_max_s=300)
    assert [stop_backoff_s(k, policy) for k in (1, 2, 3, 4, 5)] == [60, 120, 240, 300, 300]


def test_the_lease_covers_calls_queued_behind_others() -> None:
    # Concurrency 2 and a 10 s timeout (each call bounded by 25 s): claims 0-1 in the first round, 2-3 next.
    assert [stop_lease_s(10, i, 2) for i in (0, 1, 2, 3)] == [55, 55, 80, 80]


def test_a_stop_whose_sweep_died_counts_as_a_failed_attempt_after_its_lease(db: Db) -> None:
    factory, _, node_id, _ = db
    with unit_of_work(factory) as session:  # as a sweep leaves it when it dies during the provider call
        row = session.get(NodeRow, node_id)
        assert row is not None
        row.status, row.stop_attempts = "stopping", 1
        row.stop_lease_owner, row.stop_lease_expires_at = "elsewhere:1:1", T0 + timedelta(minutes=1)
    driver = Refusing()
    run_sweep(factory, SETTINGS, now=T0 + timedelta(seconds=30), driver=driver)  # lease still held
    assert load_node(factory, node_id).status == "stopping" and driver.calls == 0
    run_sweep(factory, SETTINGS, now=T0 + timedelta(minutes=2), driver=driver)
    row = load_node(factory, node_id)
    assert row.status == "active" and row.stop_lease_owner is None
    assert row.next_stop_at == T0 + timedelta(minutes=2, seconds=10)
    assert "its lease expired" in (row.last_stop_answer or "")


def test_a_node_busy_again_starts_a_fresh_streak(db: Db) -> None:
    factory, principal, node_id, token = db
    driver = Refusing()
    run_sweep(factory, SETTINGS, now=T0 + timedelta(minutes=20), driver=driver)
    run_sweep(factory, SETTINGS, now=T0 + timedelta(minutes=20, seconds=11), driver=driver)
    assert load_node(factory, node_id).stop_attempts == 2
    beat(factory, SETTINGS, principal, node_id, token, T0 + timedelta(minutes=21), job_running=True)
    run_sweep(factory, SETTINGS, now=T0 + timedelta(minutes=21, seconds=30), driver=driver)
    row = load_node(factory, node_id)
    assert row.stop_attempts == 0 and row.next_stop_at is None and row.status == "active"
    # Idle again past the threshold: attempt 1 of a new streak, not the third (and last) of the old one.
    beat(factory, SETTINGS, principal, node_id, token, T0 + timedelta(minutes=22))
    run_sweep(factory, SETTINGS, now=T0 + timedelta(minutes=40), driver=driver)
    row = load_node(factory, node_id)
    assert row.stop_attempts == 1 and row.status == "active" and driver.calls == 3
    with unit_of_work(factory) as session:
        audits = session.scalars(select(AuditEvent.action).where(AuditEvent.target == f"node:{node_id}")).all()
    assert audits == ["node.stop"] * 3


def test_the_default_none_driver_records_the_decision_and_counts_no_attempt(db: Db) -> None:
    factory, _, node_id, _ = db
    for minutes in (20, 21, 60, 120):
        run_sweep(factory, SETTINGS, now=T0 + timedelta(minutes=minutes), driver=NoDriver())
    row = load_node(factory, node_id)
    assert row.status == "active" and row.stop_attempts == 0
    with unit_of_work(factory) as session:
        kinds = session.scalars(select(NodeEventRow.kind).where(NodeEventRow.node_id == node_id)).all()
        audits = session.scalars(select(AuditEvent.action)).all()
    assert kinds.count("stop_failed") == 1 and audits == []  # one event for the unchanged decision, no audit


# An agent whose final sync on SIGTERM outlasts the local driver's wait, then exits 0. Its command line is a
# `gpuplan agent`'s (services/nodes/processes.py is_gpuplan_agent), as the local driver requires of what it signals.
_SLOW_FINAL_SYNC = """
import signal, sys, time
def final_sync(*_):
    time.sleep(1.0)
    sys.exit(0)
signal.signal(signal.SIGTERM, final_sync)
print("ready", flush=True)
time.sleep(60)
"""


def _exited_unreaped(pid: int, timeout_s: float = 10.0) -> None:
    """Wait until the child has exited, leaving it unreaped (a zombie)."""
    deadline = time.monotonic() + timeout_s
    while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is None:
        assert time.monotonic() < deadline, "the agent did not exit"
        time.sleep(0.05)


def test_an_agent_still_in_its_final_sync_at_the_drivers_wait_is_stopped_at_the_next_attempt(db: Db) -> None:
    """The local driver's wait (GPUPLAN_NODE_STOP_TIMEOUT_S) ran out while the agent ran its final sync; once it had
    exited, every retry refused its pid ("no longer the process that authenticated"), until stop_failed."""
    factory, _, node_id, _ = db
    agent = subprocess.Popen(
        [sys.executable, "-c", _SLOW_FINAL_SYNC, "services.cli.main", "agent"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert agent.stdout is not None and agent.stdout.readline() == "ready\n"
        host, ticks = socket.gethostname(), start_ticks(agent.pid)
        with unit_of_work(factory) as session:  # as a heartbeat over the agent's own connection proves its pid
            row = session.get(NodeRow, node_id)
            assert row is not None and ticks is not None
            row.hostname, row.verified_pid, row.verified_pid_start_ticks = host, agent.pid, ticks
        driver = LocalDriver(wait_s=0.3)
        first = run_sweep(factory, SETTINGS, now=T0 + timedelta(minutes=20), driver=driver)
        assert first.failed == [node_id], load_node(factory, node_id).last_reason
        assert "did not exit within 0.3 s" in (load_node(factory, node_id).last_stop_answer or "")
        # The final sync ends and the agent exits. Unreaped (a zombie) or gone, it is stopped: nothing to signal.
        _exited_unreaped(agent.pid)
        target = NodeTarget(node_id, "n", "", host, agent.pid, ticks)
        assert driver.stop(target) == f"agent process {agent.pid} had already exited"
        assert agent.wait(timeout=10) == 0
        second = run_sweep(factory, SETTINGS, now=T0 + timedelta(minutes=20, seconds=11), driver=driver)
        row = load_node(factory, node_id)
        assert second.stopped == [node_id] and not second.failed, row.last_reason
        assert row.status == "stopped" and row.last_stop_answer == f"agent process {agent.pid} had already exited"
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
