"""The agent on a node: a real `gpuplan agent` process stopped by the local driver (final sync on
SIGTERM), and the node-side guard when the control plane is unreachable."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from services.agent.agent import Agent
from services.agent.node import NodeGuard, RunSync
from services.core.db import make_sessionmaker, unit_of_work, utcnow
from services.nodes.drivers import DriverError, LocalDriver, NodeTarget
from services.nodes.idle import IdlePolicy, Signals
from services.nodes.lifecycle import sweep, target_of
from services.nodes.processes import start_ticks
from services.nodes.tables import NodeEventRow, NodeRow
from services.runs.sync import ControlPlane, SyncOptions, SyncResult, read_manifest, sync_pass
from services.storage.s3 import make_s3_client
from tests.nodes.helpers import SLOW_AGENT
from tests.runs.conftest import RunEnv, free_port, make_checkpoint


def _wait(predicate: object, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def _factory(run_env: RunEnv) -> sessionmaker[Session]:
    app: Any = run_env.client.app
    return make_sessionmaker(app.state.engine)


def _db_node(run_env: RunEnv, node_id: str) -> NodeRow:
    with unit_of_work(_factory(run_env)) as session:
        row = session.get(NodeRow, node_id)
        assert row is not None
        session.expunge(row)
        return row


def _agent(run_env: RunEnv, api: str, name: str, ckpt: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    """`gpuplan agent` syncing ``ckpt`` for the run, hourly (only its final sync runs in a test), as a process."""
    command = [sys.executable, "-m", "services.cli.main", "agent", "--api", api, "--key", run_env.key,
               "--gpu", "A100 80GB", "--name", name, "--run", run_env.run_id, "--checkpoint-dir", str(ckpt),
               "--sync-interval", "3600", "--settle-s", "0", "--interval", "0.5"]  # fmt: skip
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_the_local_driver_stops_a_real_agent_after_its_final_sync(
    run_env: RunEnv, live_api: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    ckpt = tmp_path / "out"
    ckpt.mkdir()
    agent = _agent(run_env, live_api, "real-agent", ckpt, cli_env)
    try:

        def registered() -> bool:
            nodes = run_env.client.get("/v1/nodes", headers=run_env.headers).json()["items"]
            return any(n["name"] == "real-agent" and n["last_heartbeat_at"] for n in nodes)

        _wait(registered)
        node = next(
            n
            for n in run_env.client.get("/v1/nodes", headers=run_env.headers).json()["items"]
            if n["name"] == "real-agent"
        )
        time.sleep(1.5)  # the first (empty) sync pass has run; the next is an hour away
        make_checkpoint(ckpt, 700, 3 * 2**20, seed=9)
        # The agent's heartbeats came with its node token over its own connection: the server proved its pid.
        target = target_of(_db_node(run_env, node["id"]))
        assert target.agent_pid == agent.pid and target.agent_pid_start_ticks == start_ticks(agent.pid)
        detail = LocalDriver(wait_s=60).stop(target)
        assert "stopped" in detail
        output = agent.communicate(timeout=30)[0]
        assert agent.returncode == 0, output
        assert "stopped (sigterm)" in output
    finally:
        if agent.poll() is None:
            agent.kill()
    # The final sync made the checkpoint durable before the process exited.
    assert run_env.run()["last_durable_step"] == 700, output
    with pytest.raises(DriverError, match="not on this machine"):
        LocalDriver().stop(NodeTarget("x", "x", "", "some-other-host", agent.pid))


def test_a_final_sync_the_bucket_refuses_is_one_line_and_a_failing_exit(
    run_env: RunEnv, live_api: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    """A probe of stop 53: with the bucket down, the final sync on SIGTERM raised out of the agent (a traceback). Then
    the agent exited 0 after it, as if its checkpoints were safe: a supervisor saw nothing wrong."""
    ckpt = tmp_path / "out"
    make_checkpoint(ckpt, 100, 2**20, seed=1)
    # The bucket's endpoint is down (nothing listens on this port): every pass fails, the final one too.
    env = {**cli_env, "GPUPLAN_S3_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}"}
    agent = _agent(run_env, live_api, "probe-agent", ckpt, env)
    try:

        def heartbeating() -> bool:
            nodes = run_env.client.get("/v1/nodes", headers=run_env.headers).json()["items"]
            return any(n["name"] == "probe-agent" and n["last_heartbeat_at"] for n in nodes)

        _wait(heartbeating)
        time.sleep(1.0)
        agent.send_signal(signal.SIGTERM)
        output = agent.communicate(timeout=120)[0]
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    assert "Traceback" not in output, output
    assert "stopped (sigterm)" in output, output
    failed = [line for line in output.splitlines() if "final sync failed" in line]
    assert len(failed) == 1 and "1 local checkpoint(s), 1.3 MiB, not made durable" in failed[0], output
    assert agent.returncode == 1, output
    assert run_env.run()["last_durable_step"] is None


def test_the_local_driver_never_signals_a_pid_that_only_was_reported(
    run_env: RunEnv, live_api: str, tmp_path: Path
) -> None:
    """Issue 15.2: a node registered with an arbitrary pid (a real `sleep`) and idle past its threshold
    gets no SIGTERM, whether the pid came in the registration or in a heartbeat carrying the node token."""
    victim = subprocess.Popen(["sleep", "300"])
    try:
        body = {"name": "liar", "gpu": "A100 80GB", "hostname": socket.gethostname(), "agent_pid": victim.pid}
        node = run_env.client.post("/v1/nodes", json=body, headers=run_env.headers).json()
        agent_headers = {**run_env.headers, "X-Node-Token": node["node_token"]}
        url = f"/v1/nodes/{node['id']}/heartbeat"
        # Over real HTTP from this (the test's) process, claiming the victim's pid: not the victim's connection.
        with httpx.Client(base_url=live_api) as client:
            beat = client.post(url, json={"agent_pid": victim.pid}, headers=agent_headers)
        assert beat.status_code == 200, beat.text
        assert _db_node(run_env, node["id"]).verified_pid is None
        # Through the in-process test client too (no socket at all).
        beat = {"agent_pid": victim.pid, **SLOW_AGENT}  # the sweep an hour on counts that hour as idle
        assert run_env.client.post(url, json=beat, headers=agent_headers).status_code == 200
        with unit_of_work(_factory(run_env)) as session:
            summary = sweep(session, utcnow() + timedelta(hours=1), LocalDriver(wait_s=5), 7200)
            assert summary.stopped == []
            events = session.scalars(select(NodeEventRow).where(NodeEventRow.node_id == node["id"])).all()
        reasons = {e.kind: e.reason for e in events}
        assert "no agent process proved itself" in reasons["stop_failed"], reasons
        assert f"agent pid {victim.pid} not proven" in reasons["pid_refused"]
        time.sleep(0.2)
        assert victim.poll() is None  # alive: never signalled
        # A pid that was proven once but is not a gpuplan agent (or no longer the same process) is refused too.
        ticks = start_ticks(victim.pid)
        host = socket.gethostname()
        with pytest.raises(DriverError, match="not a `gpuplan agent` process"):
            LocalDriver().stop(NodeTarget("n", "liar", "", host, victim.pid, ticks))
        # A pid whose start time is not the proven one is another process now: the proven one exited, so the stop is
        # done, and the process holding the pid today is left alone.
        answer = LocalDriver().stop(NodeTarget("n", "liar", "", host, victim.pid, (ticks or 0) + 1))
        assert answer == f"agent process {victim.pid} had already exited"
        with pytest.raises(DriverError, match="without its start time"):
            LocalDriver().stop(NodeTarget("n", "liar", "", host, victim.pid, None))
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()


def test_the_agent_heartbeats_while_its_final_sync_uploads(run_env: RunEnv, tmp_path: Path) -> None:
    """After SIGTERM the agent sent no heartbeat until its final sync ended: a big checkpoint's upload outlasted the
    lost threshold, and the service marked a node that was uploading its last checkpoint as lost."""
    beats: list[dict[str, Any]] = []

    def service(request: httpx.Request) -> httpx.Response:
        beats.append(json.loads(request.content))
        # A sweep asks for a sync meanwhile: no second pass may start beside the final one.
        return httpx.Response(200, json={"commands": ["sync"]})

    passes: list[bool] = []

    class SlowFinalSync(RunSync):
        def pass_once(self, control: ControlPlane, final: bool = False) -> SyncResult:
            passes.append(final)
            deadline = time.monotonic() + 5  # the upload of a big checkpoint, until three heartbeats said so
            while sum(beat["uploading"] for beat in beats) < 3 and time.monotonic() < deadline:
                time.sleep(0.02)
            return super().pass_once(control, final)

    run = run_env.run()
    ckpt = tmp_path / "out"
    make_checkpoint(ckpt, 500, 2**20, seed=5)
    sync = SlowFinalSync(run_env.api, make_s3_client(run_env.s3), run["bucket"], run["prefix"], ckpt,
                         SyncOptions(settle_s=0), interval_s=3600)  # fmt: skip
    previous = signal.getsignal(signal.SIGTERM)
    with httpx.Client(base_url="http://service", transport=httpx.MockTransport(service)) as client:
        agent = Agent(client, run_env.key)
        agent.node_id = "n"
        agent.attach_run(sync)
        agent.stopping.set()  # what SIGTERM does: straight to the final sync
        try:
            assert agent.run(interval_s=0.1) == "sigterm"
        finally:
            signal.signal(signal.SIGTERM, previous)
    uploading = [beat for beat in beats if beat["uploading"]]
    assert len(uploading) >= 3, beats
    assert all(beat["unsynced_checkpoints"] == 1 for beat in uploading), uploading
    assert passes == [False] and agent.final_sync_error is None
    assert run_env.run()["last_durable_step"] == 500
    # The heartbeats ended with the sync: no thread left, nothing sent after it.
    assert not [t for t in threading.enumerate() if t.name == "gpuplan-final-heartbeats"]
    sent = len(beats)
    time.sleep(0.3)
    assert len(beats) == sent


def _final_sync(run_env: RunEnv, ckpt: Path, settle_s: float) -> Agent:
    """An agent told to stop (what SIGTERM does) that runs its final sync of ``ckpt`` through the real API, with a
    service stand-in for its heartbeats."""
    run = run_env.run()
    sync = RunSync(run_env.api, make_s3_client(run_env.s3), run["bucket"], run["prefix"], ckpt,
                   SyncOptions(settle_s=settle_s), interval_s=3600)  # fmt: skip
    previous = signal.getsignal(signal.SIGTERM)
    service = httpx.MockTransport(lambda _: httpx.Response(200, json={"commands": []}))
    with httpx.Client(base_url="http://service", transport=service) as client:
        agent = Agent(client, run_env.key)
        agent.node_id = "n"
        agent.attach_run(sync)
        agent.stopping.set()
        try:
            assert agent.run(interval_s=0.1) == "sigterm"
        finally:
            signal.signal(signal.SIGTERM, previous)
    return agent


def test_the_final_sync_waits_for_a_checkpoint_written_just_before_the_stop(run_env: RunEnv, tmp_path: Path) -> None:
    """A complete checkpoint younger than --settle-s was skipped by the final sync as still being written, and the
    agent exited 0: the node went away with it."""
    ckpt = tmp_path / "out"
    make_checkpoint(ckpt, 600, 2**20, seed=6, settled=False)
    started = time.monotonic()
    agent = _final_sync(run_env, ckpt, settle_s=1.5)
    assert agent.final_sync_error is None
    assert run_env.run()["last_durable_step"] == 600
    assert time.monotonic() - started < 30


def test_a_checkpoint_still_written_to_at_the_final_sync_fails_the_agents_exit(run_env: RunEnv, tmp_path: Path) -> None:
    ckpt = tmp_path / "out"
    folder = make_checkpoint(ckpt, 700, 2**20, seed=7, settled=False)
    writing = threading.Event()

    def trainer() -> None:  # still writing the checkpoint's files
        while not writing.wait(0.2):
            (folder / "model.safetensors").touch()

    thread = threading.Thread(target=trainer)
    thread.start()
    try:
        agent = _final_sync(run_env, ckpt, settle_s=1.0)
    finally:
        writing.set()
        thread.join()
    error = agent.final_sync_error or ""
    assert "step(s) [700] still written to after 1 s" in error and "1 local checkpoint(s)" in error, error
    assert run_env.run()["last_durable_step"] is None


class FakeClock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def test_the_guard_needs_both_idle_and_an_unreachable_control_plane() -> None:
    clock = FakeClock()
    guard = NodeGuard(IdlePolicy(idle_minutes=15), unreachable_after_s=30 * 60, clock=clock)
    guard.observe(Signals())
    clock.now += 20 * 60
    assert guard.should_stop() is None  # idle 20 min, but the service was reachable until 20 min ago
    guard.contact()
    clock.now += 31 * 60
    guard.observe(Signals(job_running=True))  # a job started: busy
    assert guard.should_stop() is None
    guard.observe(Signals())
    clock.now += 16 * 60
    reason = guard.should_stop()
    assert reason is not None and "idle 16 min" in reason and "unreachable for 47 min" in reason


def test_the_guard_stops_an_idle_node_after_a_final_sync_to_the_bucket_alone(run_env: RunEnv, tmp_path: Path) -> None:
    s3 = make_s3_client(run_env.s3)
    run = run_env.run()
    ckpt = tmp_path / "out"
    make_checkpoint(ckpt, 800, 2 * 2**20, seed=4)
    clock = FakeClock()
    guard = NodeGuard(IdlePolicy(idle_minutes=1), unreachable_after_s=60, clock=clock)
    # The control plane is down: a port nothing listens on.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    stop_file = tmp_path / "stopped"
    with httpx.Client(base_url=dead, timeout=2) as client:
        agent = Agent(
            client,
            run_env.key,
            guard=guard,
            stop_command=[sys.executable, "-c", f"open({str(stop_file)!r}, 'w').write('x')"],
        )
        agent.node_id = "n"
        api = run_env.api.__class__(client, run_env.key, run_env.run_id)
        agent.attach_run(RunSync(api, s3, run["bucket"], run["prefix"], ckpt, SyncOptions(settle_s=0), 3600))
        assert agent.heartbeat() is False
        assert agent.syncer is not None and agent.syncer.run.unsynced() == 1  # busy until it is in the bucket
        guard.observe(Signals(unsynced_checkpoints=1))
        clock.now += 120
        assert guard.should_stop() is None  # unreachable, but checkpoints are not durable: kept

        def tick() -> None:
            clock.now += 30  # every heartbeat, half a minute passes on the node's clock

        original = agent.heartbeat
        agent.heartbeat = lambda: (tick(), original())[1]  # type: ignore[method-assign]
        reason = agent.run(interval_s=0.01)
    assert "unreachable" in reason and stop_file.exists() and agent.final_sync_error is None
    # The scheduled pass went to the bucket alone: durable there before the machine was stopped.
    manifest = read_manifest(s3, run["bucket"], run["prefix"], 800)
    assert manifest is not None and manifest.created_at <= datetime.now(UTC)
    assert run_env.run()["last_durable_step"] is None  # the service has not heard of it yet...
    sync_pass(s3, run["bucket"], run["prefix"], run_env.run_id, ckpt, run_env.api, SyncOptions(settle_s=0))
    assert run_env.run()["last_durable_step"] == 800  # ...until the next pass that reaches it
