"""Exports that resume: train.py run for real on a tiny random Llama, preempted, restored through `gpuplan
restore` from the loopback S3 server, and resumed; resume.py's choice of the newest complete checkpoint.

The run: hf-trainer export of a 2-layer, 32-wide Llama (LoRA, fp32, CPU), checkpoints every 2 steps (the
export's save_steps from its checkpoint interval), 4 steps on the first node with a validation file; `gpuplan
sync` makes the checkpoints durable in the run's bucket; the first node is lost; the second node restores the
latest into the checkpoint folder beside a cut save (no trainer_state.json) and trains to step 6.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from services.cli.main import main
from services.estimator.plan import Plan
from services.export import ExportBundle
from tests.conftest import S3_TEST_CREDENTIALS
from tests.export.helpers import export, llama_plan, write_files
from tests.export.test_generated_code import _tokenizer
from tests.runs.conftest import RunEnv, live_api, run_env  # noqa: F401  (fixtures)

WORDS = ["what", "is", "two", "plus", "four", "it", "below", "an", "instruction"]


def _tiny_model(where: Path) -> dict[str, Any]:
    """A random 2-layer Llama and the WordLevel tokenizer of test_generated_code, saved for from_pretrained."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("peft")
    pytest.importorskip("datasets")
    config = transformers.LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
        max_position_embeddings=64,
    )
    transformers.LlamaForCausalLM(config).save_pretrained(where)
    _tokenizer().save_pretrained(where)
    saved: dict[str, Any] = json.loads((where / "config.json").read_text())
    return saved


def _bundle(model_dir: Path, config: dict[str, Any]) -> ExportBundle:
    plan = Plan.model_validate(
        {
            "model": {"name": str(model_dir), "config": config},
            "method": "lora",
            "framework": "hf-trainer",
            "lora": {"rank": 4, "alpha": 8, "targets": "all-linear"},
            "precision": "fp32",
            "optimizer": "adamw",
            "micro_batch_size": 2,
            "seq_len": 16,
            "gradient_accumulation_steps": 1,
            "gradient_checkpointing": False,
        }
    )
    # A 2 s checkpoint interval at 1 s per optimizer step: save (and evaluate) every 2 steps.
    return export(plan, "hf-trainer", checkpoint_interval_s=2, step_seconds=1, peak_gib_per_gpu=1.0)


def _rows(count: int, seed: int) -> str:
    return "".join(
        json.dumps({"text": " ".join(WORDS[(seed + i + j) % len(WORDS)] for j in range(7))}) + "\n"
        for i in range(count)
    )


