"""Heartbeats go on while the agent runs a calibration: the real agent loop (``Agent.run``) against the test API, a
calibration that lasts many heartbeat intervals, and the idle sweep run in the middle of it. A calibration in the loop's
own thread used to silence the node for its whole length (a long one got the node marked lost); now a heartbeat thread
reports the node busy every interval until the result is sent, and the sweep neither stops nor loses it."""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from services.agent import calibrate
from services.agent import node as agent_node
from services.agent.agent import Agent
from services.agent.signals import JobWatch
from services.api.app import create_app
from services.core.db import unit_of_work, utcnow
from services.core.settings import Settings
from services.nodes.lifecycle import run_sweep
from services.nodes.tables import CalibrationRow
from tests.conftest import bounded_test_client
from tests.nodes.helpers import TINY_PLAN, AgentStack, Recording, alpha_database, load_node

INTERVAL_S = 0.05  # the agent's heartbeat interval in these tests
LOST_AFTER_S = 60.0


@dataclass
class Beat:
    """A heartbeat the API answered: when, and what it said."""

    at: float
    body: dict[str, Any]


class Stack(AgentStack):
    def agent(self, tmp_path: Path) -> tuple[Agent, list[Beat]]:
        """A CPU node's agent (no job process: an empty /proc), and the heartbeats the API answers, as they come."""
        (tmp_path / "proc").mkdir(exist_ok=True)
        agent = Agent(self.client, self.key, jobs=JobWatch(proc=tmp_path / "proc"))
        beats: list[Beat] = []
        post = agent._post

        def recording_post(path: str, body: dict[str, Any]) -> Any:
            response = post(path, body)
            if path.endswith("/heartbeat"):
                beats.append(Beat(time.monotonic(), body))
            return response

        agent._post = recording_post  # type: ignore[method-assign]
        return agent, beats

    def queue_calibration(self, node_id: str) -> str:
        plan = self.client.post("/v1/plans", json=TINY_PLAN, headers=self.headers()).json()["id"]
        deadline = time.monotonic() + 60
        while self.client.get(f"/v1/plans/{plan}", headers=self.headers()).json()["status"] not in ("done", "failed"):
            assert time.monotonic() < deadline, "the plan was not estimated"
            time.sleep(0.05)
        body = {"plan_id": plan, "warmup_steps": 1, "timed_steps": 1}
        answer = self.client.post(f"/v1/nodes/{node_id}/calibrations", headers=self.headers(), json=body)
        assert answer.status_code == 202, answer.text
        return str(answer.json()["id"])

    def calibration_status(self, calibration_id: str) -> str:
        with unit_of_work(self.factory) as session:
            row = session.get(CalibrationRow, calibration_id)
            assert row is not None
            return row.status


@pytest.fixture
def stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Stack]:
    # Whoever is logged in to the test machine must not keep the node busy; no NVML here: a CPU node.
    monkeypatch.setattr(agent_node, "interactive_idle_s", lambda: None)
    monkeypatch.setitem(sys.modules, "pynvml", None)
    previous = signal.getsignal(signal.SIGTERM)  # Agent.run installs its handler in the main thread
    url, factory, key = alpha_database(tmp_path / "agent.db")
    settings = Settings(database_url=url, node_lost_after_s=LOST_AFTER_S, idle_sweep_interval_s=3600)
    try:
        with bounded_test_client(create_app(settings)) as client:
            yield Stack(client, factory, key, settings)
    finally:
        signal.signal(signal.SIGTERM, previous)


@dataclass
class MidCalibration:
    """What the test saw from inside the calibration."""

    started: float = 0.0
    ended: float = 0.0
    status: str = ""
    job_running: bool = False
    idle_since: datetime | None = None
    decision: str | None = None
    stopped: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)


def _slow_calibration(stack: Stack, node_id: str, beats: list[Beat], seen: MidCalibration, fail: bool = False) -> Any:
    """A calibration that runs until the API has answered three heartbeats sent during it and at least ten intervals
    have passed (at most 10 s), then runs the idle sweep on a clock a few seconds short of the lost threshold after
    now: a node silent since the calibration started is lost by then."""

    def run_calibration(plan: Any, config: dict[str, Any], warmup_steps: int, timed_steps: int) -> dict[str, Any]:
        seen.started = time.monotonic()
        deadline = seen.started + 10.0
        while time.monotonic() < deadline:
            during = [b for b in beats if b.at > seen.started]
            if len(during) >= 3 and time.monotonic() - seen.started >= 10 * INTERVAL_S:
                break
            time.sleep(INTERVAL_S / 5)
        driver = Recording()
        summary = run_sweep(stack.factory, stack.settings, utcnow() + timedelta(seconds=LOST_AFTER_S - 5), driver)  # type: ignore[arg-type]
        row = load_node(stack.factory, node_id)
        seen.status, seen.job_running, seen.idle_since = row.status, row.job_running, row.idle_since
        seen.decision, seen.stopped, seen.lost = row.last_decision, driver.stopped, summary.lost
        seen.ended = time.monotonic()
        if fail:
            raise RuntimeError("CUDA out of memory")
        return {"tokens_per_s": 1000.0, "seconds": 1.0, "device": "cpu", "gpus": 1, "comparable": True, "notes": []}

    return run_calibration


@pytest.mark.parametrize("fail", [False, True], ids=["result", "failure"])
def test_heartbeats_go_on_during_a_calibration_reporting_the_node_busy_and_the_sweep_keeps_it(
    stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail: bool
) -> None:
    agent, beats = stack.agent(tmp_path)
    node_id = agent.register(name="cpu-1", gpu="T4")
    calibration_id = stack.queue_calibration(node_id)
    seen = MidCalibration()
    monkeypatch.setattr(calibrate, "run_calibration", _slow_calibration(stack, node_id, beats, seen, fail))

    assert agent.run(interval_s=INTERVAL_S, once=True) == "once"  # a heartbeat, then the calibration, then back

    during = [b for b in beats if seen.started < b.at < seen.ended]
    assert seen.ended - seen.started >= 10 * INTERVAL_S
    assert len(during) >= 3, f"{len(during)} heartbeat(s) during a calibration of {seen.ended - seen.started:.2f} s"
    assert all(b.body["job_running"] is True for b in during), "a heartbeat during the calibration reported idle"
    assert all(b.body["heartbeat_interval_s"] == INTERVAL_S for b in during)
    # The sweep in the middle of it: neither lost nor stopped, kept as busy.
    assert seen.lost == [] and seen.stopped == [] and seen.status == "active", seen
    assert seen.job_running is True and seen.idle_since is None and seen.decision == "busy:job", seen
    # Once the result (or the failure) is sent, the node reports itself idle again, and no heartbeat thread is left.
    assert beats[-1].body["job_running"] is False and beats[-1].at > seen.ended
    assert stack.calibration_status(calibration_id) == ("failed" if fail else "done")
    assert not [t for t in threading.enumerate() if "calibration" in t.name]
    row = load_node(stack.factory, node_id)
    assert row.status == "active" and row.job_running is False
