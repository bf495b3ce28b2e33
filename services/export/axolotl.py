"""axolotl: ``axolotl.yaml`` (plus ``ds_config.json`` under ZeRO) for ``accelerate launch -m axolotl.cli.train`` (one
sharded GPU: ``torchrun``, a distributed launch of one process).

axolotl trains with the Hugging Face Trainer, so the Trainer rules hold (services/export/hf.py: optimizer
names, no optimizer in backward, no sgd, int8 not sharded, ZeRO-Offload with adamw only), plus:

- axolotl loads the model in the training dtype (``bf16: true`` loads bf16 weights), so the precisions are
  bf16, fp16 (adapters, or full under ZeRO) and fp32; bf16-mixed and fp16-mixed are refused.
- gradient accumulation: a plan without ``gradient_accumulation_steps`` gets the steps that keep its
  effective batch on its GPUs (services/export/target.py ``accumulation_for``).
- NF4 with ``bnb_4bit_use_double_quant`` as the plan resolves it (``double_quant``, off by default;
  ``bnb_config_kwargs``), like the estimate's bitsandbytes NF4; sample packing to ``sequence_len`` (every
  micro-batch is micro_batch_size x sequence_len tokens).
- kernels 'liger': axolotl's ``LigerPlugin`` with ``liger_rope``, ``liger_rms_norm``,
  ``liger_glu_activation`` and ``liger_fused_linear_cross_entropy`` (the estimate's Liger norms, SwiGLU and
  fused loss); 'transformer-engine' has no axolotl switch and is refused (hf.py ``check_trainer_kernels``).
- sharding: FSDP2 (``fsdp_version: 2``) with ``offload_params`` for cpu_offload, or ``deepspeed:
  ds_config.json``; several GPUs without sharding run DDP.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from services.estimator.architecture import Architecture
from services.export.dataset import ALPACA_PROMPT, ALPACA_PROMPT_WITH_INPUT, DataFormat
from services.export.errors import ExportError
from services.export.hf import (
    DS_FILE,
    HF_ATTENTION,
    ZERO_STAGES,
    HfAttention,
    HfOptim,
    check_trainer_plan,
    hf_optim,
    option_back,
    uses_liger,
)
from services.export.models import Built
from services.export.names import hf_target_modules, lora_notes, lora_settings, roles_from_hf
from services.export.policy import WARMUP_RATIO, policy
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
from services.export.resume import (
    CHECKPOINT_COMMENT,
    CHECKPOINT_ENV,
    DEFAULT_CHECKPOINT_DIR,
    checkpoint_dir_line,
    resume_line,
)
from services.export.target import Target, require_accumulation
from services.export.zero import ds_config, read_zero, zero_assumptions

CONFIG_FILE = "axolotl.yaml"
LIGER_PLUGIN = "axolotl.integrations.liger.LigerPlugin"
LIGER_KEYS = ("liger_rope", "liger_rms_norm", "liger_glu_activation", "liger_fused_linear_cross_entropy")


def _check(target: Target) -> None:
    plan = target.plan
    check_trainer_plan(target)
    if plan.precision.endswith("-mixed"):
        raise ExportError(
            "precision",
            f"{plan.precision!r}: axolotl loads the weights in the training dtype (no fp32 weights under autocast); "
            "allowed: bf16, fp16, fp32",
        )
    if plan.sharding == "fsdp" and plan.optimizer == "adamw-8bit":
        # axolotl's config check (check_fsdp2_w_8bit_optimizer) refuses bitsandbytes' 8-bit AdamW under FSDP2, "CUDA
        # ops errors"; the torchao one it suggests is not the optimizer the setup was estimated with (a probe).
        raise ExportError(
            "optimizer",
            "'adamw-8bit' under FSDP: axolotl's FSDP2 refuses bitsandbytes' adamw_bnb_8bit; allowed under FSDP: "
            "adamw, paged-adamw, paged-adamw-8bit, adafactor (or ZeRO for adamw-8bit)",
        )


def _adapter(target: Target) -> dict[str, Any]:
    plan = target.plan
    if plan.method == "full":
        return {}
    lora = lora_settings(plan, target.recipe)
    section: dict[str, Any] = {"adapter": "qlora" if plan.quantized == "nf4" else "lora"}
    if plan.quantized == "nf4":
        section["load_in_4bit"] = True
        double = target.recipe.nf4_double_quant
        section["bnb_config_kwargs"] = {"bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": double}
    elif plan.quantized == "int8":
        section["load_in_8bit"] = True
    section.update(lora_r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout)
    # axolotl turns its fused LoRA kernels on by default where they apply; the estimate models PEFT's
    # unfused LoRA layers (their saved activations), so the export runs those.
    section.update(lora_mlp_kernel=False, lora_qkv_kernel=False, lora_o_kernel=False)
    modules = hf_target_modules(lora.targets, target.arch)
    if modules == "all-linear":
        section["lora_target_linear"] = True
    else:
        section["lora_target_modules"] = modules
    return section


def _sharding(target: Target) -> dict[str, Any]:
    plan = target.plan
    if plan.sharding == "fsdp":
        return {
            "fsdp_version": 2,
            "fsdp_config": {
                "offload_params": plan.cpu_offload,
                "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                "state_dict_type": "SHARDED_STATE_DICT",
                "reshard_after_forward": True,
                # axolotl refuses it with a 4-bit base under FSDP2 ("deadlocks the state dict scatter", its config
                # check), and a QLoRA export that does not start was what a probe found.
                "cpu_ram_efficient_loading": plan.quantized != "nf4",
            },
        }
    if plan.sharding in ZERO_STAGES:
        return {"deepspeed": DS_FILE}
    return {}


def axolotl_config(target: Target, accumulation: int) -> dict[str, Any]:
    """The axolotl config: model, adapter, packing, batch split, precision, optimizer, sharding."""
    plan = target.plan
    config: dict[str, Any] = {"base_model": target.model_id, **_adapter(target)}
    rules = policy(plan, accumulation)
    warmup: dict[str, Any] = (
        {"warmup_steps": rules.warmup_steps} if rules.warmup_steps is not None else {"warmup_ratio": WARMUP_RATIO}
    )
    config.update(
        sequence_len=plan.seq_len,
        sample_packing=True,
        pad_to_sequence_len=True,
        micro_batch_size=plan.micro_batch_size,
        gradient_accumulation_steps=accumulation,
        num_epochs=plan.data.epochs if plan.data is not None else 1.0,
        optimizer=hf_optim(target),
        bf16=plan.precision == "bf16",
        fp16=plan.precision == "fp16",
        tf32=False,
        learning_rate=rules.learning_rate,
        lr_scheduler="cosine",
        **warmup,
        weight_decay=rules.weight_decay,
        max_grad_norm=rules.max_grad_norm,
        gradient_checkpointing=plan.gradient_checkpointing,
        attn_implementation=HF_ATTENTION[target.recipe.attention],
    )
    if uses_liger(target):
        # axolotl's Liger integration (axolotl/integrations/liger/args.py: LigerArgs) patches the model's
        # norms, rotary, GLU and replaces the loss with the fused linear cross-entropy.
        config["plugins"] = [LIGER_PLUGIN]
        config.update(
            liger_rope=True, liger_rms_norm=True, liger_glu_activation=True, liger_fused_linear_cross_entropy=True
        )
    if plan.gradient_checkpointing:
        config["gradient_checkpointing_kwargs"] = {"use_reentrant": False}
    if target.save_steps is not None:
        config["save_steps"] = target.save_steps
    config.update(_sharding(target))
    config["datasets"] = [axolotl_dataset(target.data)]
    # launch.sh passes the run's folder ($GPUPLAN_CHECKPOINT_DIR) and the checkpoint to resume from
    # (resume.py: the newest complete one); run by hand, axolotl resumes from its newest checkpoint-N.
    config["output_dir"] = f"./{DEFAULT_CHECKPOINT_DIR}"
    config["auto_resume_from_checkpoints"] = True
    return config


def axolotl_dataset(data: DataFormat) -> dict[str, Any]:
    """The ``datasets`` entry that reads train.jsonl in the data format (axolotl's prompt strategies)."""
    entry: dict[str, Any] = {"path": "train.jsonl", "ds_type": "json"}
    if data.kind == "text":
        return {**entry, "type": "completion", "field": "text"}
    if data.chat:
        entry.update(type="chat_template", field_messages=data.messages_field)
        entry["message_property_mappings"] = {"role": data.role_key, "content": data.content_key}
        if data.kind == "sharegpt":
            entry["roles"] = {"user": ["human", "user"], "assistant": ["gpt", "assistant"], "system": ["system"]}
        entry["roles_to_train"] = ["assistant"]
        return entry
    if data.kind == "alpaca":
        return {**entry, "type": "alpaca"}
    instruction, extra, answer = data.instruction_fields
    custom: dict[str, Any] = {"field_instruction": instruction, "field_output": answer}
    if data.kind == "dolly":
        custom.update(
            field_input=extra,
            format=ALPACA_PROMPT_WITH_INPUT,
            no_input_format=ALPACA_PROMPT,
        )
    else:
        custom.update(format="{instruction}", no_input_format="{instruction}")
    return {**entry, "type": custom}


def axolotl_command(target: Target) -> str:
    if target.plan.gpus == 1 and target.plan.sharding != "none":
        # One process under accelerate launch is a plain one (no --multi_gpu, --use_fsdp or config file), and
        # accelerate applies axolotl's FSDP or ZeRO only to a distributed state: torchrun starts a group of one.
        return f"torchrun --nproc_per_node 1 -m axolotl.cli.train {CONFIG_FILE}"
    # --multi_gpu: without it (or a config file) accelerate launches a group only where the node itself has more
    # than one GPU (commands/launch.py), so 2 nodes of 1 GPU each ran two plain processes, each over the whole data
    # set (a probe of the exports); it also keeps a default_config.yaml on the node from choosing another launch.
    command = f"accelerate launch --multi_gpu --num_processes {target.plan.gpus}"
    if target.nodes > 1:
        command += (
            f" --num_machines {target.nodes} --machine_rank $NODE_RANK --main_process_ip $MASTER_ADDR "
            f"--main_process_port {MASTER_PORT}"
        )
    return f"{command} -m axolotl.cli.train {CONFIG_FILE}"


def export_axolotl(target: Target) -> Built:
    """axolotl.yaml, launch.sh (and ds_config.json under ZeRO)."""
    _check(target)
    accumulation = require_accumulation(target)
    command = axolotl_command(target)
    assumed = [
        target.data.describe(),
        policy(target.plan, accumulation).describe(),
        *(
            [
                "axolotl's LoRA kernels off (lora_mlp_kernel, lora_qkv_kernel, lora_o_kernel): the estimate models "
                "PEFT's LoRA layers"
            ]
            if target.plan.method != "full"
            else []
        ),
        *zero_assumptions(target),
    ]
    header = header_lines(target, command, assumed)
    resumed = f'{command} --output_dir="${CHECKPOINT_ENV}" "${{RESUME[@]}}"'
    files = {
        CONFIG_FILE: yaml_text(header, axolotl_config(target, accumulation)),
        LAUNCH_FILE: launch_text(
            header, resumed, [CHECKPOINT_COMMENT], [checkpoint_dir_line(), resume_line("axolotl")]
        ),
    }
    if target.plan.sharding in ZERO_STAGES:
        files[DS_FILE] = json_text(header, ds_config(target, accumulation))
    notes = ["axolotl.yaml trains on train.jsonl (datasets), packed to sequence_len"]
    notes += lora_notes(target.plan, target.recipe)
    if target.save_steps is not None:
        notes.append(f"checkpoints every {target.save_steps} optimizer steps (save_steps)")
    if target.nodes > 1:
        notes.append(f"run launch.sh on each of the {target.nodes} nodes with NODE_RANK and MASTER_ADDR set")
    return Built(files, command, notes)


# --------------------------------------------------------------------------------------------------
# Reading axolotl.yaml back


class _Section(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)


class _BnbKwargs(_Section):
    bnb_4bit_quant_type: Literal["nf4"] = "nf4"
    bnb_4bit_use_double_quant: bool


class _Fsdp(_Section):
    offload_params: bool = False
    reshard_after_forward: Literal[True] = True


class AxolotlConfig(_Section):
    base_model: str
    adapter: Literal["lora", "qlora"] | None = None
    load_in_4bit: bool = False
    load_in_8bit: bool = False
    bnb_config_kwargs: _BnbKwargs | None = None
    lora_r: int | None = None
    lora_alpha: int | None = None
    lora_dropout: float = 0.0
    lora_target_linear: bool = False
    lora_target_modules: list[str] | None = None
    sequence_len: int
    sample_packing: Literal[True]
    micro_batch_size: int
    gradient_accumulation_steps: int
    optimizer: HfOptim
    bf16: bool = False
    fp16: bool = False
    gradient_checkpointing: bool = False
    attn_implementation: HfAttention
    fsdp_version: Literal[2] | None = None
    fsdp_config: _Fsdp | None = None
    deepspeed: str | None = None
    plugins: list[str] = []
    liger_rope: bool = False
    liger_rms_norm: bool = False
    liger_glu_activation: bool = False
    liger_fused_linear_cross_entropy: bool = False


def _kernels(config: AxolotlConfig) -> str | None:
    """'liger' when the Liger plugin runs every kernel the estimate counts, None without it."""
    switches = [getattr(config, key) for key in LIGER_KEYS]
    if LIGER_PLUGIN not in config.plugins:
        if any(switches):
            raise ExportError(f"{CONFIG_FILE}:plugins", f"the liger_* keys need {LIGER_PLUGIN}")
        return None
    if not all(switches):
        raise ExportError(f"{CONFIG_FILE}:plugins", f"{LIGER_PLUGIN} with only some of {', '.join(LIGER_KEYS)}")
    return "liger"


def _method(config: AxolotlConfig) -> tuple[str, str | None]:
    """(method, quantization) of the adapter and load_in_* keys."""
    where = f"{CONFIG_FILE}:adapter"
    if config.adapter is None:
        if config.load_in_4bit or config.load_in_8bit:
            raise ExportError(where, "a quantized base needs an adapter (lora or qlora)")
        return "full", None
    if config.adapter == "qlora":
        if not config.load_in_4bit or config.load_in_8bit:
            raise ExportError(where, "qlora loads the base in 4 bit: set load_in_4bit only")
        if config.bnb_config_kwargs is None:
            raise ExportError(f"{CONFIG_FILE}:bnb_config_kwargs", "missing: give bnb_4bit_use_double_quant")
        return "qlora", "nf4"
    if config.load_in_4bit:
        raise ExportError(where, "load_in_4bit needs adapter qlora")
    return ("qlora", "int8") if config.load_in_8bit else ("lora", None)


def _lora(config: AxolotlConfig, arch: Architecture) -> dict[str, Any]:
    where = f"{CONFIG_FILE}:lora_target_modules"
    if config.lora_r is None or config.lora_alpha is None:
        raise ExportError(f"{CONFIG_FILE}:lora_r", "an adapter needs lora_r and lora_alpha")
    if config.lora_target_linear == (config.lora_target_modules is not None):
        raise ExportError(where, "set exactly one of lora_target_linear, lora_target_modules")
    modules: str | list[str] = "all-linear" if config.lora_target_linear else config.lora_target_modules or []
    return {
        "rank": config.lora_r,
        "alpha": config.lora_alpha,
        "dropout": config.lora_dropout,
        "targets": roles_from_hf(modules, arch, where),
    }


def _sharding_back(config: AxolotlConfig, files: Mapping[str, str], gpus: int) -> dict[str, Any]:
    if config.deepspeed is not None:
        if config.deepspeed != DS_FILE:
            raise ExportError(f"{CONFIG_FILE}:deepspeed", f"expected {DS_FILE!r}, got {config.deepspeed!r}")
        return read_zero(
            files, config.micro_batch_size, config.gradient_accumulation_steps, config.bf16, config.fp16, gpus
        )
    if config.fsdp_version is not None:
        offload = config.fsdp_config.offload_params if config.fsdp_config is not None else False
        return {"sharding": "fsdp", "cpu_offload": offload, "gpus": gpus}
    return {"sharding": "none", "cpu_offload": False, "gpus": gpus}


def read_axolotl(files: Mapping[str, str], arch: Architecture) -> dict[str, Any]:
    """The plan fields of axolotl.yaml, launch.sh (and ds_config.json)."""
    config = validated(AxolotlConfig, load_yaml(files, CONFIG_FILE), CONFIG_FILE)
    argv = launch_argv(files)
    torchrun = bool(argv) and argv[0] == "torchrun"
    gpus = flag_int(argv, "--nproc_per_node", 1) if torchrun else flag_int(argv, "--num_processes", 1)
    if not torchrun and gpus % flag_int(argv, "--num_machines", 1):
        raise ExportError(f"{LAUNCH_FILE}:--num_processes", "must be a multiple of --num_machines")
    method, quantization = _method(config)
    if config.bf16 and config.fp16:
        raise ExportError(f"{CONFIG_FILE}:bf16", "set at most one of bf16, fp16")
    optimizer, impl = option_back(config.optimizer)
    fields: dict[str, Any] = {
        "framework": "axolotl",
        "mode": "train",
        "method": method,
        "quantization": quantization,
        "lora": None if method == "full" else _lora(config, arch),
        "precision": "bf16" if config.bf16 else "fp16" if config.fp16 else "fp32",
        "optimizer": optimizer,
        "optimizer_impl": impl,
        "optimizer_in_backward": False,
        "micro_batch_size": config.micro_batch_size,
        "gradient_accumulation_steps": config.gradient_accumulation_steps,
        "seq_len": config.sequence_len,
        "gradient_checkpointing": config.gradient_checkpointing,
        "attention": {v: k for k, v in HF_ATTENTION.items()}[config.attn_implementation],
        "loss": None,
        "logits_fp32": None,
        "checkpoint_granularity": None,
        "adapter_dtype": None,
        "kv_cache_dtype": None,
        "kernels": _kernels(config),
        "double_quant": True
        if config.bnb_config_kwargs is not None and config.bnb_config_kwargs.bnb_4bit_use_double_quant
        else None,
    }
    return {**fields, **_sharding_back(config, files, gpus)}