def _train(where: Path, checkpoints: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GPUPLAN_CHECKPOINT_DIR": str(checkpoints), "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(
        [sys.executable, "train.py", "--logging_steps", "1", *flags],
        cwd=where,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def _state(checkpoint: Path) -> dict[str, Any]:
    state: dict[str, Any] = json.loads((checkpoint / "trainer_state.json").read_text())
    return state


@pytest.fixture
def s3_env(run_env: RunEnv, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    monkeypatch.setenv("GPUPLAN_S3_ENDPOINT_URL", run_env.s3.s3_endpoint_url or "")
    monkeypatch.setenv("GPUPLAN_S3_ACCESS_KEY_ID", S3_TEST_CREDENTIALS["s3_access_key_id"])
    monkeypatch.setenv("GPUPLAN_S3_SECRET_ACCESS_KEY", S3_TEST_CREDENTIALS["s3_secret_access_key"])


def test_a_preempted_run_restored_from_the_bucket_continues_its_steps(
    run_env: RunEnv,  # noqa: F811
    live_api: str,  # noqa: F811
    s3_env: None,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    model_dir = tmp_path / "model"
    bundle = _bundle(model_dir, _tiny_model(model_dir))
    connect = ["--api", live_api, "--key", run_env.key, "--run", run_env.run_id]

    # Node 1: 4 steps with a validation file; checkpoints at steps 2 and 4, made durable by a sync pass.
    node1 = write_files(bundle.files, tmp_path / "node1")
    (node1 / "train.jsonl").write_text(_rows(40, 0))
    (node1 / "validation.jsonl").write_text(_rows(8, 3))
    first = _train(node1, node1 / "ckpt", "--max_steps", "4")
    assert "no complete checkpoint: training from the start" in first.stderr
    assert sorted(p.name for p in (node1 / "ckpt").iterdir()) == ["checkpoint-2", "checkpoint-4"]
    evaluated = [e["step"] for e in _state(node1 / "ckpt" / "checkpoint-4")["log_history"] if "eval_loss" in e]
    assert evaluated == [2, 4]
    assert main(["sync", *connect, "--dir", str(node1 / "ckpt"), "--settle-s", "0"]) == 0
    assert "step 4: durable" in capsys.readouterr().out

    # Preempted: node 1 and its disk are gone. Node 2 has the export and the data, no validation file.
    shutil.rmtree(node1)
    node2 = write_files(bundle.files, tmp_path / "node2")
    (node2 / "train.jsonl").write_text(_rows(40, 0))
    checkpoints = node2 / "ckpt"
    assert main(["restore", *connect, "--to", str(checkpoints)]) == 0
    assert "step 4:" in capsys.readouterr().out
    restored = checkpoints / "checkpoint-4"
    assert _state(restored)["global_step"] == 4
    # A save cut by the preemption: a newer folder without trainer_state.json must not be resumed from.
    shutil.copytree(restored, checkpoints / "checkpoint-9")
    (checkpoints / "checkpoint-9" / "trainer_state.json").unlink()

    second = _train(node2, checkpoints, "--max_steps", "6")
    assert f"resuming from {restored}" in second.stderr
    state = _state(checkpoints / "checkpoint-6")
    assert state["global_step"] == 6 > _state(restored)["global_step"]
    steps = [entry["step"] for entry in state["log_history"] if "loss" in entry]
    # Steps 1-4 come from node 1's state, 5-6 from node 2: none trained again, none restarted at 1.
    assert steps == [1, 2, 3, 4, 5, 6], steps
    # Node 1's evaluations are in the history (node 2 has no validation file, so it evaluates nothing).
    assert [e["step"] for e in state["log_history"] if "eval_loss" in e] == [2, 4]
    assert not (checkpoints / "checkpoint-2").exists()  # nothing re-saved from the start


def _resume_module(bundle: ExportBundle, where: Path) -> ModuleType:
    write_files(bundle.files, where)
    spec = importlib.util.spec_from_file_location(f"resume_{where.name}", where / "resume.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _checkpoint(root: Path, name: str, complete: bool) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "adapter_model.safetensors").write_bytes(b"weights")
    if complete:
        (folder / "trainer_state.json").write_text('{"global_step": 1}')
    return folder


def test_an_incomplete_checkpoint_is_not_resumed_from(tmp_path: Path) -> None:
    resume = _resume_module(export(llama_plan("hf-trainer", "lora"), "hf-trainer"), tmp_path / "files")
    out = tmp_path / "out"
    assert resume.last_hf_checkpoint(out) is None  # no folder yet: a fresh start
    _checkpoint(out, "checkpoint-100", complete=True)
    _checkpoint(out, "checkpoint-200", complete=False)  # cut mid-save
    (out / "checkpoint-300.partial").mkdir()  # a restore still downloading (services/runs/restore.py)
    assert resume.last_hf_checkpoint(out) == str(out / "checkpoint-100")
    # transformers' own choice would be the cut one: it checks the name only.
    trainer_utils = pytest.importorskip("transformers.trainer_utils")
    assert trainer_utils.get_last_checkpoint(str(out)) == str(out / "checkpoint-200")
    _checkpoint(out, "checkpoint-1000", complete=True)  # numbers, not names, order them
    assert resume.last_hf_checkpoint(out) == str(out / "checkpoint-1000")


def _run_resume(where: Path, kind: str, checkpoints: Path) -> tuple[list[str], str]:
    result = subprocess.run(
        [sys.executable, "resume.py", kind],
        cwd=where,
        env={**os.environ, "GPUPLAN_CHECKPOINT_DIR": str(checkpoints)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines(), result.stderr


def _age(path: Path, seconds_ago: float) -> None:
    then = time.time() - seconds_ago
    for item in [*path.rglob("*"), path]:
        os.utime(item, (then, then))


def test_torchtune_resumes_from_the_epoch_its_recipe_state_belongs_to(tmp_path: Path) -> None:
    files = write_files(export(llama_plan("torchtune", "lora"), "torchtune").files, tmp_path / "files")
    out = tmp_path / "out"
    assert _run_resume(files, "torchtune-lora", out)[0] == []  # nothing there: fresh start
    for epoch in (0, 1):
        (out / f"epoch_{epoch}").mkdir(parents=True)
        (out / f"epoch_{epoch}" / "adapter_model.pt").write_bytes(b"adapter")
    (out / "recipe_state").mkdir()
    (out / "recipe_state" / "recipe_state.pt").write_bytes(b"state")
    _age(out / "epoch_0", 300)
    _age(out / "recipe_state", 200)
    _age(out / "epoch_1", 100)  # written after the state: cut before its recipe state was saved
    args, said = _run_resume(files, "torchtune-lora", out)
    assert args == [
        "resume_from_checkpoint=True",
        "checkpointer.recipe_checkpoint=recipe_state/recipe_state.pt",
        "checkpointer.adapter_checkpoint=epoch_0/adapter_model.pt",
    ]
    assert "resuming from epoch_0/adapter_model.pt" in said
    # Full fine-tuning reads the weights of that epoch.
    (out / "epoch_0" / "model-00001-of-00002.safetensors").write_bytes(b"w")
    (out / "epoch_0" / "model-00002-of-00002.safetensors").write_bytes(b"w")
    _age(out / "epoch_0", 300)
    args, _ = _run_resume(files, "torchtune-full", out)
    assert args[-1] == (
        "checkpointer.checkpoint_files=[epoch_0/model-00001-of-00002.safetensors,"
        "epoch_0/model-00002-of-00002.safetensors]"
    )


@pytest.mark.parametrize("fmt", ["hf-trainer", "accelerate", "deepspeed", "torchtune", "axolotl"])
def test_launch_sh_names_the_checkpoint_folder_and_keeps_a_given_one(fmt: str, tmp_path: Path) -> None:
    fields = {"gpus": 2, "sharding": "zero2"} if fmt == "deepspeed" else {}
    files = write_files(export(llama_plan(fmt, "lora", **fields), fmt).files, tmp_path)
    launch = (files / "launch.sh").read_text()
    setup = [line for line in launch.splitlines() if line.startswith(("export ", "mapfile "))]
    # The setup lines as bash runs them: the default, a value the caller set, and resume.py's arguments.
    script = "\n".join([*setup, 'printf "%s|" "$GPUPLAN_CHECKPOINT_DIR" ${RESUME[@]+"${RESUME[@]}"}'])

    def run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-c", script], cwd=files, env=env, capture_output=True, text=True, timeout=60)

    base = {k: v for k, v in os.environ.items() if k != "GPUPLAN_CHECKPOINT_DIR"}
    default = run(base)
    assert default.returncode == 0, default.stderr
    assert default.stdout.split("|")[0] == "outputs"
    given = run({**base, "GPUPLAN_CHECKPOINT_DIR": str(tmp_path / "run")})
    assert given.stdout.split("|")[0] == str(tmp_path / "run")
    if fmt == "axolotl":
        assert given.stdout.split("|")[1] == "--auto_resume_from_checkpoints=False"  # nothing to resume
        _checkpoint(tmp_path / "run", "checkpoint-8", complete=True)
        _checkpoint(tmp_path / "run", "checkpoint-9", complete=False)
        resumed = run({**base, "GPUPLAN_CHECKPOINT_DIR": str(tmp_path / "run")})
        assert resumed.stdout.split("|")[1] == f"--resume_from_checkpoint={tmp_path / 'run' / 'checkpoint-8'}"
    if fmt in ("torchtune", "axolotl"):
        command = launch.rstrip().splitlines()[-1]
        assert '"$GPUPLAN_CHECKPOINT_DIR"' in command and command.endswith('"${RESUME[@]}"')
