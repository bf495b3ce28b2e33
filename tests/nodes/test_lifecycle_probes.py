"""Idle-shutdown cases a lifecycle probe (stop 50) found wrong, through the real heartbeat service and sweep on a
clock the test moves: silence counted as idle time, bytes not durable ignored, a late heartbeat bringing a stopped
node back, a stale row of a restarted agent stopping its machine, and the event log repeating itself."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from services.core.db import make_engine, make_sessionmaker, unit_of_work
from services.core.settings import Settings
from services.nodes import lifecycle
from services.nodes.drivers import DriverError, NodeTarget
from services.nodes.lifecycle import run_sweep
from services.nodes.schemas import GpuStatus, Heartbeat, NodeRegistration, SyncHealth
from services.nodes.service import heartbeat, register_node
from services.nodes.tables import NodeEventRow, NodeRow
from services.orgs.service import Principal, create_organization
from services.runs.service import record_heartbeat_progress
from tests.databases import migrate
from tests.nodes.helpers import load_node

T0 = datetime(2026, 12, 6, 9, 0, tzinfo=UTC)
LOST_AFTER_S = 300.0


@dataclass
class Driver:
    name: str = "recording"
    stops: list[str] = field(default_factory=list)
    fail: bool = False
    during: Any = None  # called inside the provider call (a restart racing the stop)

    def stop(self, node: NodeTarget) -> str:
        self.stops.append(node.id)
        if self.during is not None:
            self.during()
        if self.fail:
            raise DriverError("provider timed out")
        return "stopped"

    def start(self, node: NodeTarget) -> str:
        return "started"


@dataclass
class World:
    factory: Any
    principal: Principal
    tokens: dict[str, str] = field(default_factory=dict)

    def register(self, name: str, **fields: Any) -> str:
        with unit_of_work(self.factory) as session:
            row, token = register_node(session, self.principal, NodeRegistration(name=name, gpu="A100 80GB", **fields))
            self.tokens[row.id] = token
            return row.id

    def beat(
        self, node_id: str, minute: float, *, busy: bool = False, gpus: list[GpuStatus] | None = None, **fields: Any
    ) -> list[str]:
        body = Heartbeat(
            gpus=gpus
            if gpus is not None
            else [
                GpuStatus(index=0, utilisation_pct=95.0 if busy else 0.0, memory_used_gib=1.0, memory_total_gib=80.0)
            ],
            job_running=busy,
            **fields,
        )
        with unit_of_work(self.factory) as session:
            _, commands = heartbeat(
                session,
                self.principal,
                node_id,
                body,
                LOST_AFTER_S,
                T0 + timedelta(minutes=minute),
                token=self.tokens[node_id],
                record_progress=record_heartbeat_progress,
            )
            return list(commands)

    def sweep(self, minute: float, driver: Driver) -> None:
        """The sweep the worker runs: no transaction is open during the provider call."""
        settings = Settings(node_lost_after_s=LOST_AFTER_S, node_stop_backoff_s=60.0)
        run_sweep(self.factory, settings, T0 + timedelta(minutes=minute), driver)  # type: ignore[arg-type]

    def node(self, node_id: str) -> NodeRow:
        return load_node(self.factory, node_id)

    def events(self, node_id: str, kind: str) -> int:
        with unit_of_work(self.factory) as session:
            rows = session.scalars(select(NodeEventRow).where(NodeEventRow.node_id == node_id)).all()
            return sum(1 for r in rows if r.kind == kind)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    url = f"sqlite:///{tmp_path / 'nodes.db'}"
    migrate(url)
    factory = make_sessionmaker(make_engine(url))
    session: Session
    with unit_of_work(factory) as session:
        org = create_organization(session, "probe")
        principal = Principal(org.id, org.name, False)
    yield World(factory, principal)


def test_a_silence_long_enough_to_be_lost_is_not_counted_as_idle_time(world: World) -> None:
    node, driver = world.register("gpu-1"), Driver()
    world.beat(node, 0)
    world.sweep(6, driver)
    assert world.node(node).status == "lost"
    world.beat(node, 14.5)  # back, idle: what it did for 14 minutes is unknown
    world.sweep(15, driver)
    assert driver.stops == [] and world.node(node).status == "active"
    for minute in range(15, 30):
        world.beat(node, minute + 0.5)
    world.sweep(29.6, driver)
    assert driver.stops == [node]  # 15 minutes of idle heartbeats after it came back


def test_a_silence_shorter_than_the_lost_threshold_restarts_the_idle_timer(world: World) -> None:
    node, driver = world.register("gpu-1"), Driver()
    for minute in range(0, 4):
        world.beat(node, minute)
    # 4 minutes without a heartbeat (an agent restart, a network blip): under the lost threshold, but what the node
    # did meanwhile is unknown. It comes back idle at minute 7.
    for minute in range(7, 16):
        world.beat(node, minute)
    assert world.node(node).idle_since == T0 + timedelta(minutes=7)
    world.sweep(15.5, driver)  # idle since minute 0 by the clock, seen idle for 8.5 min
    assert driver.stops == [] and world.node(node).status == "active"
    for minute in range(16, 23):
        world.beat(node, minute)
    world.sweep(22.5, driver)
    assert driver.stops == [node]  # 15 minutes of idle heartbeats at the agent's cadence


def test_a_sweep_during_a_silence_counts_idle_time_only_to_the_last_heartbeat_and_its_cadence(world: World) -> None:
    """A probe: idle heartbeats to minute 12, then silence (under the lost threshold); a sweep at minute 16 counted the
    silence as idle and stopped the node, whose agent may have started a job meanwhile. It is seen idle up to the last
    heartbeat plus the gap its cadence allows (75 s at 15 s), and kept."""
    node, driver = world.register("gpu-1"), Driver()
    for minute in range(0, 13):
        world.beat(node, minute)
    world.sweep(16, driver)
    row = world.node(node)
    assert driver.stops == [] and row.status == "active"
    assert row.last_reason == "idle 13 of 15 min; no heartbeat for 240 s", row.last_reason
    # Heartbeats at the cadence again: the timer restarts and the node is stopped 15 minutes later.
    for minute in range(16, 32):
        world.beat(node, minute)
    world.sweep(31.5, driver)
    assert driver.stops == [node]


def test_idle_time_accrues_at_the_cadence_the_agent_declares(world: World) -> None:
    node, driver = world.register("gpu-1"), Driver()
    # An agent run with --interval 120: heartbeats 2 min apart are its cadence, not gaps.
    for minute in range(0, 17, 2):
        world.beat(node, minute, heartbeat_interval_s=120.0)
    assert world.node(node).idle_since == T0
    world.sweep(16.5, driver)
    assert driver.stops == [node]
    # The default agent (15 s) declares nothing: 2 min between its heartbeats is a gap.
    other = world.register("gpu-2")
    for minute in range(20, 40, 2):
        world.beat(other, minute)
    assert world.node(other).idle_since == T0 + timedelta(minutes=38)


def test_bytes_the_agent_says_are_not_durable_keep_the_node(world: World) -> None:
    node, driver = world.register("gpu-1"), Driver()
    pending = SyncHealth(last_error="EndpointConnectionError: s3 down", pending_bytes=40 * 2**30)
    for minute in range(0, 21):
        world.beat(node, minute, unsynced_checkpoints=0, sync=pending)
    world.sweep(20.5, driver)
    assert driver.stops == [] and "40.00 GiB, not yet durable" in (world.node(node).last_reason or "")
    # A heartbeat without a sync report (no run attached any more) clears the stale figure.
    for minute in range(21, 38):
        world.beat(node, minute)
    world.sweep(37.5, driver)
    assert driver.stops == [node]


def test_a_late_busy_heartbeat_within_the_grace_leaves_a_stopped_node_stopped(world: World) -> None:
    node, driver = world.register("gpu-1"), Driver()
    for minute in range(0, 17):
        world.beat(node, minute)
    world.sweep(16.5, driver)
    assert driver.stops == [node] and world.node(node).status == "stopped"
    world.beat(node, 16.55, busy=True)  # the machine shutting down, its last job's report in flight
    row = world.node(node)
    assert row.status == "stopped" and row.stopped_at is not None and world.events(node, "back") == 0


def test_a_restarted_agent_replaces_the_row_whose_stop_is_in_flight(world: World) -> None:
    old = world.register("gpu-1", instance_id="vm-42")
    for minute in range(0, 17):
        world.beat(old, minute)
    new: list[str] = []

    def restart() -> None:  # while the provider call is in flight the agent restarts and registers anew
        new.append(world.register("gpu-1-restarted", instance_id="vm-42"))

    driver = Driver(fail=True, during=restart)
    world.sweep(16.5, driver)
    assert world.node(old).status == "replaced"
    driver.during, driver.fail = None, False
    for minute in (17.0, 18.0, 19.0, 20.0):
        world.beat(new[0], minute, busy=True)
        world.sweep(minute + 0.5, driver)
    assert driver.stops == [old]  # the failed attempt only: the stale row is never retried


def test_an_idle_node_waiting_for_its_final_sync_logs_the_request_once(world: World) -> None:
    node, driver = world.register("gpu-1"), Driver()
    for minute in range(0, 40):
        commands = world.beat(node, minute, unsynced_checkpoints=2)
        world.sweep(minute + 0.5, driver)
        if minute:
            assert "sync" in commands  # asked again at every heartbeat until the checkpoints are durable
    assert driver.stops == [] and world.events(node, "sync_requested") == 1


def test_gpus_of_the_node_a_heartbeat_leaves_out_are_not_read_as_idle(world: World) -> None:
    """A heartbeat naming one GPU of a four-GPU node made the other GPUs look idle, and the sweep stopped the node
    whatever they ran (a probe of the node lifecycle): a GPU of the node left out is unread, as one NVML could not
    read. A heartbeat with no GPUs reports no GPU state (its other signals decide). A GPU reported twice (hiding
    another) is refused, naming the field."""
    driver = Driver()
    idle = GpuStatus(index=0, utilisation_pct=0.0, memory_used_gib=1.0, memory_total_gib=80.0)
    partial, empty, whole = (world.register(n, gpu_count=4) for n in ("partial", "empty", "whole"))
    for minute in range(0, 17):
        world.beat(partial, minute, gpus=[idle])
        world.beat(empty, minute, gpus=[])
        world.beat(whole, minute, gpus=[idle.model_copy(update={"index": i}) for i in range(4)])
    world.sweep(16.5, driver)
    assert sorted(driver.stops) == sorted([empty, whole])
    assert "GPU state unreadable (NVML) or not reported" in (world.node(partial).last_reason or "")
    with pytest.raises(ValidationError, match="each GPU index once"):
        Heartbeat(gpus=[idle, idle])
    for lax in ("yes", 1, "true"):  # booleans are JSON's true and false only
        with pytest.raises(ValidationError, match="job_running"):
            Heartbeat.model_validate({"job_running": lax})


def test_a_busy_heartbeat_recorded_between_the_sweeps_read_and_its_claim_is_not_stopped_on(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite takes no row lock: a heartbeat saying a job started, committed after the sweep read the node idle and
    before it claimed the stop, was stopped on anyway (a probe of the node lifecycle). The claim compares the
    heartbeat it decided on."""
    node, driver = world.register("gpu-1"), Driver()
    for minute in range(0, 16):
        world.beat(node, minute)
    decide = lifecycle.decide
    fired: list[bool] = []

    def busy_meanwhile(*args: Any, **kwargs: Any) -> Any:
        if not fired:
            fired.append(True)
            beat = threading.Thread(target=lambda: world.beat(node, 15.9, busy=True))
            beat.start()
            beat.join()
        return decide(*args, **kwargs)

    monkeypatch.setattr(lifecycle, "decide", busy_meanwhile)
    world.sweep(16.0, driver)
    assert fired and driver.stops == []
    assert world.node(node).status == "active" and world.node(node).job_running
    monkeypatch.setattr(lifecycle, "decide", decide)
    world.sweep(16.5, driver)  # the next sweep reads the busy heartbeat
    assert driver.stops == []
