"""The device grid (benchmarks/device/grid.py), checked on the CPU before a GPU is lent: every plan fits one
H200 by the estimate, the smoke run writes a case the accuracy runner reads, and merging skips known ids."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.accuracy.run import evaluate_case
from benchmarks.device import grid
from services.estimator.counters import memory_counters
from services.estimator.estimate import estimate
from services.estimator.plan import Plan
from tests.conftest import require_trace_extra

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", sorted(grid.GRID))
def test_every_grid_plan_fits_one_h200_with_room(name: str) -> None:
    report = estimate(grid.plan_of(name), "H200")
    assert [f.fits for f in report.fits if f.gpu == "H200"] == [True]
    assert memory_counters(report.memory).fit_gib < 100  # of 141 GB: an OOM would waste the lent minutes


def test_the_smoke_run_writes_a_case_the_accuracy_runner_reads(tmp_path: Path) -> None:
    require_trace_extra()
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.device.grid", "--smoke", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (line,) = (tmp_path / "grid_rows.jsonl").read_text().splitlines()
    row = json.loads(line)
    assert row["id"] == "gpuplan-grid-smoke" and row["source"] == "gpuplan (this project)"
    assert row["measured"]["tokens_per_s"] > 0 and row["measured"]["peak_gib"] is None  # no CUDA: no memory
    Plan.model_validate(row["plan"])
    assert evaluate_case(row).id == "gpuplan-grid-smoke"

    cases = tmp_path / "cases.jsonl"
    cases.write_text(json.dumps({"id": "other"}) + "\n")
    assert grid.merge(tmp_path / "grid_rows.jsonl", cases) == 1
    assert grid.merge(tmp_path / "grid_rows.jsonl", cases) == 0  # known ids are skipped
    assert [json.loads(x)["id"] for x in cases.read_text().splitlines()] == ["other", "gpuplan-grid-smoke"]
