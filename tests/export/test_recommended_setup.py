"""The exported files run the setup the planner recommended, field by field, read with json/yaml.

The expected values come from the Recommendation itself (what the user was quoted), not from the export's
own readers, so a setting the export drops shows up as a wrong value here.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.export.errors import ExportError
from services.export.models import ExportBundle
from services.export.render import comment_block
from services.export.target import apply_setup
from services.planner.models import Recommendation
from tests.conftest import LLAMA_8B
from tests.export.helpers import export, llama_plan
from tests.export.test_roundtrip import recommendation

# The names each tool takes for the planner's 8-bit optimizers: the Trainer's OptimizerNames
# (transformers training_args.py) and the bitsandbytes classes torchtune instantiates.
TRAINER_OPTIM = {"adamw-8bit": "adamw_bnb_8bit", "paged-adamw-8bit": "paged_adamw_8bit"}
TORCHTUNE_OPTIM = {
    "adamw-8bit": "bitsandbytes.optim.AdamW8bit",
    "paged-adamw-8bit": "bitsandbytes.optim.PagedAdamW8bit",
}


def written_optimizer(fmt: str, bundle: ExportBundle) -> str:
    files = bundle.files
    if fmt == "torchtune":
        return str(yaml.safe_load(files["config.yaml"])["optimizer"]["_component_"])
    if fmt == "axolotl":
        return str(yaml.safe_load(files["axolotl.yaml"])["optimizer"])
    return str(json.loads(files["hf_args.json"])["training_args"]["optim"])


def one_gpu_setup(fmt: str, **fields: Any) -> Any:
    # DeepSpeed runs ZeRO only; the others run this single card unsharded.
    sharding = "zero2" if fmt == "deepspeed" else "none"
    shape = {"gpus": 1, "gpus_per_node": 1, "nodes": 1, "sharding": sharding, "cpu_offload": False}
    return recommendation(**{**shape, "micro_batch_size": 1, "gradient_accumulation_steps": 4, **fields})


@pytest.mark.parametrize("fmt", ["hf-trainer", "accelerate", "deepspeed", "torchtune", "axolotl"])
@pytest.mark.parametrize("optimizer", ["adamw-8bit", "paged-adamw-8bit"])
def test_the_optimizer_the_planner_switched_to_is_the_one_exported(fmt: str, optimizer: str) -> None:
    # With constraints.allow_optimizer_change the planner fits full fine-tuning of an adamw plan by switching
    # to an 8-bit optimizer (services/planner/search.py); the setup's memory and price assume that optimizer.
    plan = llama_plan(fmt, "full", optimizer="adamw")
    bundle = export(plan, fmt, setup=one_gpu_setup(fmt, optimizer=optimizer))
    wanted = TORCHTUNE_OPTIM if fmt == "torchtune" else TRAINER_OPTIM
    assert written_optimizer(fmt, bundle) == wanted[optimizer]


# Builds the Trainer from hf_args.json as train.py does (a tiny random Llama, on the CPU): the Trainer checks the
# launch (FSDP needs a distributed one) when it is constructed, before any weights load.
_TRAINER_PROBE = """
import json, sys
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments
args = dict(json.load(open(sys.argv[1]))["training_args"], output_dir=sys.argv[2], use_cpu=True, bf16=False,
            eval_strategy="no")  # train.py switches evaluation off without validation.jsonl
