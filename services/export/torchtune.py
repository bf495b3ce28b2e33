"""torchtune: a complete recipe config (``config.yaml``) for ``tune run <recipe> --config config.yaml``.

Rules:

- recipe: full_finetune_* for method full, lora_finetune_* for lora and qlora (QLoRA is the lora recipe with
  the ``qlora_`` model builder); *_single_device on 1 GPU, *_distributed (FSDP2) on several.
- torchtune shards only with FSDP and its distributed recipes always shard: 1 GPU needs sharding none,
  several GPUs need fsdp; zero1/2/3 are refused. ``cpu_offload`` is ``fsdp_cpu_offload``.
- dtype bf16 or fp32 only (the recipes refuse fp16 and have no autocast mixed precision).
- NF4 only (torchao); int8 is refused. LoRA goes on the attention projections named one by one, on the
  whole MLP or none of it (``apply_lora_to_mlp``), and on the output projection unless it is tied.
- optimizer: torch.optim.AdamW / SGD (momentum 0.9) with the plan's fused / foreach / for-loop
  implementation, bitsandbytes AdamW8bit / PagedAdamW / PagedAdamW8bit (single device only: they do not
  take FSDP2's sharded parameters), torch.optim.Adafactor. ``optimizer_in_bwd`` only in the full recipes
  and only without gradient accumulation.
- loss: chunked = CEWithChunkedOutputLoss (the default), standard = torch.nn.CrossEntropyLoss.
- kernels: the recipes have no switch for Liger's or Transformer Engine's kernels: only 'none' (or null).
- double_quant: torchao's NF4 always quantizes its block scales again (``NF4Tensor``'s
  ``double_quantize_scalers``, blocks of 256): true or null is what runs, false cannot be set and is refused.
- The model must have a torchtune builder (services/export/data/torchtune_models.json).
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from services.estimator.architecture import Architecture
from services.estimator.plan import ALL_LINEAR_ROLES, LoraRole, Optimizer, OptimizerImpl
from services.export.dataset import DataFormat
from services.export.errors import ExportError
from services.export.models import Built
from services.export.names import lora_notes, lora_settings, ordered_roles
from services.export.policy import Policy, policy
from services.export.render import (
    LAUNCH_FILE,
    MASTER_PORT,
    flag_int,
    header_lines,
    launch_argv,
    launch_text,
    load_yaml,
    validated,
    yaml_text,
)
from services.export.resume import (
    CHECKPOINT_COMMENT,
    CHECKPOINT_ENV,
    DEFAULT_CHECKPOINT_DIR,
    ResumeKind,
    checkpoint_dir_line,
    resume_line,
)
from services.export.target import Target, require_accumulation, require_default

CONFIG_FILE = "config.yaml"
CHECKPOINTER = "torchtune.training.FullModelHFCheckpointer"
_ATTN_NAMES: dict[LoraRole, str] = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "output_proj"}
_MLP_ROLES: frozenset[str] = frozenset({"gate", "up", "down"})
_BNB: dict[Optimizer, str] = {
    "adamw-8bit": "bitsandbytes.optim.AdamW8bit",
    "paged-adamw": "bitsandbytes.optim.PagedAdamW",
    "paged-adamw-8bit": "bitsandbytes.optim.PagedAdamW8bit",
}
_TORCH: dict[Optimizer, str] = {
    "adamw": "torch.optim.AdamW",
    "sgd": "torch.optim.SGD",
    "adafactor": "torch.optim.Adafactor",
}
_COMPONENT_BACK: dict[str, Optimizer] = {name: opt for opt, name in {**_BNB, **_TORCH}.items()}
_LOSS = {
    "chunked": "torchtune.modules.loss.CEWithChunkedOutputLoss",
    "standard": "torch.nn.CrossEntropyLoss",
}
_LOSS_BACK = {name: loss for loss, name in _LOSS.items()}
_RECIPE = re.compile(r"^(full|lora)_finetune_(single_device|distributed)$")


@dataclass(frozen=True)
class TorchtuneModel:
    hf_id: str
    module: str
    builder: str
    qlora: bool
    tokenizer: str
    tokenizer_file: str
    model_type: str
    checkpoint_files: list[str] | dict[str, str]
    # "builder": a qlora_<builder> exists; "quantize_base": the LoRA builder takes quantize_base (Qwen2.5).
    qlora_via: Literal["builder", "quantize_base"] = "builder"
    merges_file: str | None = None  # BPE tokenizers (Qwen2.5) take a merges file beside the vocabulary


@functools.cache
def torchtune_models() -> dict[str, TorchtuneModel]:
    """The models torchtune has builders for, by lower-case HF id (read on first use)."""
    text = resources.files("services.export").joinpath("data/torchtune_models.json").read_text(encoding="utf-8")
    return {m["hf_id"].lower(): TorchtuneModel(**m) for m in json.loads(text)["models"]}


def torchtune_model(model_id: str) -> TorchtuneModel:
    found = torchtune_models().get(model_id.lower())
    if found is None:
        known = ", ".join(m.hf_id for m in torchtune_models().values())
        raise ExportError("model.name", f"no torchtune model builder is known for {model_id!r}; known: {known}")
    return found


def _check(target: Target, entry: TorchtuneModel) -> None:
    """Refuse what torchtune's recipes cannot run with the estimated memory (see the module rules)."""
    plan = target.plan
    if plan.precision not in ("bf16", "fp32"):
        raise ExportError(
            "precision", f"{plan.precision!r}: torchtune recipes train in bf16 or fp32 only; allowed: bf16, fp32"
        )
    if plan.quantized == "int8":
        raise ExportError("quantization", "'int8': torchtune's QLoRA quantizes to NF4 (torchao); allowed: nf4, null")
    if plan.quantized == "nf4" and not entry.qlora:
        raise ExportError("quantization", f"torchtune has no QLoRA builder for {entry.hf_id}")
    if plan.sharding in ("zero1", "zero2", "zero3"):
        raise ExportError(
            "sharding",
            f"{plan.sharding!r}: torchtune shards only with FSDP; allowed: none (1 GPU), fsdp (several GPUs)",
        )
    if plan.gpus == 1 and plan.sharding != "none":
        raise ExportError(
            "sharding", "'fsdp' on 1 GPU: torchtune's single-device recipes neither shard nor offload; use none"
        )
    if plan.gpus > 1 and plan.sharding != "fsdp":
        raise ExportError(
            "sharding", f"'none' on {plan.gpus} GPUs: torchtune's distributed recipes always shard with FSDP; use fsdp"
        )
    if plan.optimizer in _BNB and plan.gpus > 1:
        raise ExportError(
            "optimizer",
            f"{plan.optimizer!r}: bitsandbytes optimizers do not take FSDP2's sharded (DTensor) parameters; "
            "allowed on several GPUs: adamw, sgd, adafactor",
        )
    epochs = plan.data.epochs if plan.data is not None else 1
    if epochs != math.ceil(epochs):
        # torchtune's recipes run whole epochs: 1.2 planned ran 2, two thirds more than priced (a probe of the exports).
        raise ExportError(
            "data.epochs",
            f"{epochs:g}: torchtune trains whole epochs, so it would run {math.ceil(epochs)}, "
            f"{math.ceil(epochs) / epochs - 1:.0%} more than planned; plan a whole number of epochs",
        )
    if plan.optimizer_in_backward and plan.method != "full":
        raise ExportError("optimizer_in_backward", "only torchtune's full fine-tuning recipes step in backward")
    if plan.optimizer_in_backward and (plan.gradient_accumulation_steps or 1) > 1:
        raise ExportError(
            "gradient_accumulation_steps", "torchtune's optimizer_in_bwd needs gradient_accumulation_steps 1"
        )
    # Checked before the loss: kernels 'liger' resolves the loss to 'fused', and the kernels are the cause.
    kernels = target.recipe.kernels
    if kernels != "none":
        raise ExportError(
            "kernels",
            f"{kernels!r}: torchtune's recipes have no switch for fused kernels patched into the model; "
            "allowed here: 'none' or null (or export to hf-trainer/axolotl for 'liger')",
        )
    if target.recipe.loss not in _LOSS:
        raise ExportError("loss", f"{plan.loss!r}: allowed in torchtune: chunked (default), standard")
    require_default(target, "attention", "torchtune's models run their own SDPA attention")
    require_default(target, "logits_fp32", "torchtune's models upcast the output to fp32")
    require_default(target, "checkpoint_granularity", "torchtune's activation checkpointing wraps whole layers")
    require_default(target, "adapter_dtype", "torchtune keeps the adapters in the model dtype")
    require_default(target, "nf4_quantization", "torchtune's current torchao quantizes NF4 in chunks")
    if plan.double_quant is False:
        raise ExportError(
            "double_quant",
            "false: torchao's NF4 (torchtune's QLoRA) always quantizes its block scales again and has no switch; "
            "leave it null or true",
        )
    if plan.padding == "longest":
        raise ExportError(
            "padding",
            "'longest': the config packs the data set into rows of seq_len, so every batch has one shape; "
            "use 'packed' or leave it null",
        )


