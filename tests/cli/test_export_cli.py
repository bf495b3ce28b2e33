"""`gpuplan export` through the console entry point, as a user runs it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "infra" / "examples" / "llama-3.1-8b-qlora.json"
GPUPLAN = shutil.which("gpuplan", path=str(ROOT / ".venv" / "bin")) or "gpuplan"


def gpuplan(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([GPUPLAN, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=120)


@pytest.mark.parametrize("fmt", ["hf-trainer", "accelerate", "deepspeed", "torchtune", "axolotl"])
def test_the_readme_plan_exports_in_every_format(fmt: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = gpuplan("export", "--plan", str(EXAMPLE), "--format", fmt, "--out", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    first, wrote = result.stdout.strip().splitlines()
    # The setup line the README shows: card, sharding, micro-batch, checkpointing, peak of memory.
    setup = re.fullmatch(
        rf"{fmt}: the planner's cheapest setup: (\d+) x (.+), (\w+), micro-batch (\d+), checkpointing, "
        r"([\d.]+) GiB of (\d+) GiB",
        first,
    )
    assert setup is not None, first
    assert float(setup[5]) < float(setup[6])
    assert wrote.startswith("wrote ") and "start with:" in wrote
    files = {p.name for p in out.iterdir()}
    assert {"launch.sh", "requirements.txt", "check_versions.py"} <= files
    assert os.access(out / "launch.sh", os.X_OK)
    if fmt in ("torchtune", "axolotl"):
        # Sized with hf-trainer's defaults: planned again for the format's framework, and said so.
        assert f"re-planned for {fmt}" in result.stderr
    if fmt == "deepspeed":
        # Which setup is cheapest follows the estimator and the price lists: whatever was picked, the config's
        # ZeRO stage is the sharding the setup line names (none moves to ZeRO-2, FSDP to ZeRO-3, and the
        # stderr note says so).
        if setup[1] == "1":
            assert "sharding none -> zero2 for deepspeed" in result.stderr
        stage = {"zero1": 1, "zero2": 2, "zero3": 3}[setup[3]]
        assert json.loads((out / "ds_config.json").read_text())["zero_optimization"]["stage"] == stage


def test_a_single_gpu_deepspeed_export_moves_no_sharding_to_zero2(tmp_path: Path) -> None:
    # Which setup is cheapest follows the estimator and the price lists; the card given here pins it.
    out = tmp_path / "run"
    args = ("export", "--plan", str(EXAMPLE), "--format", "deepspeed", "--gpu", "L40S", "--gpus", "1")
    result = gpuplan(*args, "--out", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "re-planned for deepspeed: sharding none -> zero2" in result.stderr
    assert json.loads((out / "ds_config.json").read_text())["zero_optimization"]["stage"] == 2


def test_the_data_format_flag_sets_what_the_files_read(tmp_path: Path) -> None:
    for fmt, name in (("hf-trainer", "train.py"), ("torchtune", "config.yaml"), ("axolotl", "axolotl.yaml")):
        out = tmp_path / fmt
        result = gpuplan(
            "export", "--plan", str(EXAMPLE), "--format", fmt, "--data-format", "sharegpt", "--out", str(out)
        )
        assert result.returncode == 0, result.stderr
        assert "Data (--data-format): JSON lines with a 'conversations' list" in result.stderr
        text = (out / name).read_text()
        if name == "train.py":
            assert "row['conversations']" in text and "apply_chat_template" in text
        elif name == "config.yaml":
            assert yaml.safe_load(text)["dataset"]["conversation_style"] == "sharegpt"
        else:
            assert yaml.safe_load(text)["datasets"][0]["field_messages"] == "conversations"


def test_export_on_a_given_card_prints_the_files(tmp_path: Path) -> None:
    result = gpuplan("export", "--plan", str(EXAMPLE), "--format", "accelerate", "--gpu", "a100-80gb", "--gpus", "4")
    assert result.returncode == 0, result.stderr
    assert "===== accelerate.yaml =====" in result.stdout and "num_processes: 4" in result.stdout
    assert "# accelerate: 4 x A100 80GB" in result.stdout


def test_the_version_check_runs_first(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert gpuplan("export", "--plan", str(EXAMPLE), "--format", "axolotl", "--out", str(out)).returncode == 0
    launch = (out / "launch.sh").read_text().splitlines()
    assert launch[-2] == "python check_versions.py"
    # The run's checkpoint folder and resume.py's choice follow the command (services/export/resume.py).
    resume = r' --output_dir="\$GPUPLAN_CHECKPOINT_DIR" "\$\{RESUME\[@\]\}"'
    command = r"accelerate launch --multi_gpu --num_processes \d+ -m axolotl.cli.train axolotl.yaml"
    assert re.fullmatch(command + resume, launch[-1])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--format", "hf-trainer", "--data-format", "csv"], "--data-format"),
        (["--format", "nope"], "--format"),
        (["--format", "torchtune", "--gpus", "2"], "--gpus needs --gpu"),
        (["--format", "hf-trainer", "--gpu", "no-such-card"], "no-such-card"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    result = gpuplan("export", "--plan", str(EXAMPLE), *args)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuplan: error:") and message in lines[0], lines
    assert "Traceback" not in result.stderr


def test_a_busy_out_directory_is_left_alone(tmp_path: Path) -> None:
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("keep me")
    result = gpuplan("export", "--plan", str(EXAMPLE), "--format", "hf-trainer", "--out", str(tmp_path / "busy"))
    assert result.returncode == 2 and "--out" in result.stderr
    assert [p.name for p in (tmp_path / "busy").iterdir()] == ["x"]
    assert (tmp_path / "busy" / "x").read_text() == "keep me"


def test_kernels_liger_is_exported_or_refused_naming_the_field(tmp_path: Path) -> None:
    plan = {**json.loads(EXAMPLE.read_text()), "kernels": "liger"}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    out = tmp_path / "run"
    result = gpuplan("export", "--plan", str(tmp_path / "plan.json"), "--format", "hf-trainer", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert json.loads((out / "hf_args.json").read_text())["training_args"]["use_liger_kernel"] is True
    assert "liger-kernel==0.8.1" in (out / "requirements.txt").read_text().splitlines()
    result = gpuplan(
        "export", "--plan", str(tmp_path / "plan.json"), "--format", "axolotl", "--out", str(tmp_path / "ax")
    )
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load((tmp_path / "ax" / "axolotl.yaml").read_text())["liger_fused_linear_cross_entropy"] is True
    result = gpuplan("export", "--plan", str(tmp_path / "plan.json"), "--format", "torchtune")
    assert result.returncode == 2 and "error: kernels:" in result.stderr and "Traceback" not in result.stderr, (
        result.stderr
    )
