"""Every format against the real tool that reads it, with FutureWarning as an error.

transformers' TrainingArguments and TRL's SFTConfig read hf_args.json; accelerate's config loader reads
accelerate.yaml; DeepSpeed's DeepSpeedConfig reads ds_config.json at the exported world size (and refuses
another); torchtune's config validation (what ``tune validate`` runs) reads config.yaml; the model axolotl's
validate_config checks reads axolotl.yaml. trl, deepspeed and torchtune come from the ``exportcheck`` extra.
Two cannot be installed beside this project's pins: axolotl (it pins transformers 5.16 and pydantic 2.12)
and torchao < 0.15, which torchtune 0.6.1 needs and PEFT refuses once installed. ``bash infra/dev.sh test``
unpacks their wheels into .gpuplan/exportcheck, and the checks import them in a subprocess.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.estimator.plan import Plan
from services.export import ExportBundle
from services.export.dataset import DATA_KINDS, data_format
from tests.export.helpers import export, llama_plan

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
# Wheels unpacked by `bash infra/dev.sh test` (see _unpacked).
EXPORTCHECK = Path(os.environ.get("GPUPLAN_EXPORTCHECK_DIR", ROOT / ".gpuplan" / "exportcheck"))


@pytest.fixture(autouse=True)
def _strict_warnings() -> Iterator[None]:
    # TrainingArguments exports FSDP settings to os.environ (FSDP_CPU_RAM_EFFICIENT_LOADING), which would
    # change how later tests load models.
    saved = dict(os.environ)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        yield
    os.environ.clear()
    os.environ.update(saved)


def _write(bundle: ExportBundle, where: Path) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    for name, text in bundle.files.items():
        (where / name).write_text(text)
    return where


def _json(bundle: ExportBundle, name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(bundle.files[name])
    data.pop("_comment", None)
    return data


# A spread of setups: 1 GPU unsharded, FSDP with offload, ZeRO-3 with offload, multi-node ZeRO-2.
TRAINER_SETUPS: list[tuple[str, dict[str, Any]]] = [
    ("qlora", {}),
    ("lora", {"gpus": 4, "sharding": "fsdp", "cpu_offload": True}),
    ("full", {"gpus": 4, "sharding": "zero3", "cpu_offload": True}),
    ("full", {"gpus": 16, "sharding": "zero2"}),
]


@pytest.mark.parametrize("fmt", ["hf-trainer", "accelerate", "deepspeed"])
@pytest.mark.parametrize(("method", "fields"), TRAINER_SETUPS)
def test_training_arguments_and_sft_config_load_hf_args(
    fmt: str, method: str, fields: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    transformers = pytest.importorskip("transformers")
    trl = pytest.importorskip("trl")
    peft = pytest.importorskip("peft")
    if fmt == "deepspeed" and fields.get("sharding", "none") not in ("zero2", "zero3"):
        fields = {**fields, "gpus": 2, "sharding": "zero2"}
    bundle = export(llama_plan(fmt, method, **fields), fmt, checkpoint_interval_s=900, step_seconds=3)
    monkeypatch.chdir(_write(bundle, tmp_path))  # the deepspeed key names ds_config.json beside it
    sections = _json(bundle, "hf_args.json")
    # No GPU here: bf16 needs use_cpu to pass the Trainer's device check.
    args = {**sections["training_args"], "output_dir": str(tmp_path / "out"), "use_cpu": True}
    trainer_args = transformers.TrainingArguments(**args)
    assert trainer_args.activation_checkpointing is True
    sft = trl.SFTConfig(**args, **sections["data"])
    assert sft.max_length == sections["data"]["max_length"] and sft.packing is True
    if sections["lora_config"] is not None:
        peft.LoraConfig(**sections["lora_config"])
    if sections["quantization_config"] is not None:
        transformers.BitsAndBytesConfig(**sections["quantization_config"])


@pytest.mark.parametrize(("gpus", "sharding"), [(1, "none"), (4, "none"), (4, "fsdp"), (4, "zero3"), (16, "fsdp")])
def test_accelerate_loads_its_config(gpus: int, sharding: str, tmp_path: Path) -> None:
    config_args = pytest.importorskip("accelerate.commands.config.config_args")
    bundle = export(llama_plan("accelerate", "lora", gpus=gpus, sharding=sharding), "accelerate")
    path = tmp_path / "accelerate.yaml"
    path.write_text(bundle.files["accelerate.yaml"])
    config = config_args.ClusterConfig.from_yaml_file(str(path))
    assert config.num_processes == gpus
    assert config.num_machines == (2 if gpus == 16 else 1)


@pytest.fixture(scope="module")
def deepspeed_world() -> Any:
    """DeepSpeed's comm layer over a one-process gloo group; the data-parallel size is given per config."""
    pytest.importorskip("deepspeed")
    import deepspeed.comm as dist
    import torch.distributed as torch_dist

    if not torch_dist.is_initialized():
        torch_dist.init_process_group("gloo", rank=0, world_size=1, store=torch_dist.HashStore())
    dist.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    from deepspeed.runtime.config import DeepSpeedConfig

    return DeepSpeedConfig