# Warm-up steps written when the plan has no data size (torchtune's scheduler takes steps, not a ratio);
# the value of torchtune's own LoRA recipe configs.
DEFAULT_WARMUP_STEPS = 100


def _optimizer(target: Target, rules: Policy) -> dict[str, Any]:
    plan = target.plan
    # weight_decay explicitly: torch.optim.AdamW and bitsandbytes' AdamW8bit would apply 0.01 by default.
    common = {"lr": rules.learning_rate, "weight_decay": rules.weight_decay}
    if plan.optimizer in _BNB:
        require_default(target, "optimizer_impl", "bitsandbytes optimizers have one implementation")
        return {"_component_": _BNB[plan.optimizer], **common}
    section: dict[str, Any] = {"_component_": _TORCH[plan.optimizer], **common}
    if plan.optimizer == "sgd":
        section["momentum"] = 0.9  # the estimate keeps one momentum buffer per parameter
    if plan.optimizer in ("adamw", "sgd"):
        impl = target.recipe.optimizer_impl
        section.update(fused=impl == "fused", foreach=impl == "foreach")
    else:
        require_default(target, "optimizer_impl", "torch.optim.Adafactor's memory does not depend on it")
    return section


def _model(target: Target, entry: TorchtuneModel) -> dict[str, Any]:
    plan = target.plan
    if plan.method == "full":
        return {"_component_": f"{entry.module}.{entry.builder}"}
    lora = lora_settings(plan, target.recipe)
    roles: set[str] = set(ALL_LINEAR_ROLES if lora.targets == "all-linear" else lora.targets)
    mlp = roles & _MLP_ROLES
    if mlp and mlp != _MLP_ROLES:
        raise ExportError(
            "lora.targets",
            f"{', '.join(sorted(mlp))}: torchtune puts LoRA on the whole MLP (gate, up, down) or none of it",
        )
    if "lm_head" in roles and target.arch.tie_word_embeddings:
        raise ExportError(
            "lora.targets", "lm_head: the model ties the output to the embedding; torchtune cannot adapt it"
        )
    nf4 = plan.quantized == "nf4"
    prefix = "qlora_" if nf4 and entry.qlora_via == "builder" else "lora_"
    section: dict[str, Any] = {
        "_component_": f"{entry.module}.{prefix}{entry.builder}",
        "lora_attn_modules": [name for role, name in _ATTN_NAMES.items() if role in roles],
        "apply_lora_to_mlp": bool(mlp),
        "apply_lora_to_output": "lm_head" in roles,
        "lora_rank": lora.rank,
        "lora_alpha": lora.alpha,
        "lora_dropout": lora.dropout,
    }
    if nf4 and entry.qlora_via == "quantize_base":
        section["quantize_base"] = True
    return section


