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

from services.catalog.gpus import find_gpu
from services.estimator.fit import usable_card_bytes
from services.estimator.validation import parse_plan
from services.export.target import FORMAT_FRAMEWORK
from services.planner.batching import batch_split
from services.planner.constraints import Constraints
from services.planner.planner import plan_context
from services.planner.search import fitting_configs

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


# --gpus N moves the plan to another GPU count: the files keep its effective batch (micro-batch x accumulation x
# GPUs) with the planner's split for N (services/planner/batching.py), not the plan's accumulation times N GPUs.
LORA_PLAN = {
    "model": {"name": "meta-llama/Llama-3.1-8B"},
    "method": "lora",
    "framework": "hf-trainer",
    "lora": {"rank": 16, "alpha": 32, "targets": "all-linear"},
    "precision": "bf16",
    "optimizer": "adamw",
    "micro_batch_size": 4,
    "gradient_accumulation_steps": 4,
    "seq_len": 2048,
    "gradient_checkpointing": True,
    "gpus": 1,
    "sharding": "none",
}
# A full fine-tune whose setup offloads the optimizer to the CPU under ZeRO-3 on 4 GPUs: 2 x 4 x 4 = 32 samples.
OFFLOAD_PLAN = {
    "model": {"name": "meta-llama/Llama-3.1-8B"},
    "method": "full",
    "framework": "hf-trainer",
    "precision": "bf16",
    "optimizer": "adamw",
    "micro_batch_size": 2,
    "gradient_accumulation_steps": 4,
    "seq_len": 2048,
    "gradient_checkpointing": True,
    "gpus": 4,
    "sharding": "zero3",
    "cpu_offload": True,
}


def _plan_file(tmp_path: Path, plan: dict[str, object], **fields: object) -> str:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({**plan, **fields}))
    return str(path)


def _launched_gpus(out: Path) -> int:
    """The processes launch.sh starts (one node): torchrun/tune --nproc_per_node, deepspeed --num_gpus,
    accelerate --num_processes or accelerate.yaml's num_processes; plain python is one."""
    command = (out / "launch.sh").read_text().splitlines()[-1]
    found = re.search(r"--(?:nproc_per_node|num_gpus|num_processes) (\d+)", command)
    if found is not None:
        return int(found[1])
    if "--config_file accelerate.yaml" in command:
        return int(yaml.safe_load((out / "accelerate.yaml").read_text())["num_processes"])
    assert command.startswith("python "), command
    return 1


def _exported_batch(out: Path, fmt: str) -> tuple[int, int, int]:
    """(micro-batch, accumulation, GPUs) as the written files run them."""
    if fmt == "torchtune":
        config = yaml.safe_load((out / "config.yaml").read_text())
        micro, steps = config["batch_size"], config["gradient_accumulation_steps"]
    elif fmt == "axolotl":
        config = yaml.safe_load((out / "axolotl.yaml").read_text())
        micro, steps = config["micro_batch_size"], config["gradient_accumulation_steps"]
    else:
        args = json.loads((out / "hf_args.json").read_text())["training_args"]
        micro, steps = args["per_device_train_batch_size"], args["gradient_accumulation_steps"]
    gpus = _launched_gpus(out)
    if (out / "ds_config.json").exists():
        # DeepSpeed checks its own train_batch_size against the world size: it must say the same.
        ds = json.loads((out / "ds_config.json").read_text())
        assert (ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]) == (micro, steps)
        assert ds["train_batch_size"] == micro * steps * gpus
    return micro, steps, gpus


def _exported_sharding(stdout: str) -> str:
    """The sharding the setup line names ('<fmt>: 2 x A100 80GB, zero2, micro-batch 8, ...')."""
    found = re.search(r": \d+ x [^,]+, (\w+)(?:, CPU offload)?, micro-batch (\d+)", stdout)
    assert found is not None, stdout
    return found[1]


def _planners_micro_batch(plan: dict[str, object], fmt: str, card: str, gpus: int, sharding: str) -> int:
    """The micro-batch the planner's own search (services/planner/search.py ``fitting_configs``) keeps for ``gpus``
    x ``card`` under ``sharding``, the plan sized with the framework ``fmt`` runs: what --gpus must export."""
    with_data = {**plan, "framework": FORMAT_FRAMEWORK[fmt], "sharding": sharding, "data": {"tokens": 1_000_000}}  # type: ignore[index]
    _, ctx = plan_context(parse_plan(with_data), Constraints())
    usable = usable_card_bytes(find_gpu(card).memory_gib, Constraints().safety_margin)
    found = [
        c.micro_batch_size
        for c in fitting_configs(ctx, usable, gpus, offload=False)
        if c.sharding == sharding and c.checkpointing == plan["gradient_checkpointing"] and c.optimizer is None
    ]
    assert len(found) == 1, found
    return found[0]


