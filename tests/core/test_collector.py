"""The API's and the workers' processes settle their garbage collector (services.core.collector): run in a fresh
interpreter each, as those processes start, so this test process keeps CPython's defaults."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from services.core.collector import YOUNG_GENERATION_THRESHOLD

ROOT = Path(__file__).resolve().parents[2]
REPORT = "import gc, json; print(json.dumps([gc.get_threshold(), gc.get_freeze_count()]))"


def _collector_after(start: str) -> tuple[list[int], int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPLAN_")}
    env["GPUPLAN_DATABASE_URL"] = "sqlite://"
    out = subprocess.run(
        [sys.executable, "-c", f"{start}\n{REPORT}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    thresholds, frozen = json.loads(out.stdout.strip().splitlines()[-1])
    return thresholds, frozen


def test_a_fresh_interpreter_has_the_default_threshold() -> None:
    thresholds, frozen = _collector_after("pass")
    assert thresholds[0] != YOUNG_GENERATION_THRESHOLD
    assert frozen == 0


def test_the_served_app_settles_its_process() -> None:
    thresholds, frozen = _collector_after(
        "from services.api.app import create_served_app\nfrom services.core.settings import get_settings\n"
        "create_served_app(get_settings())"
    )
    default = _collector_after("pass")[0]
    assert thresholds == [YOUNG_GENERATION_THRESHOLD, *default[1:]]
    assert frozen > 0


def test_a_worker_pool_process_settles_when_it_starts() -> None:
    thresholds, frozen = _collector_after(
        "from celery import signals\nimport workers.celery_app\nsignals.worker_process_init.send(sender=None)"
    )
    default = _collector_after("pass")[0]
    assert thresholds == [YOUNG_GENERATION_THRESHOLD, *default[1:]]
    assert frozen > 0
