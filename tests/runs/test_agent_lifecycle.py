"""The agent on a node: a real `gpuplan agent` process stopped by the local driver (final sync on
SIGTERM), and the node-side guard when the control plane is unreachable."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from services.agent.agent import Agent
from services.agent.node import NodeGuard, RunSync
from services.nodes.drivers import DriverError, LocalDriver, NodeTarget
from services.nodes.idle import IdlePolicy, Signals
from services.runs.sync import SyncOptions, read_manifest, sync_pass
from services.storage.s3 import make_s3_client
from tests.conftest import S3_TEST_CREDENTIALS
from tests.runs.conftest import RunEnv, make_checkpoint


def _wait(predicate: object, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_the_local_driver_stops_a_real_agent_after_its_final_sync(
    run_env: RunEnv, live_api: str, tmp_path: Path
) -> None:
    ckpt = tmp_path / "out"
    ckpt.mkdir()
    env = {
        **os.environ,
        "GPUPLAN_S3_ENDPOINT_URL": run_env.s3.s3_endpoint_url or "",
        "GPUPLAN_S3_ACCESS_KEY_ID": S3_TEST_CREDENTIALS["s3_access_key_id"],
        "GPUPLAN_S3_SECRET_ACCESS_KEY": S3_TEST_CREDENTIALS["s3_secret_access_key"],
    }
    command = [sys.executable, "-m", "services.cli.main", "agent", "--api", live_api, "--key", run_env.key,
               "--gpu", "A100 80GB", "--name", "real-agent", "--run", run_env.run_id, "--checkpoint-dir", str(ckpt),
               "--sync-interval", "3600", "--settle-s", "0", "--interval", "0.5"]  # fmt: skip
    agent = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
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
        target = NodeTarget(node["id"], node["name"], "", socket.gethostname(), agent.pid)
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
            job_pattern=r"^$never",
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
    assert "unreachable" in reason and stop_file.exists()
    # The scheduled pass went to the bucket alone: durable there before the machine was stopped.
    manifest = read_manifest(s3, run["bucket"], run["prefix"], 800)
    assert manifest is not None and manifest.created_at <= datetime.now(UTC)
    assert run_env.run()["last_durable_step"] is None  # the service has not heard of it yet...
    sync_pass(s3, run["bucket"], run["prefix"], run_env.run_id, ckpt, run_env.api, SyncOptions(settle_s=0))
    assert run_env.run()["last_durable_step"] == 800  # ...until the next pass that reaches it
