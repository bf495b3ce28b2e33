"""The compose health probes, `gpuplan worker --check` and `gpuplan beat --check`, where they must fail:
no worker on the broker, a schedule beat never wrote or stopped writing. (tests/infra/test_compose.py
sees them pass against a running worker and beat.)"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import require_service
from tests.infra.test_compose import REDIS_URL, _redis_available

ROOT = Path(__file__).resolve().parents[2]
GPUPLAN = Path(sys.executable).parent / "gpuplan"


def _probe(*args: str, home: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPLAN_") and k != "XDG_STATE_HOME"}
    env.update(PYTHONPATH=str(ROOT), HOME=str(home), GPUPLAN_REDIS_URL=REDIS_URL, **extra)
    return subprocess.run([str(GPUPLAN), *args], cwd=home, env=env, capture_output=True, text=True, timeout=60)


def test_worker_check_fails_when_no_worker_answers(tmp_path: Path) -> None:
    require_service("Redis", _redis_available(), "redis-server --daemonize yes")
    result = _probe("worker", "--check", home=tmp_path)
    assert result.returncode == 1, result
    assert "did not answer a ping within 5 s" in result.stderr


def test_beat_check_reads_the_age_of_the_schedule_file(tmp_path: Path) -> None:
    state = tmp_path / "xdg"
    xdg = {"XDG_STATE_HOME": str(state)}
    missing = _probe("beat", "--check", home=tmp_path, **xdg)
    assert missing.returncode == 1 and "beat has not written" in missing.stderr, missing
    # dbm.dumb's names (FILE.dat, FILE.dir); gdbm would write FILE itself.
    schedule = state / "gpuplan" / "celerybeat-schedule.dat"
    schedule.parent.mkdir(parents=True)
    schedule.write_bytes(b"")
    fresh = _probe("beat", "--check", home=tmp_path, **xdg)
    assert fresh.returncode == 0 and "beat wrote its schedule" in fresh.stdout, fresh
    # The most frequent entry is the lease sweep, every 20 s by default: stale after 3 x 20 + 30 s.
    old = time.time() - 91
    os.utime(schedule, (old, old))
    stale = _probe("beat", "--check", home=tmp_path, **xdg)
    assert stale.returncode == 1 and "stale after 90 s" in stale.stderr, stale
    assert _probe("beat", "--check", home=tmp_path, GPUPLAN_LEASE_SWEEP_INTERVAL_S="60", **xdg).returncode == 0
    # Without XDG_STATE_HOME: ~/.local/state.
    (tmp_path / ".local" / "state").mkdir(parents=True)
    (state / "gpuplan").rename(tmp_path / ".local" / "state" / "gpuplan")
    assert _probe("beat", "--check", home=tmp_path, GPUPLAN_LEASE_SWEEP_INTERVAL_S="60").returncode == 0