def _check_agreement(result: subprocess.CompletedProcess[str], out: Path, fmt: str, micro: int, steps: int) -> None:
    """The setup line, the --gpus note and the files' headers name the micro-batch and accumulation the files run."""
    assert f", micro-batch {micro}," in result.stdout.splitlines()[0], result.stdout
    step_word = "step" if steps == 1 else "steps"
    assert f"micro-batch {micro} x {steps} accumulation {step_word}" in result.stderr
    for name in ("train.py", "config.yaml", "axolotl.yaml"):
        if (out / name).exists():
            assert f"micro-batch {micro} x " in (out / name).read_text(), name


@pytest.mark.parametrize("fmt", ["hf-trainer", "accelerate", "deepspeed", "torchtune", "axolotl"])
@pytest.mark.parametrize(
    ("plan_gpus", "plan_steps", "gpus"),
    [
        (1, 4, 2),  # 4 x 4 x 1 = 16: 8 samples per GPU on 2 GPUs
        (1, 4, 8),  # 16 over 8 GPUs is 2 each: the micro-batch shrinks
        (8, 1, 2),  # 4 x 1 x 8 = 32 on 2 GPUs: 16 samples per GPU
    ],
)
def test_gpus_keeps_the_plans_effective_batch(
    fmt: str, plan_gpus: int, plan_steps: int, gpus: int, tmp_path: Path
) -> None:
    plan = _plan_file(tmp_path, LORA_PLAN, gpus=plan_gpus, gradient_accumulation_steps=plan_steps)
    planned = 4 * plan_steps * plan_gpus
    out = tmp_path / "run"
    args = ("--format", fmt, "--gpu", "a100-80gb", "--gpus", str(gpus), "--out", str(out))
    result = gpuplan("export", "--plan", plan, *args)
    assert result.returncode == 0, result.stderr
    micro, steps, launched = _exported_batch(out, fmt)
    assert launched == gpus
    assert micro * steps * launched == planned
    # The micro-batch the planner picks for that layout (the largest of the split that fits), not the plan's kept.
    fields = {**LORA_PLAN, "gpus": plan_gpus, "gradient_accumulation_steps": plan_steps}
    assert micro == _planners_micro_batch(fields, fmt, "a100-80gb", gpus, _exported_sharding(result.stdout))
    _check_agreement(result, out, fmt, micro, steps)
    assert f"effective batch {planned} (the plan: 4 x {plan_steps} x {plan_gpus} = {planned})" in result.stderr


# A LoRA plan priced at micro-batch 2 x 8 accumulation steps on one GPU: on 2 or 4 A100 80GB a larger micro-batch
# fits (the planner runs 8 x 1 and 4 x 1 there); the export used to keep 2 (2 x 4 and 2 x 2), slower than need be.
@pytest.mark.parametrize("fmt", ["hf-trainer", "deepspeed", "torchtune", "axolotl"])
@pytest.mark.parametrize(("gpus", "split"), [(2, (8, 1)), (4, (4, 1))])
def test_gpus_takes_the_largest_micro_batch_that_fits_as_the_planner_does(
    fmt: str, gpus: int, split: tuple[int, int], tmp_path: Path
) -> None:
    fields = {**LORA_PLAN, "micro_batch_size": 2, "gradient_accumulation_steps": 8}
    out = tmp_path / "run"
    args = ("--format", fmt, "--gpu", "a100-80gb", "--gpus", str(gpus), "--out", str(out))
    result = gpuplan("export", "--plan", _plan_file(tmp_path, fields), *args)
    assert result.returncode == 0, result.stderr
    micro, steps, launched = _exported_batch(out, fmt)
    assert (micro, steps, launched) == (*split, gpus)
    assert micro == _planners_micro_batch(fields, fmt, "a100-80gb", gpus, _exported_sharding(result.stdout))
    _check_agreement(result, out, fmt, micro, steps)
    assert f"micro-batch {micro}, the largest of the split that fits {gpus} x A100 80GB" in result.stderr