class _DataParallel:
    """The mpu DeepSpeedConfig asks for the data-parallel world size."""

    def __init__(self, size: int) -> None:
        self.size = size

    def get_data_parallel_world_size(self) -> int:
        return self.size


@pytest.mark.parametrize(
    ("method", "fields"),
    [
        ("lora", {"gpus": 1, "sharding": "zero2"}),
        ("full", {"gpus": 4, "sharding": "zero1"}),
        ("full", {"gpus": 4, "sharding": "zero3", "cpu_offload": True}),
        ("qlora", {"gpus": 8, "sharding": "zero3"}),
        ("full", {"gpus": 16, "sharding": "zero2", "cpu_offload": True}),
    ],
)
def test_deepspeed_config_holds_at_the_exported_world_size_only(
    method: str, fields: dict[str, Any], deepspeed_world: Any
) -> None:
    plan = llama_plan("deepspeed", method, **fields)
    config = _json(export(plan, "deepspeed"), "ds_config.json")
    loaded = deepspeed_world(dict(config), mpu=_DataParallel(plan.gpus))
    assert loaded.train_batch_size == plan.micro_batch_size * 4 * plan.gpus
    zero = loaded.zero_config
    assert zero.reduce_bucket_size == config["zero_optimization"]["reduce_bucket_size"]
    if fields["sharding"] == "zero3":
        assert zero.prefetch_bucket_size == config["zero_optimization"]["stage3_prefetch_bucket_size"]
        assert zero.max_live_parameters == 2 * zero.prefetch_bucket_size
        assert zero.param_persistence_threshold == 100_000
    with pytest.raises(AssertionError, match="train_batch_size"):
        deepspeed_world(dict(config), mpu=_DataParallel(plan.gpus + 1))


TUNE_CASES: list[tuple[str, str, dict[str, Any]]] = [
    # bitsandbytes optimizers are not validated: bitsandbytes is not installed here (no CUDA).
    ("meta-llama/Llama-3.1-8B", "qlora", {"optimizer": "adafactor"}),
    ("meta-llama/Llama-3.1-8B", "lora", {"gpus": 4, "sharding": "fsdp", "cpu_offload": True}),
    ("meta-llama/Llama-3.1-8B", "full", {"optimizer_in_backward": True, "gradient_accumulation_steps": 1}),
    ("Qwen/Qwen2.5-7B", "lora", {}),
    ("Qwen/Qwen2.5-7B", "qlora", {}),
    ("Qwen/Qwen2.5-0.5B", "full", {"gpus": 2, "sharding": "fsdp"}),
]

# What `tune validate config.yaml` runs, for many configs in one interpreter, plus the recipe registry.
_TUNE_CHECK = textwrap.dedent(
    """
    import json, sys, warnings
    warnings.simplefilter("error", FutureWarning)
    from omegaconf import OmegaConf
    from torchtune import config
    from torchtune._recipe_registry import get_all_recipes
    recipes = {r.name for r in get_all_recipes()}
    out = []
    for case in json.load(sys.stdin):
        try:
            config.validate(OmegaConf.create(case["config"]))
            out.append({"ok": case["recipe"] in recipes, "error": f"no recipe {case['recipe']}"})
        except Exception as exc:
            out.append({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
    print(json.dumps(out))
    """
)


