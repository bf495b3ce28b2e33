"""`gpuplan estimate --model OWNER/NAME` through a loopback fake of the Hub, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.hub.conftest import INDEX, QWEN_1_8B
from tests.hub.fake_hub import FakeHub

ROOT = Path(__file__).resolve().parents[2]
GPUPLAN = Path(sys.executable).with_name("gpuplan")


def _gpuplan(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    command = [str(GPUPLAN)] if GPUPLAN.exists() else [sys.executable, "-m", "services.cli.main"]
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    return subprocess.run([*command, *args], capture_output=True, text=True, env=full_env, timeout=120)


def test_a_hub_model_is_fetched_once_then_estimated_offline(tmp_path: Path) -> None:
    hub = FakeHub()
    hub.add_model("Acme/Qwen1-1_8B-SFT", QWEN_1_8B, index=INDEX)
    env = {"HF_ENDPOINT": hub.url, "GPUPLAN_HUB_CACHE_DIR": str(tmp_path / "cache")}
    try:
        first = _gpuplan(env, "estimate", "--model", "Acme/Qwen1-1_8B-SFT", "--method", "lora", "--json")
    finally:
        hub.close()
    assert first.returncode == 0, first.stderr
    report = json.loads(first.stdout)
    assert report["model"] == "Acme/Qwen1-1_8B-SFT" and report["model_type"] == "qwen"
    assert any("Hub checkpoint" in w for w in report["warnings"])
    assert list((tmp_path / "cache").iterdir())  # cached on disk
    # The Hub is gone: the cached config answers, with the same numbers.
    offline = _gpuplan(env, "estimate", "--model", "acme/qwen1-1_8b-sft", "--method", "lora", "--json")
    assert offline.returncode == 0, offline.stderr
    assert json.loads(offline.stdout)["memory"] == report["memory"]


def test_hub_errors_are_one_line_and_exit_2(tmp_path: Path) -> None:
    hub = FakeHub()
    hub.add_model("meta-llama/Gated-8B", QWEN_1_8B, gated_token="hf_ok")
    env = {"HF_ENDPOINT": hub.url, "GPUPLAN_HUB_CACHE_DIR": str(tmp_path)}
    try:
        cases = {
            "acme/nope-7b": "was not found",
            "meta-llama/Gated-8B": "is gated",
        }
        results = {name: _gpuplan(env, "estimate", "--model", name) for name in cases}
        granted = _gpuplan({**env, "HF_TOKEN": "hf_ok"}, "estimate", "--model", "meta-llama/Gated-8B", "--json")
    finally:
        hub.close()
    for name, needle in cases.items():
        out = results[name]
        assert out.returncode == 2 and out.stdout == ""
        assert out.stderr.count("\n") == 1 and out.stderr.startswith("gpuplan: error: model.name: ")
        assert needle in out.stderr and "Traceback" not in out.stderr
    assert granted.returncode == 0, granted.stderr
    down = _gpuplan(env, "estimate", "--model", "acme/never-seen")  # the fake Hub is closed now
    assert down.returncode == 2 and "could not reach the Hub" in down.stderr and down.stderr.count("\n") == 1
