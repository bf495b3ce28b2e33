"""DeepSpeed ZeRO config (``ds_config.json``) for the Trainer, axolotl and the deepspeed launcher, and its reader.

Rules: stage = the plan's zero1/2/3; ``cpu_offload`` offloads the optimizer (states, fp32 master, its
gradient partition) to the CPU at every stage and the parameters too at stage 3, as the estimate does;
offloading needs DeepSpeed's CPU Adam, so the config names an AdamW optimizer then. ``train_batch_size``
is micro-batch x accumulation x GPUs, which DeepSpeed checks against the world size.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from services.export.errors import ExportError
from services.export.hf import DS_FILE, ZERO_STAGES, precision_flags
from services.export.render import load_json, validated
from services.export.target import Target

_STAGE_NAMES = {stage: name for name, stage in ZERO_STAGES.items()}
PERSISTENCE_THRESHOLD = 100_000  # DeepSpeed's default stage3_param_persistence_threshold


def ds_config(target: Target, accumulation: int) -> dict[str, Any]:
    """The ZeRO config of the plan's stage, precision, offload and batch split."""
    plan = target.plan
    stage = ZERO_STAGES[plan.sharding]
    _, bf16, fp16 = precision_flags(plan.precision)
    zero: dict[str, Any] = {"stage": stage}
    if plan.cpu_offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        if stage == 3:
            zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    zero.update(zero_buffers(target))
    if stage == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    config: dict[str, Any] = {
        "train_batch_size": plan.micro_batch_size * accumulation * plan.gpus,
        "train_micro_batch_size_per_gpu": plan.micro_batch_size,
        "gradient_accumulation_steps": accumulation,
        "gradient_clipping": 1.0,
        "bf16": {"enabled": bf16},
        "fp16": {"enabled": fp16},
        "zero_optimization": zero,
    }
    if plan.cpu_offload:
        # "auto": the Trainer fills these from its arguments.
        config["optimizer"] = {
            "type": "AdamW",
            "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"},
        }
    return config


def zero_buffers(target: Target) -> dict[str, int]:
    """ZeRO's memory-relevant buffer sizes (in elements), set to what the estimate assumed.

    services/estimator/memory.py (``sharded_working_bytes``) holds one transformer block's parameters
    gathered while the next is prefetched, and one block's gradients before they are reduce-scattered;
    DeepSpeed's own defaults (reduce/allgather buckets of 5e8 elements, a 5e7 prefetch bucket, 1e9 live
    parameters; deepspeed/runtime/zero/config.py) would hold up to several GiB more, and the Trainer's
    "auto" fills them from the hidden size. So the buckets are one block, the live parameters two blocks,
    and parameters below 1e5 elements (norms, biases: DeepSpeed's default threshold) stay gathered.
    """
    stage = ZERO_STAGES[target.plan.sharding]
    block = max(1, int(target.arch.largest_block_params))
    buffers = {"reduce_bucket_size": block}
    if stage in (1, 2):
        buffers["allgather_bucket_size"] = block
    else:
        buffers.update(
            stage3_prefetch_bucket_size=block,
            stage3_max_live_parameters=2 * block,
            stage3_param_persistence_threshold=PERSISTENCE_THRESHOLD,
        )
    return buffers


def zero_assumptions(target: Target) -> list[str]:
    """The header lines of a ZeRO export: the buffer sizes, and the world size train_batch_size fixes."""
    if target.plan.sharding not in ZERO_STAGES:
        return []
    sizes = ", ".join(f"{k} {v:,}" for k, v in zero_buffers(target).items())
    return [
        f"ZeRO buffers set to what the estimate assumed (one block of parameters): {sizes}",
        f"ds_config.json's train_batch_size is micro-batch x accumulation x {target.plan.gpus} GPUs: it is valid "
        f"only at {target.plan.gpus} GPUs (DeepSpeed refuses another world size); re-export for another count",
    ]


class _Section(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)


class _Device(_Section):
    device: Literal["cpu", "none"]


class _Enabled(_Section):
    enabled: bool = False


class _Zero(_Section):
    stage: Literal[1, 2, 3]
    offload_optimizer: _Device | None = None
    offload_param: _Device | None = None


class DsConfig(_Section):
    train_batch_size: int
    train_micro_batch_size_per_gpu: int
    gradient_accumulation_steps: int
    bf16: _Enabled = _Enabled()
    fp16: _Enabled = _Enabled()
    zero_optimization: _Zero


def read_ds_config(files: Mapping[str, str]) -> DsConfig:
    return validated(DsConfig, load_json(files, DS_FILE), DS_FILE)


def ds_offload(zero: _Zero) -> bool:
    """The plan's cpu_offload: optimizer offload, plus parameter offload at stage 3."""
    optimizer = zero.offload_optimizer is not None and zero.offload_optimizer.device == "cpu"
    params = zero.offload_param is not None and zero.offload_param.device == "cpu"
    if params and zero.stage != 3:
        raise ExportError(f"{DS_FILE}:zero_optimization.offload_param", "parameter offload needs ZeRO stage 3")
    if zero.stage == 3 and optimizer != params:
        raise ExportError(
            f"{DS_FILE}:zero_optimization",
            "at stage 3 the plan's cpu_offload offloads both the optimizer and the parameters; set both or neither",
        )
    return optimizer


def ds_fields(config: DsConfig) -> dict[str, Any]:
    """sharding, cpu_offload and GPUs (train_batch_size over micro-batch x accumulation) of a ZeRO config."""
    per_gpu = config.train_micro_batch_size_per_gpu * config.gradient_accumulation_steps
    if per_gpu < 1 or config.train_batch_size % per_gpu:
        raise ExportError(
            f"{DS_FILE}:train_batch_size",
            f"{config.train_batch_size} is not micro-batch x accumulation ({per_gpu}) x a GPU count",
        )
    return {
        "sharding": _STAGE_NAMES[config.zero_optimization.stage],
        "cpu_offload": ds_offload(config.zero_optimization),
        "gpus": config.train_batch_size // per_gpu,
    }


def read_zero(
    files: Mapping[str, str], micro: int, accumulation: int, bf16: bool, fp16: bool, gpus: int
) -> dict[str, Any]:
    """sharding, cpu_offload and GPUs of ds_config.json, checked against the script and the launcher."""
    config = read_ds_config(files)
    check_ds_matches(config, micro, accumulation, bf16, fp16)
    found = ds_fields(config)
    if found["gpus"] != gpus:
        raise ExportError(f"{DS_FILE}:train_batch_size", f"implies {found['gpus']} GPUs; the launch starts {gpus}")
    return found


def check_ds_matches(config: DsConfig, micro: int, accumulation: int, bf16: bool, fp16: bool) -> None:
    """The ZeRO config agrees with the script's batch split and precision (DeepSpeed would refuse otherwise)."""
    pairs = {
        "train_micro_batch_size_per_gpu": (config.train_micro_batch_size_per_gpu, micro),
        "gradient_accumulation_steps": (config.gradient_accumulation_steps, accumulation),
        "bf16.enabled": (config.bf16.enabled, bf16),
        "fp16.enabled": (config.fp16.enabled, fp16),
    }
    for key, (found, expected) in pairs.items():
        if found != expected:
            raise ExportError(f"{DS_FILE}:{key}", f"{found} disagrees with the training arguments ({expected})")