def _unpacked(name: str) -> Path:
    where = EXPORTCHECK / name
    if not (where / name / "__init__.py").exists():
        pytest.skip(f"{name}'s wheel is not unpacked at {where} (bash infra/dev.sh test does it)")
    return where


def _in_subprocess(script: str, cases: list[dict[str, Any]], *path: Path) -> list[dict[str, Any]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*map(str, path), str(ROOT)])}
    result = subprocess.run(
        [sys.executable, "-c", script], input=json.dumps(cases), capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    found: list[dict[str, Any]] = json.loads(result.stdout.strip().splitlines()[-1])
    return found


def test_torchtune_validates_every_config() -> None:
    if importlib.util.find_spec("torchtune") is None:  # not imported here: it needs the unpacked torchao
        pytest.skip("torchtune is not installed (the exportcheck extra)")
    torchao = _unpacked("torchao")
    cases = []
    for model, method, fields in TUNE_CASES:
        for kind in DATA_KINDS:
            plan = llama_plan("torchtune", method, model={"name": model}, **fields)
            bundle = export(plan, "torchtune", data=data_format(kind, "test"))
            recipe = bundle.command.split(" --config")[0].split()[-1]
            cases.append({"config": yaml.safe_load(bundle.files["config.yaml"]), "recipe": recipe})
    # Control: a key the tokenizer does not take is caught.
    wrong = json.loads(json.dumps(cases[0]))
    wrong["config"]["tokenizer"]["max_seq_length"] = 512  # the tokenizer takes max_seq_len
    found = _in_subprocess(_TUNE_CHECK, [*cases, wrong], torchao)
    *exported, caught = found
    assert not caught["ok"] and "max_seq_length" in caught["error"], caught
    for case, outcome in zip(cases, exported, strict=True):
        assert outcome["ok"], (case["config"]["model"]["_component_"], case["config"]["dataset"], outcome["error"])
    qlora = [c["config"]["model"] for c in cases if "qlora" in c["config"]["model"]["_component_"]]
    qlora += [c["config"]["model"] for c in cases if c["config"]["model"].get("quantize_base")]
    assert len(qlora) == 2 * len(DATA_KINDS)  # Llama's qlora_ builder, Qwen2.5's quantize_base


_AXOLOTL_CHECK = textwrap.dedent(
    """
    import json, sys, warnings
    warnings.simplefilter("error", FutureWarning)
    # The model validate_config checks against (axolotl/utils/config/__init__.py), without the loaders
    # that module also imports.
    from axolotl.utils.schemas.config import AxolotlConfigWCapabilities
    out = []
    for case in json.load(sys.stdin):
        try:
            cfg = AxolotlConfigWCapabilities(
                **case["config"],
                capabilities={"bf16": True, "fp8": False, "n_gpu": case["gpus"], "n_node": case["nodes"],
                              "compute_capability": "sm_90"},
                env_capabilities={"torch_version": "2.13.0"},
            ).model_dump(exclude_none=True)
            out.append({"ok": True, "kernels": [cfg.get(k) for k in
                        ("lora_mlp_kernel", "lora_qkv_kernel", "lora_o_kernel")]})
        except Exception as exc:
            out.append({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
    print(json.dumps(out))
    """
)

AXOLOTL_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("qlora", {}, "text"),
    ("qlora", {}, "chat"),
    ("lora", {}, "sharegpt"),
    ("lora", {"gpus": 4, "sharding": "fsdp"}, "alpaca"),
    # QLoRA under FSDP2: axolotl refuses cpu_ram_efficient_loading with a 4-bit base (a probe of the exports).
    ("qlora", {"gpus": 4, "sharding": "fsdp", "cpu_offload": True}, "alpaca"),
    ("lora", {"gpus": 4, "sharding": "zero2"}, "dolly"),
    ("full", {"gpus": 8, "sharding": "zero3", "cpu_offload": True}, "prompt_completion"),
]


