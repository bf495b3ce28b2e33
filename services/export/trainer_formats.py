"""The three Trainer-based formats: hf-trainer (torchrun), accelerate (accelerate.yaml), deepspeed (ZeRO JSON).

All three ship the same ``train.py`` + ``hf_args.json`` (services/export/hf.py) and a ``launch.sh``; they
differ in who owns sharding and the process count:

- hf-trainer: ``torchrun`` starts the processes; FSDP (``fsdp`` + ``fsdp_config``) or ZeRO (``deepspeed``
  pointing at ``ds_config.json``) are Trainer arguments. Every sharding mode.
- accelerate: ``accelerate.yaml`` holds the processes, machines, mixed precision and the FSDP plugin or the
  DeepSpeed plugin (through ``ds_config.json``). Every sharding mode.
- deepspeed: the ``deepspeed`` launcher and ``ds_config.json``. Only zero1/zero2/zero3: FSDP is not
  DeepSpeed, and 'none' under the DeepSpeed engine would keep an fp32 master copy (its bf16/fp16
  optimizer) that the estimate for 'none' does not count.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from services.estimator.architecture import Architecture
from services.export.errors import ExportError
from services.export.hf import (
    ARGS_FILE,
    DS_FILE,
    SCRIPT_FILE,
    ZERO_STAGES,
    HfArgs,
    check_trainer_plan,
    hf_sections,
    plan_fields,
    precision_flags,
    read_hf_args,
    train_script,
    trainer_notes,
    trainer_sharding,
    trainer_sharding_args,
)
from services.export.models import Built
from services.export.policy import policy
from services.export.render import (
    LAUNCH_FILE,
    MASTER_PORT,
    flag_int,
    header_lines,
    json_text,
    launch_argv,
    launch_text,
    load_yaml,
    validated,
    yaml_text,
)
from services.export.resume import CHECKPOINT_COMMENT, checkpoint_dir_line
from services.export.target import Target, require_accumulation
from services.export.zero import ds_config, read_zero, zero_assumptions

ACCELERATE_FILE = "accelerate.yaml"
TRAIN_FLAGS_COMMENT = (
    "Arguments go to train.py as TrainingArguments flags over hf_args.json's values, e.g. --save_steps N "
    "(the run's interval_steps) or --max_steps N."
)


def _trainer_files(target: Target, command: str, sharding_args: Mapping[str, Any], prelude: list[str]) -> Built:
    """train.py, hf_args.json, launch.sh (and ds_config.json under ZeRO) for ``command``."""
    check_trainer_plan(target)
    accumulation = require_accumulation(target)
    sections = hf_sections(target, accumulation, sharding_args)
    header = header_lines(target, command, trainer_assumptions(target, accumulation))
    files = {
        SCRIPT_FILE: train_script(header, sections, target.data),
        ARGS_FILE: json_text(header, sections),
        # Arguments of launch.sh reach train.py: TrainingArguments flags (bash launch.sh --save_steps 120).
        LAUNCH_FILE: launch_text(
            header, f'{command} "$@"', [*prelude, CHECKPOINT_COMMENT, TRAIN_FLAGS_COMMENT], [checkpoint_dir_line()]
        ),
    }
    if target.plan.sharding in ZERO_STAGES:
        files[DS_FILE] = json_text(header, ds_config(target, accumulation))
    return Built(files, command, trainer_notes(target))


def trainer_assumptions(target: Target, accumulation: int) -> list[str]:
    """What the estimate assumed that the files set explicitly: data, optimisation policy, ZeRO buffers."""
    return [target.data.describe(), policy(target.plan, accumulation).describe(), *zero_assumptions(target)]


def _multi_node_prelude(target: Target) -> list[str]:
    if target.nodes == 1:
        return []
    return [
        f"Run on each of the {target.nodes} nodes with NODE_RANK (0..{target.nodes - 1}) and MASTER_ADDR "
        "(node 0's address) set."
    ]


# --------------------------------------------------------------------------------------------------
# hf-trainer


def torchrun_command(target: Target) -> str:
    # A sharded setup on one GPU (the planner's CPU-offload setups) still needs a distributed launch: the
    # Trainer refuses FSDP without one ("Using fsdp only works in distributed training", transformers
    # Trainer.__init__), so only an unsharded single GPU starts with plain python.
    if target.plan.gpus == 1 and target.plan.sharding == "none":
        return f"python {SCRIPT_FILE}"
    if target.nodes == 1:
        return f"torchrun --nproc_per_node {target.gpus_per_node} {SCRIPT_FILE}"
    return (
        f"torchrun --nnodes {target.nodes} --nproc_per_node {target.gpus_per_node} --node_rank $NODE_RANK "
        f"--master_addr $MASTER_ADDR --master_port {MASTER_PORT} {SCRIPT_FILE}"
    )


def export_hf_trainer(target: Target) -> Built:
    """The Trainer script launched by torchrun, sharding as Trainer arguments."""
    return _trainer_files(target, torchrun_command(target), trainer_sharding_args(target), _multi_node_prelude(target))


def _sharding_from_args(args: HfArgs, files: Mapping[str, str], gpus: int) -> dict[str, Any]:
    t = args.training_args
    bf16, fp16 = t.bf16, t.fp16
    if t.deepspeed is not None:
        if t.deepspeed != DS_FILE:
            raise ExportError(f"{ARGS_FILE}:training_args.deepspeed", f"expected {DS_FILE!r}, got {t.deepspeed!r}")
        return read_zero(files, t.per_device_train_batch_size, t.gradient_accumulation_steps, bf16, fp16, gpus)
    fsdp = trainer_sharding(t)
    if fsdp is not None:
        return {"sharding": fsdp[0], "cpu_offload": fsdp[1], "gpus": gpus}
    return {"sharding": "none", "cpu_offload": False, "gpus": gpus}


def read_hf_trainer(files: Mapping[str, str], arch: Architecture) -> dict[str, Any]:
    args = read_hf_args(files)
    argv = launch_argv(files)
    gpus = flag_int(argv, "--nproc_per_node", 1) * flag_int(argv, "--nnodes", 1)
    return {**plan_fields(args, arch), **_sharding_from_args(args, files, gpus)}


# --------------------------------------------------------------------------------------------------
# accelerate


DistributedType = Literal["NO", "MULTI_GPU", "FSDP", "DEEPSPEED"]


def accelerate_config(target: Target) -> dict[str, Any]:
    """accelerate.yaml: processes, machines, precision, and the FSDP or DeepSpeed plugin."""
    plan = target.plan
    _, bf16, fp16 = precision_flags(plan.precision)
    config: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "distributed_type": _distributed_type(target),
        "downcast_bf16": "no",
        "machine_rank": 0,
        "main_training_function": "main",
        # DeepSpeed takes the precision from ds_config.json (accelerate refuses both).
        "mixed_precision": None if plan.sharding in ZERO_STAGES else "bf16" if bf16 else "fp16" if fp16 else "no",
        "num_machines": target.nodes,
        "num_processes": plan.gpus,
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": False,
    }
    if plan.sharding == "fsdp":
        config["fsdp_config"] = {
            "fsdp_version": 2,
            "fsdp_reshard_after_forward": True,
            "fsdp_offload_params": plan.cpu_offload,
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_cpu_ram_efficient_loading": True,
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        }
    elif plan.sharding in ZERO_STAGES:
        config["deepspeed_config"] = {
            "deepspeed_config_file": DS_FILE,
            "zero3_init_flag": plan.sharding == "zero3",
        }
    return config


def _distributed_type(target: Target) -> DistributedType:
    sharding = target.plan.sharding
    if sharding == "fsdp":
        return "FSDP"
    if sharding in ZERO_STAGES:
        return "DEEPSPEED"
    return "MULTI_GPU" if target.plan.gpus > 1 else "NO"


def accelerate_command(target: Target) -> str:
    command = f"accelerate launch --config_file {ACCELERATE_FILE}"
    if target.nodes > 1:
        command += f" --machine_rank $NODE_RANK --main_process_ip $MASTER_ADDR --main_process_port {MASTER_PORT}"
    return f"{command} {SCRIPT_FILE}"


def export_accelerate(target: Target) -> Built:
    """The Trainer script launched by accelerate, sharding in accelerate.yaml."""
    command = accelerate_command(target)
    built = _trainer_files(target, command, {}, _multi_node_prelude(target))
    header = header_lines(target, command, trainer_assumptions(target, require_accumulation(target)))
    files = {ACCELERATE_FILE: yaml_text(header, accelerate_config(target)), **built.files}
    return Built(files, command, built.notes)


class _Section(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)


class _FsdpPlugin(_Section):
    fsdp_version: Literal[2]
    fsdp_reshard_after_forward: Literal[True]
    fsdp_offload_params: bool = False


class _DeepSpeedPlugin(_Section):
    deepspeed_config_file: str


class AccelerateConfig(_Section):
    compute_environment: Literal["LOCAL_MACHINE"]
    distributed_type: DistributedType
    num_processes: int
    num_machines: int = 1
    mixed_precision: Literal["no", "bf16", "fp16"] | None = None
    fsdp_config: _FsdpPlugin | None = None
    deepspeed_config: _DeepSpeedPlugin | None = None


def read_accelerate(files: Mapping[str, str], arch: Architecture) -> dict[str, Any]:
    config = validated(AccelerateConfig, load_yaml(files, ACCELERATE_FILE), ACCELERATE_FILE)
    args = read_hf_args(files)
    fields = plan_fields(args, arch)
    _, bf16, fp16 = precision_flags(fields["precision"])
    gpus = config.num_processes
    kind = config.distributed_type
    if kind == "DEEPSPEED":
        if config.deepspeed_config is None or config.deepspeed_config.deepspeed_config_file != DS_FILE:
            raise ExportError(f"{ACCELERATE_FILE}:deepspeed_config", f"expected deepspeed_config_file {DS_FILE!r}")
        t = args.training_args
        found = read_zero(files, t.per_device_train_batch_size, t.gradient_accumulation_steps, bf16, fp16, gpus)
        return {**fields, **found}
    mixed = "bf16" if bf16 else "fp16" if fp16 else "no"
    if (config.mixed_precision or "no") != mixed:
        raise ExportError(
            f"{ACCELERATE_FILE}:mixed_precision", f"{config.mixed_precision} disagrees with the training arguments"
        )
    if kind == "FSDP":
        if config.fsdp_config is None:
            raise ExportError(f"{ACCELERATE_FILE}:fsdp_config", "missing for distributed_type FSDP")
        return {**fields, "sharding": "fsdp", "cpu_offload": config.fsdp_config.fsdp_offload_params, "gpus": gpus}
    if kind == "NO" and gpus != 1:
        raise ExportError(f"{ACCELERATE_FILE}:num_processes", f"distributed_type NO runs 1 process, not {gpus}")
    return {**fields, "sharding": "none", "cpu_offload": False, "gpus": gpus}


# --------------------------------------------------------------------------------------------------
# deepspeed


def deepspeed_command(target: Target) -> str:
    if target.nodes == 1:
        return f"deepspeed --num_gpus {target.gpus_per_node} {SCRIPT_FILE}"
    return f"deepspeed --hostfile hostfile --num_nodes {target.nodes} --num_gpus {target.gpus_per_node} {SCRIPT_FILE}"


def export_deepspeed(target: Target) -> Built:
    """The Trainer script launched by the deepspeed launcher with the ZeRO config."""
    plan = target.plan
    if plan.sharding not in ZERO_STAGES:
        raise ExportError(
            "sharding",
            f"{plan.sharding!r}: the deepspeed export is a ZeRO config; allowed: zero1, zero2, zero3. "
            + (
                "FSDP is PyTorch's, not DeepSpeed's: export to hf-trainer, accelerate, torchtune or axolotl"
                if plan.sharding == "fsdp"
                else "Without ZeRO the DeepSpeed engine still keeps an fp32 master copy (its bf16/fp16 optimizer) "
                "that the estimate for 'none' does not count: export to hf-trainer or accelerate"
            ),
        )
    prelude = []
    if target.nodes > 1:
        prelude = [f"hostfile: one line per node, '<host> slots={target.gpus_per_node}' ({target.nodes} lines)."]
    return _trainer_files(target, deepspeed_command(target), {"deepspeed": DS_FILE}, prelude)


def read_deepspeed(files: Mapping[str, str], arch: Architecture) -> dict[str, Any]:
    args = read_hf_args(files)
    argv = launch_argv(files)
    gpus = flag_int(argv, "--num_gpus", 1) * flag_int(argv, "--num_nodes", 1)
    if args.training_args.deepspeed is None:
        raise ExportError(f"{ARGS_FILE}:training_args.deepspeed", f"missing; the deepspeed export sets {DS_FILE}")
    return {**plan_fields(args, arch), **_sharding_from_args(args, files, gpus)}
