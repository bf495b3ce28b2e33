"""`bash infra/dev.sh run` installs the runtime only: the environment it makes holds no test, lint or docs
tools, and the service runs from it (plans estimated, the dashboard served)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
DEV_TOOLS = ("pytest", "hypothesis", "schemathesis", "moto", "mypy", "ruff", "playwright", "mkdocs", "pyarrow")

pytestmark = pytest.mark.slow


def test_the_run_command_installs_the_runtime_only_and_serves_from_it(tmp_path: Path) -> None:
    venv = tmp_path / "runtime-venv"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUPLAN_", "VIRTUAL_ENV", "PYTHONPATH"))}
    env["GPUPLAN_VENV"] = str(venv)
    env["PYTHON"] = sys.executable  # the same interpreter version the suite runs on
    setup = subprocess.run(
        ["bash", "infra/dev.sh", "setup"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    assert setup.returncode == 0, setup.stdout + setup.stderr
    assert "setting up" in setup.stderr and "ready" in setup.stderr  # not silent
    python = venv / "bin" / "python"
    probe = (
        "import importlib.util, json, sys; print(json.dumps([m for m in sys.argv[1:] if importlib.util.find_spec(m)]))"
    )
    present = json.loads(subprocess.run([str(python), "-c", probe, *DEV_TOOLS], capture_output=True, text=True).stdout)
    assert present == [], f"dev tools in the run environment: {present}"

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    workdir = tmp_path / "work"
    workdir.mkdir()
    server = subprocess.Popen(
        [str(venv / "bin" / "gpuplan"), "serve", "--port", str(port)],
        cwd=workdir,
        env={k: v for k, v in env.items() if k != "GPUPLAN_VENV"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert server.poll() is None and time.monotonic() < deadline, "gpuplan serve did not start"
            time.sleep(0.3)
        key = (workdir / ".gpuplan" / "local-key").read_text().strip()
        headers = {"Authorization": f"Bearer {key}"}
        plan = json.loads((ROOT / "infra" / "examples" / "llama-3.1-8b-qlora.json").read_text())
        plan_id = httpx.post(f"{url}/v1/plans", json=plan, headers=headers, timeout=30).json()["id"]
        deadline = time.monotonic() + 120
        while (body := httpx.get(f"{url}/v1/plans/{plan_id}", headers=headers, timeout=30).json())["status"] not in (
            "done",
            "failed",
        ):
            assert time.monotonic() < deadline
            time.sleep(0.3)
        assert body["status"] == "done" and body["recommendations"], body.get("error")
        assert httpx.get(f"{url}/dashboard/login", timeout=30).status_code == 200
        assert httpx.get(f"{url}/docs", timeout=30).status_code == 200
    finally:
        server.terminate()
        server.wait(timeout=30)