def test_axolotl_validates_every_config() -> None:
    axolotl = _unpacked("axolotl")
    cases = []
    for method, fields, kind in AXOLOTL_CASES:
        plan: Plan = llama_plan("axolotl", method, **fields)
        bundle = export(plan, "axolotl", data=data_format(kind, "test"))
        config = yaml.safe_load(bundle.files["axolotl.yaml"])
        cases.append({"config": config, "gpus": plan.gpus, "nodes": 1})
    # Controls: without the export's switches axolotl turns its kernels on; a wrong value is refused.
    first = dict(cases[0]["config"])
    unswitched = {k: v for k, v in first.items() if not k.endswith("_kernel")}
    cases += [
        {"config": unswitched, "gpus": 1, "nodes": 1},
        {"config": {**first, "micro_batch_size": "four"}, "gpus": 1, "nodes": 1},
    ]
    found = _in_subprocess(_AXOLOTL_CHECK, cases, axolotl)
    *exported, unswitched_outcome, wrong = found
    assert unswitched_outcome["ok"] and unswitched_outcome["kernels"] == [True, True, True], unswitched_outcome
    assert not wrong["ok"] and "micro_batch_size" in wrong["error"]
    for (method, _, kind), outcome in zip(AXOLOTL_CASES, exported, strict=True):
        assert outcome["ok"], (method, kind, outcome.get("error"))
        if method != "full":
            assert outcome["kernels"] == [False, False, False], (method, kind)


# --------------------------------------------------------------------------------------------------
# Resuming: the arguments launch.sh hands the tools, read by the tools