def test_gpus_keeps_a_micro_batch_that_is_already_the_largest_that_fits(tmp_path: Path) -> None:
    # 8B LoRA at 4,096 tokens on an A100 40GB: micro-batch 2 is the largest that fits one GPU, and on 2 GPUs too
    # (8 samples each): 2 x 4, as the plan's micro-batch; the setup line names it.
    fields = {**LORA_PLAN, "seq_len": 4096, "micro_batch_size": 2, "gradient_accumulation_steps": 8}
    out = tmp_path / "run"
    args = ("--format", "hf-trainer", "--gpu", "a100-40gb", "--gpus", "2", "--out", str(out))
    result = gpuplan("export", "--plan", _plan_file(tmp_path, fields), *args)
    assert result.returncode == 0, result.stderr
    assert _exported_batch(out, "hf-trainer") == (2, 4, 2)
    assert _planners_micro_batch(fields, "hf-trainer", "a100-40gb", 2, "none") == 2
    _check_agreement(result, out, "hf-trainer", 2, 4)
    assert "the largest of the split that fits" not in result.stderr


# A full fine-tune planned at 1 x 8 x 4 GPUs under ZeRO-3 or FSDP: on 8 H100s each GPU takes 4 samples, and the
# planner runs all 4 as one micro-batch (the export kept 1 x 4).
@pytest.mark.parametrize(
    ("fmt", "sharding", "written"),
    [("deepspeed", "zero3", "zero3"), ("accelerate", "fsdp", "fsdp"), ("torchtune", "fsdp", "fsdp")],
)
def test_gpus_full_fine_tune_under_sharding_takes_the_planners_micro_batch(
    fmt: str, sharding: str, written: str, tmp_path: Path
) -> None:
    fields = {
        **OFFLOAD_PLAN,
        "cpu_offload": False,
        "sharding": sharding,
        "micro_batch_size": 1,
        "gradient_accumulation_steps": 8,
    }
    out = tmp_path / "run"
    args = ("--format", fmt, "--gpu", "h100", "--gpus", "8", "--out", str(out))
    result = gpuplan("export", "--plan", _plan_file(tmp_path, fields), *args)
    assert result.returncode == 0, result.stderr
    assert _exported_sharding(result.stdout) == written
    micro, steps, launched = _exported_batch(out, fmt)
    assert (micro, steps, launched) == (4, 1, 8)
    assert micro == _planners_micro_batch(fields, fmt, "h100", 8, written)
    _check_agreement(result, out, fmt, micro, steps)
    if fmt == "deepspeed":
        assert json.loads((out / "ds_config.json").read_text())["zero_optimization"]["stage"] == 3
    elif fmt == "accelerate":
        assert yaml.safe_load((out / "accelerate.yaml").read_text())["distributed_type"] == "FSDP"


def test_gpus_that_cannot_split_the_batch_take_the_planners_next_larger_one(tmp_path: Path) -> None:
    # 16 samples do not split over 3 GPUs: as the planner does (batch_split), 6 each = 18, said in a note.
    out = tmp_path / "run"
    args = ("--format", "deepspeed", "--gpu", "a100-80gb", "--gpus", "3", "--out", str(out))
    result = gpuplan("export", "--plan", _plan_file(tmp_path, LORA_PLAN), *args)
    assert result.returncode == 0, result.stderr
    micro, steps, gpus = _exported_batch(out, "deepspeed")
    assert gpus == 3 and micro * steps * gpus == batch_split(16, 3).effective_batch_size == 18
    # The planner's micro-batch for 6 samples per GPU: the largest that fits, here all 6 in one step.
    assert (micro, steps) == (6, 1) == (_planners_micro_batch(LORA_PLAN, "deepspeed", "a100-80gb", 3, "zero2"), 1)
    assert "effective batch 18 instead of the plan's 16: 16 samples do not split evenly over 3 GPUs" in result.stderr