def tune_dataset(data: DataFormat) -> dict[str, Any]:
    """The dataset builder that reads train.jsonl in the data format, packed to max_seq_len."""
    common = {"source": "json", "data_files": "train.jsonl", "split": "train", "packed": True}
    if data.kind == "text":
        return {"_component_": "torchtune.datasets.text_completion_dataset", **common, "column": "text"}
    if data.chat:
        return {
            "_component_": "torchtune.datasets.chat_dataset",
            **common,
            "conversation_column": data.messages_field,
            "conversation_style": "sharegpt" if data.kind == "sharegpt" else "openai",
            "train_on_input": False,
        }
    instruction, extra, answer = data.instruction_fields
    if data.kind == "prompt_completion":
        return {
            "_component_": "torchtune.datasets.instruct_dataset",
            **common,
            "column_map": {"input": instruction, "output": answer},
            "train_on_input": False,
        }
    return {
        "_component_": "torchtune.datasets.alpaca_dataset",
        **common,
        "column_map": {"instruction": instruction, "input": extra, "output": answer},
        "train_on_input": False,
    }


def recipe_name(target: Target) -> str:
    kind = "full" if target.plan.method == "full" else "lora"
    return f"{kind}_finetune_{'distributed' if target.plan.gpus > 1 else 'single_device'}"