def _launched_argv(files: Path, launcher: str, checkpoints: Path) -> list[str]:
    """The argv launch.sh gives ``launcher`` (a shell function that prints it), with resume.py run for real."""
    launch = (files / "launch.sh").read_text().splitlines()
    setup = [line for line in launch if line.startswith(("export ", "mapfile "))]
    script = "\n".join([f"{launcher}() {{ printf '%s\\n' \"$@\"; }}", *setup, launch[-1]])
    env = {
        **os.environ,
        "GPUPLAN_CHECKPOINT_DIR": str(checkpoints),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    result = subprocess.run(["bash", "-c", script], cwd=files, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def _touch(path: Path, seconds_ago: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")
    then = time.time() - seconds_ago
    os.utime(path, (then, then))


_TUNE_RESUME = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from torchtune import config
    from torchtune.config._parse import TuneRecipeArgumentParser
    from torchtune.config._utils import _merge_yaml_and_cli_args
    from torchtune.training.checkpointing._utils import (
        get_adapter_checkpoint_path, get_model_checkpoint_path, get_recipe_checkpoint_path)
    out = []
    for case in json.load(sys.stdin):
        # What `tune run <recipe> --config config.yaml k=v ...` builds before the recipe starts.
        yaml_args, cli_args = TuneRecipeArgumentParser().parse_known_args(case["argv"])
        cfg = _merge_yaml_and_cli_args(yaml_args, cli_args)
        config.validate(cfg)
        ck = cfg.checkpointer
        resume = bool(cfg.resume_from_checkpoint)
        found = {"resume": resume, "output_dir": str(ck.output_dir)}
        if resume:  # the files the checkpointer loads when the recipe sets should_load_recipe_state
            where = Path(ck.output_dir)
            found["recipe"] = str(get_recipe_checkpoint_path(where, ck.recipe_checkpoint, True))
            adapter = get_adapter_checkpoint_path(where, ck.get("adapter_checkpoint"), True)
            found["adapter"] = str(adapter) if adapter else None
            if adapter is None:
                found["weights"] = [str(p) for p in get_model_checkpoint_path(
                    list(ck.checkpoint_files), ck.checkpoint_dir, where, True, False)]
        out.append(found)
    print(json.dumps(out))
    """
)


def test_torchtune_resumes_from_the_restored_folder_and_starts_fresh_without_one(tmp_path: Path) -> None:
    if importlib.util.find_spec("torchtune") is None:
        pytest.skip("torchtune is not installed (the exportcheck extra)")
    torchao = _unpacked("torchao")
    cases, expected = [], []
    for method in ("lora", "full"):
        files = _write(export(llama_plan("torchtune", method), "torchtune"), tmp_path / method)
        fresh, cut, done = (tmp_path / f"{method}-{name}" for name in ("fresh", "cut", "done"))
        # cut: epoch_1 was written after the recipe state, so its save did not finish; epoch_0 is complete.
        for root in (cut, done):
            names = (
                ["adapter_model.pt"] if method == "lora" else [f"model-0000{i}-of-00004.safetensors" for i in (1, 2)]
            )
            for name in names:
                _touch(root / "epoch_0" / name, 300)
            _touch(root / "recipe_state" / "recipe_state.pt", 200)
        for name in ["adapter_model.pt"] if method == "lora" else ["model-00001-of-00004.safetensors"]:
            _touch(cut / "epoch_1" / name, 100)
        for root in (fresh, cut, done):
            argv = _launched_argv(files, "tune", root)
            assert argv[:2] == ["run", f"{method}_finetune_single_device"]
            cases.append({"argv": [a.replace("config.yaml", str(files / "config.yaml")) for a in argv[2:]]})
            expected.append((method, root))
    found = _in_subprocess(_TUNE_RESUME, cases, torchao)
    for (method, root), outcome in zip(expected, found, strict=True):
        assert outcome["output_dir"] == str(root)
        if root.name.endswith("fresh"):
            assert outcome["resume"] is False
            continue
        assert outcome["resume"] is True
        assert outcome["recipe"] == str(root / "recipe_state" / "recipe_state.pt")
        if method == "lora":
            assert outcome["adapter"] == str(root / "epoch_0" / "adapter_model.pt")
        else:
            assert outcome["weights"] == [str(root / "epoch_0" / f"model-0000{i}-of-00004.safetensors") for i in (1, 2)]


_AXOLOTL_RESUME = textwrap.dedent(
    """
    import json, sys
    from axolotl.utils.schemas.config import AxolotlConfigWCapabilities
    out = []
    for case in json.load(sys.stdin):
        # axolotl.cli.train applies `--key=value` flags over the YAML (axolotl/cli/config.py load_cfg).
        overrides = dict(arg[2:].split("=", 1) for arg in case["args"])
        cfg = AxolotlConfigWCapabilities(
            **{**case["config"], **overrides},
            capabilities={"bf16": True, "fp8": False, "n_gpu": case["gpus"], "n_node": 1,
                          "compute_capability": "sm_90"},
            env_capabilities={"torch_version": "2.13.0"},
        ).model_dump()
        out.append({k: cfg.get(k) for k in ("output_dir", "resume_from_checkpoint", "auto_resume_from_checkpoints",
                                            "gradient_accumulation_steps")})
    print(json.dumps(out))
    """
)


def test_axolotl_resumes_from_the_newest_complete_checkpoint_only(tmp_path: Path) -> None:
    axolotl = _unpacked("axolotl")
    # 4 GPUs without gradient_accumulation_steps: exported (the steps that keep the effective batch), not refused.
    plan = llama_plan("axolotl", "lora", gpus=4, sharding="fsdp", gradient_accumulation_steps=None)
    bundle = export(plan, "axolotl")
    files = _write(bundle, tmp_path / "files")
    config = yaml.safe_load(bundle.files["axolotl.yaml"])
    assert config["gradient_accumulation_steps"] == 1 and config["auto_resume_from_checkpoints"] is True
    both, cut_only = tmp_path / "both", tmp_path / "cut"
    for root in (both, cut_only):
        _touch(root / "checkpoint-9" / "adapter_model.safetensors", 10)  # a save cut before trainer_state.json
    _touch(both / "checkpoint-8" / "trainer_state.json", 20)
    cases = []
    for root in (both, cut_only):
        argv = _launched_argv(files, "accelerate", root)
        assert argv[:6] == ["launch", "--multi_gpu", "--num_processes", "4", "-m", "axolotl.cli.train"]
        cases.append({"config": config, "gpus": 4, "args": argv[7:]})
    resumed, fresh = _in_subprocess(_AXOLOTL_RESUME, cases, axolotl)
    assert resumed["output_dir"] == str(both) and resumed["resume_from_checkpoint"] == str(both / "checkpoint-8")
    assert resumed["gradient_accumulation_steps"] == 1
    # Only a cut save: axolotl's own auto-resume (on in the YAML, for runs without launch.sh) is switched off.
    assert fresh["resume_from_checkpoint"] is None and fresh["auto_resume_from_checkpoints"] is False
