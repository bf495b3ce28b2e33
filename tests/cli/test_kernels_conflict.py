"""`gpuplan` refuses kernels that conflict with the framework in one line naming kernels."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "infra" / "examples" / "llama-3.1-8b-qlora.json"
GPUPLAN = Path(sys.executable).with_name("gpuplan")


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([str(GPUPLAN), *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=120)


def _plan(tmp_path: Path, **fields: str) -> str:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({**json.loads(EXAMPLE.read_text()), **fields}))
    return str(path)


@pytest.mark.parametrize(("framework", "kernels"), [("hf-trainer", "unsloth"), ("unsloth", "liger")])
def test_estimate_names_kernels(tmp_path: Path, framework: str, kernels: str) -> None:
    result = _run("estimate", "--plan", _plan(tmp_path, framework=framework, kernels=kernels), cwd=tmp_path)
    lines = result.stderr.strip().splitlines()
    assert result.returncode != 0 and len(lines) == 1 and lines[0].startswith("gpuplan: error: kernels: "), (
        result.stderr
    )


def test_export_replanned_for_another_framework_names_kernels(tmp_path: Path) -> None:
    plan = _plan(tmp_path, framework="unsloth", kernels="unsloth")
    result = _run("export", "--plan", plan, "--format", "axolotl", "--out", str(tmp_path / "run"), cwd=tmp_path)
    lines = result.stderr.strip().splitlines()
    assert result.returncode != 0 and len(lines) == 1 and lines[0].startswith("gpuplan: error: kernels: "), (
        result.stderr
    )
    assert not (tmp_path / "run").exists()
