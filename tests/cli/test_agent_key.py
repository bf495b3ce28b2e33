"""`gpuplan agent` reads its API key from a file or the environment, so that `ps` does not show it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def test_the_agent_takes_its_key_from_a_file_or_the_environment_never_needing_an_argument(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPLAN_")}
    server = subprocess.Popen(
        [sys.executable, "-m", "services.cli.main", "serve", "--port", str(port)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    api = f"http://127.0.0.1:{port}"

    def agent(*args: str, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "services.cli.main", "agent", "--api", api, "--once", "--interval", "0.1"]
        return subprocess.run(
            [*command, *args], capture_output=True, text=True, cwd=tmp_path, env={**env, **(extra_env or {})}
        )

    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{api}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        key = (tmp_path / ".gpuplan" / "local-key").read_text().strip()
        key_file = tmp_path / "agent-key"
        key_file.write_text(key + "\n")
        key_file.chmod(0o600)
        from_file = agent("--key-file", str(key_file), "--name", "from-file")
        assert from_file.returncode == 0, from_file.stderr
        assert key not in " ".join(from_file.args)
        from_env = agent("--name", "from-env", extra_env={"GPUPLAN_API_KEY": key})
        assert from_env.returncode == 0, from_env.stderr
        names = {
            n["name"] for n in httpx.get(f"{api}/v1/nodes", headers={"Authorization": f"Bearer {key}"}).json()["items"]
        }
        assert {"from-file", "from-env"} <= names
        # --key still works, and says why not to use it.
        argv = agent("--key", key, "--name", "from-argv")
        assert argv.returncode == 0 and "--key shows the key in ps" in argv.stderr
        # No key, or an unreadable or empty file: one line, exit 2.
        missing = agent()
        assert missing.returncode == 2 and "no API key: give --key-file PATH or set $GPUPLAN_API_KEY" in missing.stderr
        empty = tmp_path / "empty"
        empty.write_text("\n")
        for path, message in ((empty, "the file is empty"), (tmp_path / "absent", "cannot read")):
            failed = agent("--key-file", str(path))
            assert failed.returncode == 2 and message in failed.stderr and len(failed.stderr.strip().splitlines()) == 1
        # A run that is not there stops the agent before it registers: no active node is left behind (one was).
        lost = agent("--key-file", str(key_file), "--name", "lost-node", "--run", "no-such-run")
        assert lost.returncode != 0 and "cannot join run no-such-run" in lost.stderr, lost.stderr
        assert len(lost.stderr.strip().splitlines()) == 1, lost.stderr
        listed = httpx.get(f"{api}/v1/nodes", headers={"Authorization": f"Bearer {key}"}).json()["items"]
        assert "lost-node" not in {n["name"] for n in listed}
    finally:
        server.terminate()
        server.wait(timeout=30)