def checkpoint_dir(entry: TorchtuneModel) -> str:
    return f"/tmp/{entry.hf_id.split('/')[-1]}"


def tune_config(target: Target, entry: TorchtuneModel, accumulation: int) -> dict[str, Any]:
    """The whole recipe config: model, tokenizer, checkpointer, data, batch split, optimizer, memory flags."""
    plan = target.plan
    full = plan.method == "full"
    rules = policy(plan, accumulation)
    ckpt = checkpoint_dir(entry)
    epochs = int(plan.data.epochs) if plan.data is not None else 1  # whole (_check)
    config: dict[str, Any] = {
        # launch.sh passes the run's folder ($GPUPLAN_CHECKPOINT_DIR) and, when a complete checkpoint is there,
        # the overrides that resume from it (resume.py); resume_from_checkpoint stays false for a fresh start.
        "output_dir": DEFAULT_CHECKPOINT_DIR,
        "model": _model(target, entry),
        "tokenizer": {
            "_component_": entry.tokenizer,
            "path": f"{ckpt}/{entry.tokenizer_file}",
            **({"merges_file": f"{ckpt}/{entry.merges_file}"} if entry.merges_file else {}),
            "max_seq_len": plan.seq_len,
        },
        "checkpointer": {
            "_component_": CHECKPOINTER,
            "checkpoint_dir": ckpt,
            "checkpoint_files": entry.checkpoint_files,
            "recipe_checkpoint": None,
            "output_dir": "${output_dir}",
            "model_type": entry.model_type,
        },
        "resume_from_checkpoint": False,
        # Packed samples of max_seq_len tokens: every micro-batch has the shape the estimate assumed.
        "dataset": tune_dataset(target.data),
        "seed": None,
        "shuffle": True,
        "batch_size": plan.micro_batch_size,
        "epochs": epochs,
        "max_steps_per_epoch": None,
        "gradient_accumulation_steps": accumulation,
        "optimizer": _optimizer(target, rules),
        "lr_scheduler": {
            "_component_": "torchtune.training.lr_schedulers.get_cosine_schedule_with_warmup",
            "num_warmup_steps": rules.warmup_steps if rules.warmup_steps is not None else DEFAULT_WARMUP_STEPS,
        },
        "loss": {"_component_": _LOSS[target.recipe.loss]},
        # torchtune cannot clip when the optimizer steps inside backward (the recipe refuses both).
        "clip_grad_norm": None if plan.optimizer_in_backward else rules.max_grad_norm,
        "compile": bool(plan.compile),
        "device": "cuda",
        "dtype": plan.precision,
        "enable_activation_checkpointing": plan.gradient_checkpointing,
        "enable_activation_offloading": bool(plan.activation_offloading),
        "metric_logger": {
            "_component_": "torchtune.training.metric_logging.DiskLogger",
            "log_dir": "${output_dir}/logs",
        },
        "log_every_n_steps": 1,
        "log_peak_memory_stats": True,
    }
    if full:
        config["optimizer_in_bwd"] = plan.optimizer_in_backward
    else:
        config["save_adapter_weights_only"] = False
    if plan.gpus > 1:
        config["fsdp_cpu_offload"] = plan.cpu_offload
    return config


