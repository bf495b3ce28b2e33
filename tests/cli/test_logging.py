"""The CLI's log: one handler on the "gpuplan" logger while a command runs (never the root logger, where httpx and
botocore log every request), one readable line per record on stderr, INFO for the long-running agent and WARNING for
the others, and never twice however often main() runs in one process."""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

import services.cli.catalog as catalog_cli
from services.cli.main import main
from tests.api.served import serve

ROOT = Path(__file__).resolve().parents[2]
GPUPLAN = Path(sys.executable).parent / "gpuplan"


def _cli_handlers() -> list[logging.Handler]:
    return [h for h in logging.getLogger("gpuplan").handlers if type(h).__module__ == "services.cli.common"]


def test_main_twice_in_one_process_says_each_record_once_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[int] = []

    def command(args: argparse.Namespace) -> int:
        seen.append(len(_cli_handlers()))
        log = logging.getLogger("gpuplan.catalog")
        log.info("an INFO line a short command does not show")
        log.warning("a price list is stale")
        try:
            raise ValueError("bad row\nsecond line")
        except ValueError:
            log.exception("a feed failed")
        logging.getLogger("httpx").warning("a library's record is not the CLI's")
        return 0

    monkeypatch.setattr(catalog_cli, "cmd_models", command)
    before = logging.getLogger("gpuplan").level
    for _ in range(2):
        assert main(["models"]) == 0
        err = capsys.readouterr().err
        assert err.splitlines() == [
            "gpuplan models: warning: a price list is stale",
            "gpuplan models: error: a feed failed: ValueError: bad row second line",
        ], err
    assert seen == [1, 1]  # one handler during each run, not one more per run
    assert _cli_handlers() == [] and logging.getLogger("gpuplan").level == before


def test_the_agent_shows_its_info_lines_and_no_library_requests(tmp_path: Path) -> None:
    """A probe: `gpuplan agent` configured no logging, so its INFO lines (a job launched, a checkpoint waiting) were
    never shown."""
    with serve(f"sqlite:///{tmp_path / 'gpuplan.db'}", tmp_path) as served:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPLAN_")}
        env.update(PYTHONPATH=str(ROOT), GPUPLAN_API_KEY=served.key)
        command = [str(GPUPLAN), "agent", "--api", served.base, "--gpu", "A100 80GB", "--name", "logging-node"]
        agent = subprocess.run(
            [*command, "--once", "--interval", "0.1", "--", sys.executable, "-c", "pass"],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=env,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
    assert agent.returncode == 0, agent.stderr
    lines = agent.stderr.strip().splitlines()
    launched = [line for line in lines if line.startswith("gpuplan agent: launched job ")]
    assert len(launched) == 1 and launched[0].endswith(f"{sys.executable} -c pass"), agent.stderr
    # Every line is the agent's own, one per record: no httpx request lines (the root logger is left alone).
    assert all(line.startswith("gpuplan agent: ") for line in lines), agent.stderr
    assert "HTTP Request" not in agent.stderr and "Traceback" not in agent.stderr


def test_each_process_of_serve_workers_logs_one_line_per_record(tmp_path: Path) -> None:
    """uvicorn starts each process of `serve --workers N` fresh from its factory, outside the command's log: a
    worker's records came out as bare messages (WARNING and above, through logging's last resort)."""
    code = (
        "import logging\n"
        "from services.cli.server import worker_app\n"
        "worker_app()\n"
        "logging.getLogger('gpuplan.plans').warning('plan %s failed', 'p1')\n"
        "logging.getLogger('gpuplan.plans').info('not shown')\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPLAN_")}
    env.update(PYTHONPATH=str(ROOT), HOME=str(tmp_path), GPUPLAN_DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite'}")
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().splitlines() == ["gpuplan serve: warning: plan p1 failed"], done.stderr
