"""Plan and config files the CLI refuses in one line with exit 2 (issue 15.4): JSON no reader should take."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from services.catalog.models import find_model
from tests.conftest import LLAMA_8B

GPUPLAN = Path(sys.executable).with_name("gpuplan")
REPO = Path(__file__).resolve().parents[2]


def _gpuplan(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([str(GPUPLAN), *args], capture_output=True, text=True, timeout=120, env=env, check=False)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('{"model": {"config": ' + '{"a": ' * 5_000 + "1" + "}" * 5_000 + "}}", "nested more than 32 levels"),
        ('{"model": {"name": "meta-llama/Llama-3.1-8B"}, "seq_len": Infinity}', "seq_len: must be a finite number"),
        ('{"model": {"name": "x",}}', "not valid JSON at line 1, column 24"),
    ],
    ids=["5000-deep", "Infinity", "syntax"],
)
def test_a_plan_file_json_should_not_carry_is_one_line_and_exit_2(tmp_path: Path, text: str, needle: str) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(text, encoding="utf-8")
    done = _gpuplan("estimate", "--plan", str(plan))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in done.stderr


def test_a_200_million_layer_config_is_refused_naming_the_field(tmp_path: Path) -> None:
    config = {**find_model("meta-llama/Llama-3.1-8B").config, "num_hidden_layers": 200_000_000}
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"model": {"config": config}}), encoding="utf-8")
    done = _gpuplan("estimate", "--plan", str(plan))
    assert done.returncode == 2
    assert "model.config.num_hidden_layers" in done.stderr and "at most 1,024" in done.stderr


def _awq(bits: Any) -> dict[str, Any]:
    return {**LLAMA_8B, "quantization_config": {"quant_method": "awq", "bits": bits, "group_size": 128}}


@pytest.mark.parametrize(
    ("config", "args", "field"),
    [
        ({**LLAMA_8B, "torch_dtype": "float8_weird"}, ("--method", "lora"), "model.config.torch_dtype"),
        ({**LLAMA_8B, "dtype": 7}, ("--method", "lora"), "model.config.dtype"),
        (_awq([4]), ("--mode", "inference"), "model.config.quantization_config.bits"),
        (_awq(99), ("--mode", "inference"), "model.config.quantization_config.bits"),
    ],
    ids=["unknown-dtype", "dtype-number", "bits-list", "bits-99"],
)
def test_a_config_with_an_unknown_dtype_or_bad_bits_is_one_line(
    tmp_path: Path, config: Any, args: tuple[str, ...], field: str
) -> None:
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    done = _gpuplan("estimate", "--config", str(tmp_path / "config.json"), *args)
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and field in lines[0] and "Traceback" not in done.stderr, done.stderr