config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                     num_key_value_heads=2, vocab_size=64)
trainer = Trainer(model=LlamaForCausalLM(config), args=TrainingArguments(**args))
print("parallel mode:", trainer.args.parallel_mode.value)
"""


def test_one_gpu_fsdp_with_offload_starts_under_a_launch_the_trainer_accepts(tmp_path: Path) -> None:
    # The planner recommends 1 GPU with FSDP and CPU offload for models too big for the card (e.g. 70B LoRA
    # on 1 x A10). launch.sh's launcher, run for real over the exported hf_args.json, must get past the Trainer.
    setup = one_gpu_setup("hf-trainer", sharding="fsdp", cpu_offload=True)
    bundle = export(llama_plan("hf-trainer", "lora"), "hf-trainer", setup=setup)
    args = json.loads(bundle.files["hf_args.json"])["training_args"]
    assert args["fsdp"] and args["fsdp_config"]["cpu_offload"] is True
    (tmp_path / "hf_args.json").write_text(bundle.files["hf_args.json"], encoding="utf-8")
    (tmp_path / "probe.py").write_text(_TRAINER_PROBE, encoding="utf-8")
    launch = shlex.split(bundle.files["launch.sh"].strip().splitlines()[-1])
    launcher = launch[: launch.index("train.py")]
    if launcher == ["python"]:
        argv = [sys.executable]
    else:
        assert launcher[0] == "torchrun", launcher
        # A port of this test's own range, so parallel runs do not collide on torchrun's default 29500.
        argv = [sys.executable, "-m", "torch.distributed.run", "--master_port", "18137", *launcher[1:]]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    done = subprocess.run(
        [*argv, "probe.py", "hf_args.json", str(tmp_path / "out")],
        cwd=tmp_path,
        env={**env, "CUDA_VISIBLE_DEVICES": ""},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "parallel mode: distributed" in done.stdout


# Stands in for axolotl's entry point: axolotl turns its fsdp_config into ACCELERATE_USE_FSDP (utils/trainer.py
# setup_fsdp_envs), and accelerate applies FSDP only to a distributed state, one launched with LOCAL_RANK set
# (accelerate state.py _prepare_backend: MULTI_GPU on CUDA; on this CPU-only test machine, MULTI_CPU).
_AXOLOTL_PROBE = """
import os, sys
os.environ["ACCELERATE_USE_FSDP"] = "true"
from accelerate import PartialState
state = PartialState(cpu=True).distributed_type.value
print("config:", sys.argv[1], "local rank:", os.environ.get("LOCAL_RANK"), "state:", state)
"""


def test_one_gpu_fsdp_axolotl_starts_under_a_distributed_launch(tmp_path: Path) -> None:
    # `accelerate launch --num_processes 1` runs one plain process (accelerate commands/launch.py: simple_launcher
    # without --multi_gpu, --use_fsdp or a config file), in which accelerate never applies axolotl's FSDP: the
    # recommended CPU offload would not happen and the run would not fit.
    setup = one_gpu_setup("axolotl", sharding="fsdp", cpu_offload=True)
    bundle = export(llama_plan("axolotl", "lora"), "axolotl", setup=setup)
    assert yaml.safe_load(bundle.files["axolotl.yaml"])["fsdp_config"]["offload_params"] is True
    package = tmp_path / "axolotl" / "cli"
    package.mkdir(parents=True)
    (tmp_path / "axolotl" / "__init__.py").write_text("", encoding="utf-8")
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "train.py").write_text(_AXOLOTL_PROBE, encoding="utf-8")
    launch = shlex.split(bundle.files["launch.sh"].strip().splitlines()[-1])
    launcher = launch[: launch.index("-m")]
    if launcher[0] == "accelerate":
        argv = [sys.executable, "-m", "accelerate.commands.launch", *launcher[2:]]
    else:
        assert launcher[0] == "torchrun", launcher
        argv = [sys.executable, "-m", "torch.distributed.run", "--master_port", "18139", *launcher[1:]]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    done = subprocess.run(
        [*argv, *launch[launch.index("-m") :]],
        cwd=tmp_path,
        # HOME: no accelerate default_config.yaml of this machine's user changes the launch.
        env={**env, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(tmp_path), "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "config: axolotl.yaml local rank: 0 state: MULTI_CPU" in done.stdout, done.stdout


def test_an_empty_gpu_name_is_refused_not_replaced_by_the_planners_pick(tmp_path: Path) -> None:
    # `--gpu ""` (an unset shell variable) used to export the planner's cheapest card with exit status 0.
    gpuplan = Path(sys.executable).with_name("gpuplan")
    plan = Path(__file__).resolve().parents[2] / "infra" / "examples" / "llama-3.1-8b-qlora.json"
    out = tmp_path / "run"
    argv = [str(gpuplan), "export", "--plan", str(plan), "--format", "hf-trainer", "--gpu", "", "--out", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == ["gpuplan: error: gpu: empty GPU name"]
    assert not out.exists()


def test_a_setup_stored_before_it_named_its_optimizer_keeps_the_plans() -> None:
    """Recommendations stored before ``optimizer`` was recorded read it as adamw (the field's default): the plan's
    own optimizer is the one such a setup was priced with."""
    plan = llama_plan("hf-trainer", "full", optimizer="adamw-8bit")
    switched = one_gpu_setup("hf-trainer", optimizer="paged-adamw-8bit")
    stored = Recommendation.model_validate(switched.model_dump(exclude={"optimizer"}))
    assert apply_setup(plan, stored).optimizer == "adamw-8bit"
    assert apply_setup(plan, switched).optimizer == "paged-adamw-8bit"


def test_axolotl_on_two_nodes_of_one_gpu_each_starts_one_group_of_two(tmp_path: Path) -> None:
    # Without --multi_gpu, accelerate launch starts a group only where the node itself has several GPUs: the
    # planner's 64 x 1-GPU nodes ran 64 plain processes, each over the whole data set (a probe of the exports).
    setup = recommendation(
        gpus=2, gpus_per_node=1, nodes=2, sharding="fsdp", cpu_offload=False, micro_batch_size=1,
        gradient_accumulation_steps=2,
    )  # fmt: skip
    bundle = export(llama_plan("axolotl", "lora"), "axolotl", setup=setup)
    package = tmp_path / "axolotl" / "cli"
    package.mkdir(parents=True)
    (tmp_path / "axolotl" / "__init__.py").write_text("", encoding="utf-8")
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "train.py").write_text(_AXOLOTL_PROBE + 'print("world size:", os.environ.get("WORLD_SIZE"))\n')
    launch = shlex.split(bundle.files["launch.sh"].strip().splitlines()[-1])
    # This test's own port (parallel runs), node 0 on loopback.
    launch[launch.index("--main_process_port") + 1] = "18143"
    launch[launch.index("--main_process_ip") + 1] = "127.0.0.1"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    env.update(CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(tmp_path), HOME=str(tmp_path))
    nodes = []
    for rank in ("0", "1"):
        argv = [a if a != "$NODE_RANK" else rank for a in launch[2:]]
        nodes.append(
            subprocess.Popen(
                [sys.executable, "-m", "accelerate.commands.launch", *argv],
                cwd=tmp_path,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    for node in nodes:
        out, err = node.communicate(timeout=300)
        assert node.returncode == 0, err[-2000:]
        assert "state: MULTI_CPU" in out and "world size: 2" in out, out
    assert launch[:3] == ["accelerate", "launch", "--multi_gpu"], launch


def test_axolotl_refuses_bitsandbytes_8bit_adamw_under_fsdp() -> None:
    # axolotl's config check refuses adamw_bnb_8bit under FSDP2 (check_fsdp2_w_8bit_optimizer): the export exited 0
    # with files that do not start (a probe of the exports). Refused naming the optimizer, so the export moves on
    # to a setup the format can run.
    plan = llama_plan("axolotl", "full", optimizer="adamw-8bit", gpus=4, sharding="fsdp")
    with pytest.raises(ExportError) as caught:
        export(plan, "axolotl")
    assert caught.value.field == "optimizer" and "adamw_bnb_8bit" in caught.value.message


def test_a_model_name_with_a_line_break_never_reaches_launch_sh(tmp_path: Path) -> None:
    # The name is written into every file's header comments: a line break in it ran the rest as a command of
    # launch.sh (a probe of the exports made `bash launch.sh` touch a file). Refused as the plan is read, naming the
    # field; and no header line can carry a line break whatever reaches it.
    plan = json.loads(
        (Path(__file__).resolve().parents[2] / "infra" / "examples" / "llama-3.1-8b-qlora.json").read_text()
    )
    plan["model"] = {"name": f"evil\ntouch {tmp_path / 'PWNED'}\n#", "config": dict(LLAMA_8B)}
    path = tmp_path / "evil.json"
    path.write_text(json.dumps(plan), encoding="utf-8")
    gpuplan = Path(sys.executable).with_name("gpuplan")
    argv = [str(gpuplan), "export", "--plan", str(path), "--format", "hf-trainer", "--gpu", "A100 80GB"]
    done = subprocess.run([*argv, "--out", str(tmp_path / "run")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout
    assert done.stderr.startswith("gpuplan: error: model.name: control characters"), done.stderr
    assert not (tmp_path / "run").exists()
    assert comment_block(["a\nrm -rf x", "b\u2028c"]) == "# a rm -rf x\n# b c\n"


def test_torchtune_refuses_a_fraction_of_an_epoch_it_would_run_whole() -> None:
    # torchtune's recipes run whole epochs: 1.2 planned was written as 2, 67% more than priced, with a note only.
    plan = llama_plan("torchtune", "lora", data={"examples": 10_000, "avg_tokens_per_example": 512, "epochs": 1.2})
    with pytest.raises(ExportError) as caught:
        export(plan, "torchtune")
    assert caught.value.field == "data.epochs" and "it would run 2, 67% more than planned" in caught.value.message
    whole = llama_plan("torchtune", "lora", data={"examples": 10_000, "avg_tokens_per_example": 512, "epochs": 2.0})
    assert yaml.safe_load(export(whole, "torchtune").files["config.yaml"])["epochs"] == 2
