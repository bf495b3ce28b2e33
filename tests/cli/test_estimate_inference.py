"""`gpuplan estimate --mode inference` run as the user runs it (the console script in a subprocess): the
served weights' format, no training method, and no training line in the output (issue 22 item 6)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
GIB = 1024**3
# Llama-3.1-70B (the bundled config.json): 70.55e9 parameters; 80 layers, 8 KV heads of 128 dimensions;
# its embeddings and untied output head are each 128,256 x 8,192.
PARAMS = 70.55e9
KV_BYTES_PER_TOKEN_BF16 = 80 * 2 * 8 * 128 * 2
EMBEDDING_AND_HEAD = 2 * 128_256 * 8_192
# bitsandbytes NF4 (QLoRA paper, section 2; bitsandbytes' quantize_4bit without double quantization):
# 4-bit codes plus one fp32 absmax per block of 64 weights.
NF4_BYTES = 0.5 + 4 / 64
# Training-only lines of `gpuplan estimate` (services/cli/render.py, services/estimator/estimate.py).
TRAINING_WORDS = ("trainable", "optimizer", "gradient", "checkpointing", "micro-batch", "effective batch", "LoRA")


def _gpuplan(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    script = shutil.which("gpuplan", path=str(Path(sys.executable).parent))
    command = [script] if script else [sys.executable, "-m", "services.cli.main"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPLAN_")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [*command, *args], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120, check=False
    )


def _estimate(tmp_path: Path, *args: str) -> tuple[str, dict[str, Any]]:
    base = ("estimate", "--model", "meta-llama/Llama-3.1-70B", "--mode", "inference", *args)
    text = _gpuplan(tmp_path, *base, "--gpu", "h100")
    assert text.returncode == 0, text.stderr
    out = _gpuplan(tmp_path, *base, "--json")
    assert out.returncode == 0, out.stderr
    return text.stdout, json.loads(out.stdout)


def _fits(report: dict[str, Any], gpu: str) -> bool:
    return next(bool(f["fits"]) for f in report["fits"] if f["gpu"] == gpu)


def test_nf4_inference_sizes_a_4_bit_model_with_no_training_lines(tmp_path: Path) -> None:
    text, report = _estimate(tmp_path, "--quantization", "nf4", "--context-len", "8192", "--concurrent-sequences", "4")
    for word in TRAINING_WORDS:
        assert word.lower() not in text.lower(), word
    assert "Prefill" in text and "decode speed is not estimated" in text
    mem = report["memory"]
    # The linears in NF4, the embeddings and head in bf16 (norms are ~1M parameters: within the tolerance).
    expected_weights = (PARAMS - EMBEDDING_AND_HEAD) * NF4_BYTES + EMBEDDING_AND_HEAD * 2
    assert mem["breakdown"]["weights"] == pytest.approx(expected_weights / GIB, rel=0.005)
    assert mem["breakdown"]["kv_cache"] == pytest.approx(4 * 8192 * KV_BYTES_PER_TOKEN_BF16 / GIB, rel=1e-3)
    assert "gradients" not in mem["breakdown"] and "optimizer_states" not in mem["breakdown"]
    assert report["parameters"]["trainable"] == 0
    assert _fits(report, "H100 SXM") and _fits(report, "A100 80GB")
    assert any("NF4" in a and "64" in a for a in report["assumptions"])
    assert not any("optimizer" in a or "LoRA" in a for a in report["assumptions"])


def test_bf16_inference_of_70b_needs_more_than_one_80_gb_card(tmp_path: Path) -> None:
    text, report = _estimate(tmp_path, "--context-len", "2048")
    assert report["memory"]["breakdown"]["weights"] == pytest.approx(PARAMS * 2 / GIB, rel=0.005)
    assert not _fits(report, "H100 SXM") and not _fits(report, "A100 80GB")
    assert "trainable" not in text
    # fp8 KV cache: one byte per element.
    _, fp8_kv = _estimate(tmp_path, "--quantization", "awq", "--kv-cache-dtype", "fp8", "--context-len", "2048")
    assert fp8_kv["memory"]["breakdown"]["kv_cache"] == pytest.approx(
        2048 * KV_BYTES_PER_TOKEN_BF16 / 2 / GIB,
        abs=1e-3,  # the report rounds to MiB
    )


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (("--method", "qlora"), "method"),
        (("--quantization", "int3"), "--quantization"),
        (("--precision", "bf16-mixed"), "precision"),
        (("--optimizer", "adamw-8bit"), "optimizer"),
        (("--gradient-checkpointing",), "gradient_checkpointing"),
    ],
)
def test_training_settings_in_an_inference_plan_are_one_line_errors(
    tmp_path: Path, args: tuple[str, ...], field: str
) -> None:
    out = _gpuplan(tmp_path, "estimate", "--model", "meta-llama/Llama-3.1-70B", "--mode", "inference", *args)
    assert out.returncode == 2, out.stdout
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and field in lines[-1], out.stderr


def test_serving_formats_are_refused_for_training(tmp_path: Path) -> None:
    out = _gpuplan(
        tmp_path, "estimate", "--model", "meta-llama/Llama-3.1-8B", "--method", "qlora", "--quantization", "awq"
    )
    assert out.returncode == 2
    assert out.stderr.strip().startswith("gpuplan: error: quantization:") and "inference" in out.stderr