@pytest.mark.parametrize(
    ("fmt", "sharding", "offloaded"),
    [
        ("hf-trainer", "zero3", "ds"),  # the Trainer formats share ds_config.json
        ("deepspeed", "fsdp", "ds"),  # FSDP runs as ZeRO-3 under DeepSpeed
        ("hf-trainer", "fsdp", "hf"),
        ("accelerate", "fsdp", "accelerate"),
        ("axolotl", "fsdp", "axolotl"),
    ],
)
def test_one_gpu_keeps_the_plans_offload_under_its_sharding(
    fmt: str, sharding: str, offloaded: str, tmp_path: Path
) -> None:
    # Offload runs only under ZeRO or FSDP (the estimator refuses it with sharding none, the trainers ignore it):
    # on 1 GPU the export keeps the plan's sharding, which DeepSpeed and FSDP run as a group of one.
    plan = _plan_file(tmp_path, OFFLOAD_PLAN, sharding=sharding)
    out = tmp_path / "run"
    result = gpuplan("export", "--plan", plan, "--format", fmt, "--gpu", "h100", "--gpus", "1", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert f"1 x H100 SXM, {'zero3' if fmt == 'deepspeed' else sharding}," in result.stdout
    micro, steps, gpus = _exported_batch(out, fmt)
    assert gpus == 1 and micro * steps == 32  # the plan's 2 x 4 x 4 = 32 samples
    # The micro-batch the planner picks for one H100 under the sharding and offload the files run.
    written = "zero3" if fmt == "deepspeed" else sharding
    assert micro == _planners_micro_batch(OFFLOAD_PLAN, fmt, "h100", 1, written) > 2
    if offloaded == "ds":
        zero = json.loads((out / "ds_config.json").read_text())["zero_optimization"]
        assert zero["stage"] == 3
        assert zero["offload_optimizer"]["device"] == zero["offload_param"]["device"] == "cpu"
    elif offloaded == "hf":
        args = json.loads((out / "hf_args.json").read_text())["training_args"]
        assert args["fsdp"] is True and args["fsdp_config"]["cpu_offload"] is True
    elif offloaded == "accelerate":
        config = yaml.safe_load((out / "accelerate.yaml").read_text())
        assert config["distributed_type"] == "FSDP" and config["fsdp_config"]["fsdp_offload_params"] is True
    else:
        assert yaml.safe_load((out / "axolotl.yaml").read_text())["fsdp_config"]["offload_params"] is True
    # A sharded single GPU needs a distributed launch (a group of one), not plain python.
    assert not (out / "launch.sh").read_text().splitlines()[-1].startswith("python ")


def test_one_gpu_torchtune_refuses_the_plans_offload_naming_it(tmp_path: Path) -> None:
    plan = _plan_file(tmp_path, OFFLOAD_PLAN, sharding="fsdp")
    result = gpuplan("export", "--plan", plan, "--format", "torchtune", "--gpu", "h100", "--gpus", "1")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuplan: error: cpu_offload:"), lines


def test_gpus_whose_one_step_outnumbers_the_runs_samples_are_refused(tmp_path: Path) -> None:
    # 400 examples of 512 tokens: the files pack them into 100 rows of 2,048 tokens, so 128 GPUs (one step of 128
    # samples) would never make a step; 65,536 GPUs were exported.
    plan = _plan_file(tmp_path, LORA_PLAN, data={"examples": 400, "avg_tokens_per_example": 512})
    args = ("export", "--plan", plan, "--format", "hf-trainer", "--gpu", "a100-80gb")
    refused = gpuplan(*args, "--gpus", "128")
    assert refused.returncode == 2 and refused.stdout == ""
    (line,) = refused.stderr.splitlines()
    assert line == (
        "gpuplan: error: --gpus 128: one optimizer step would take 128 samples, more than the 100 the run trains in "
        "all (the plan's step takes 16); use fewer GPUs"
    )
    assert gpuplan(*args, "--gpus", "64").returncode == 0


def test_short_examples_are_exported_as_the_files_run_them_packed(tmp_path: Path) -> None:
    # hf-trainer's default pads each micro-batch to its longest sample, which the plan was priced with; train.py packs.
    from services.export.replan import describe_setup
    from services.planner import plan_setups

    fields = {**LORA_PLAN, "data": {"examples": 20_000, "avg_tokens_per_example": 400}}
    result = gpuplan("export", "--plan", _plan_file(tmp_path, fields), "--format", "hf-trainer")
    assert result.returncode == 0, result.stderr
    assert "re-planned for hf-trainer: padding null -> packed" in result.stderr
    packed = plan_setups(parse_plan({**fields, "padding": "packed"})).recommendations[0]
    assert (
        result.stdout.strip().splitlines()[-2]
        == f"# hf-trainer: the planner's cheapest setup: {describe_setup(packed)}"
    )
