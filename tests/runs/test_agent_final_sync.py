"""`gpuplan agent` as a real process: what it does when SIGTERM comes (the local driver's stop) and the bucket fails."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.runs.conftest import RunEnv, free_port, make_checkpoint


def _wait(predicate: object, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_a_final_sync_the_bucket_refuses_is_one_line_not_a_traceback(
    run_env: RunEnv, live_api: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    ckpt = tmp_path / "out"
    make_checkpoint(ckpt, 100, 2**20, seed=1)
    # The bucket's endpoint is down (nothing listens on this port): every pass fails, the final one too.
    env = {**cli_env, "GPUPLAN_S3_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}"}
    command = [sys.executable, "-m", "services.cli.main", "agent", "--api", live_api, "--key", run_env.key,
               "--gpu", "A100 80GB", "--name", "probe-agent", "--run", run_env.run_id, "--checkpoint-dir", str(ckpt),
               "--sync-interval", "3600", "--settle-s", "0", "--interval", "0.5"]  # fmt: skip
    agent = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
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
    assert "final sync failed" in output, output
    assert run_env.run()["last_durable_step"] is None