def tune_command(target: Target) -> str:
    recipe = recipe_name(target)
    if target.plan.gpus == 1:
        return f"tune run {recipe} --config {CONFIG_FILE}"
    if target.nodes == 1:
        return f"tune run --nproc_per_node {target.gpus_per_node} {recipe} --config {CONFIG_FILE}"
    return (
        f"tune run --nnodes {target.nodes} --nproc_per_node {target.gpus_per_node} --rdzv_backend c10d "
        f"--rdzv_endpoint $MASTER_ADDR:{MASTER_PORT} {recipe} --config {CONFIG_FILE}"
    )


def export_torchtune(target: Target) -> Built:
    """config.yaml and launch.sh for the torchtune recipe of the plan."""
    entry = torchtune_model(target.model_id)
    _check(target, entry)
    accumulation = require_accumulation(target)
    command = tune_command(target)
    rules = policy(target.plan, accumulation)
    assumed = [target.data.describe(), rules.describe()]
    if rules.warmup_steps is None:
        assumed.append(
            f"Differs from the other formats: the plan has no data size, so the warm-up is {DEFAULT_WARMUP_STEPS} "
            "steps (torchtune's scheduler takes steps, not a ratio)"
        )
    if target.plan.optimizer_in_backward:
        assumed.append("Differs from the other formats: no gradient clipping (torchtune's optimizer_in_bwd refuses it)")
    header = header_lines(target, command, assumed)
    download = (
        f'tune download {entry.hf_id} --output-dir {checkpoint_dir(entry)} --ignore-patterns "original/consolidated*"'
    )
    notes = [
        f"download the weights first: {download}",
        "config.yaml trains on train.jsonl (dataset), packed to max_seq_len",
    ]
    notes += lora_notes(target.plan, target.recipe)
    if target.checkpoint_interval_s is not None:
        notes.append(
            f"torchtune checkpoints at the end of each epoch: the {target.checkpoint_interval_s / 60:.0f}-minute "
            "checkpoint interval the spot estimate assumed cannot be set"
        )
    prelude = [f"Download first: {download}"]
    if target.nodes > 1:
        prelude.append(f"Run on each of the {target.nodes} nodes with MASTER_ADDR set to node 0's address.")
    kind: ResumeKind = "torchtune-full" if target.plan.method == "full" else "torchtune-lora"
    resumed = f'{command} output_dir="${CHECKPOINT_ENV}" "${{RESUME[@]}}"'
    files = {
        CONFIG_FILE: yaml_text(header, tune_config(target, entry, accumulation)),
        LAUNCH_FILE: launch_text(
            header, resumed, [*prelude, CHECKPOINT_COMMENT], [checkpoint_dir_line(), resume_line(kind)]
        ),
    }
    return Built(files, command, notes)


# --------------------------------------------------------------------------------------------------
# Reading config.yaml back


class _Section(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, strict=True, populate_by_name=True)


class _Component(_Section):
    component: str = Field(alias="_component_")


class _TuneModel(_Component):
    lora_attn_modules: list[Literal["q_proj", "k_proj", "v_proj", "output_proj"]] | None = None
    apply_lora_to_mlp: bool = False
    apply_lora_to_output: bool = False
    lora_rank: int | None = None
    lora_alpha: int | None = None
    lora_dropout: float = 0.0
    quantize_base: bool = False


class _Tokenizer(_Component):
    max_seq_len: int


class _Dataset(_Component):
    packed: Literal[True]


class _Optimizer(_Component):
    fused: bool | None = None
    foreach: bool | None = None


class TuneConfig(_Section):
    model: _TuneModel
    tokenizer: _Tokenizer
    dataset: _Dataset
    batch_size: int
    gradient_accumulation_steps: int = 1
    optimizer: _Optimizer
    optimizer_in_bwd: bool = False
    loss: _Component
    dtype: Literal["bf16", "fp32"]
    enable_activation_checkpointing: bool = False
    enable_activation_offloading: bool = False
    compile: bool = False
    fsdp_cpu_offload: bool = False


def _impl(optimizer: _Optimizer) -> OptimizerImpl:
    if optimizer.fused:
        return "fused"
    if optimizer.foreach:
        return "foreach"
    return "for-loop"


def _launch(files: Mapping[str, str]) -> tuple[str, str, int]:
    """(kind, device mode, GPUs) of launch.sh's ``tune run``."""
    argv = launch_argv(files)
    recipes = [found for arg in argv if (found := _RECIPE.match(arg))]
    if argv[:2] != ["tune", "run"] or len(recipes) != 1:
        raise ExportError(LAUNCH_FILE, "expected 'tune run ... <full|lora>_finetune_<single_device|distributed> ...'")
    match = recipes[0]
    gpus = flag_int(argv, "--nproc_per_node", 1) * flag_int(argv, "--nnodes", 1)
    return match.group(1), match.group(2), gpus


def _lora_fields(model: _TuneModel) -> dict[str, Any]:
    where = f"{CONFIG_FILE}:model"
    if model.lora_rank is None or model.lora_alpha is None or model.lora_attn_modules is None:
        raise ExportError(where, "a LoRA builder needs lora_attn_modules, lora_rank and lora_alpha")
    back = {name: role for role, name in _ATTN_NAMES.items()}
    roles: set[str] = {back[name] for name in model.lora_attn_modules}
    if model.apply_lora_to_mlp:
        roles |= _MLP_ROLES
    if model.apply_lora_to_output:
        roles.add("lm_head")
    ordered = ordered_roles(roles)
    targets: list[LoraRole] | str = "all-linear" if ordered == list(ALL_LINEAR_ROLES) else ordered
    return {"rank": model.lora_rank, "alpha": model.lora_alpha, "dropout": model.lora_dropout, "targets": targets}


def read_torchtune(files: Mapping[str, str], arch: Architecture) -> dict[str, Any]:
    """The plan fields of config.yaml and launch.sh."""
    del arch  # torchtune names LoRA layers by role, not by the HF module names
    config = validated(TuneConfig, load_yaml(files, CONFIG_FILE), CONFIG_FILE)
    kind, mode, gpus = _launch(files)
    builder = config.model.component.rsplit(".", 1)[-1]
    quantized = builder.startswith("qlora_") or config.model.quantize_base
    method = "qlora" if quantized else "lora" if builder.startswith("lora_") else "full"
    if (method == "full") != (kind == "full"):
        raise ExportError(f"{CONFIG_FILE}:model._component_", f"{builder} does not fit the {kind}_finetune recipe")
    if (mode == "single_device") != (gpus == 1):
        raise ExportError(LAUNCH_FILE, f"the {mode} recipe on {gpus} GPUs")
    optimizer = _COMPONENT_BACK.get(config.optimizer.component)
    if optimizer is None:
        raise ExportError(
            f"{CONFIG_FILE}:optimizer._component_",
            f"{config.optimizer.component!r}; allowed: {', '.join(_COMPONENT_BACK)}",
        )
    loss = _LOSS_BACK.get(config.loss.component)
    if loss is None:
        allowed = ", ".join(_LOSS_BACK)
        raise ExportError(f"{CONFIG_FILE}:loss._component_", f"{config.loss.component!r}; allowed: {allowed}")
    return {
        "framework": "torchtune",
        "mode": "train",
        "method": method,
        "quantization": "nf4" if method == "qlora" else None,
        "lora": None if method == "full" else _lora_fields(config.model),
        "precision": config.dtype,
        "optimizer": optimizer,
        "optimizer_impl": _impl(config.optimizer) if optimizer in ("adamw", "sgd") else None,
        "optimizer_in_backward": config.optimizer_in_bwd,
        "micro_batch_size": config.batch_size,
        "gradient_accumulation_steps": config.gradient_accumulation_steps,
        "seq_len": config.tokenizer.max_seq_len,
        "gradient_checkpointing": config.enable_activation_checkpointing,
        "gpus": gpus,
        "sharding": "fsdp" if mode == "distributed" else "none",
        "cpu_offload": config.fsdp_cpu_offload if mode == "distributed" else False,
        "attention": None,
        "loss": loss,
        "logits_fp32": None,
        "checkpoint_granularity": None,
        "adapter_dtype": None,
        "kv_cache_dtype": None,
        "compile": config.compile,
        "activation_offloading": config.enable_activation_offloading,
    }
