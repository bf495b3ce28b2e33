"""Hugging Face Trainer + PEFT + bitsandbytes: the arguments of the generated ``train.py`` and their reader.

The generated script loads the model (``dtype``, ``attn_implementation``, ``BitsAndBytesConfig``), wraps it
with ``get_peft_model(LoraConfig(...))`` and trains with ``Trainer(TrainingArguments(...))`` on packed
blocks of ``max_length`` tokens, so every micro-batch has the shape the estimate assumed. The same
values go to ``hf_args.json``, which the reader parses. The hf-trainer, accelerate and deepspeed formats
share these pieces (transformers >= 5.23, PEFT >= 0.13: services/export/versions.py).

Rules (the estimator's hf-trainer defaults are PEFT + Trainer defaults, services/estimator/recipe.py):

- precision: bf16 = bf16 weights + ``bf16=True``; bf16-mixed = fp32 weights + ``bf16=True``; fp16 and
  fp16-mixed alike with ``fp16``; fp32 = fp32 weights, no autocast. Full fine-tuning in pure fp16 is
  refused without DeepSpeed: the Trainer's GradScaler refuses fp16 gradients.
- optimizer: adamw -> adamw_torch (foreach) or adamw_torch_fused (fused); adamw-8bit -> adamw_bnb_8bit;
  paged-adamw -> paged_adamw_32bit; paged-adamw-8bit -> paged_adamw_8bit; adafactor -> adafactor.
  sgd is refused: the Trainer's "sgd" has no momentum, the plan's keeps a momentum buffer. The optimizer
  in backward and the for-loop AdamW have no Trainer form.
- NF4 is bitsandbytes with ``bnb_4bit_use_double_quant`` as the plan resolves it (``double_quant``; the
  Trainer's default is off, the estimate's 0.5 + 4/64 bytes per weight); with FSDP or ZeRO-3 the 4-bit
  weights are stored in the compute dtype so they can be sharded. int8 weights cannot be sharded
  (FSDP, ZeRO-3): refused.
- kernels: 'liger' is ``use_liger_kernel=True`` (Liger's norms, SwiGLU, RoPE and fused linear cross-entropy,
  so the loss is 'fused'); 'none' is ``use_liger_kernel=False``; 'transformer-engine' has no Trainer switch
  and is refused. A loss 'fused' without kernels resolves to Liger (services/estimator/recipe.py).
- The loss, fp32 logits, checkpoint granularity and adapter dtype have no Trainer switch: a plan value
  other than the default (as memory) is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from services.estimator.architecture import Architecture
from services.estimator.plan import Attention, Optimizer, OptimizerImpl, Precision
from services.export.dataset import ALPACA_PROMPT, ALPACA_PROMPT_WITH_INPUT, DataFormat
from services.export.errors import ExportError
from services.export.names import hf_target_modules, lora_notes, lora_settings, roles_from_hf
from services.export.policy import WARMUP_RATIO, policy
from services.export.render import comment_block, load_json, one_line, validated
from services.export.resume import DEFAULT_CHECKPOINT_DIR, RESUME_FILE
from services.export.target import Target, require_default

ARGS_FILE = "hf_args.json"
SCRIPT_FILE = "train.py"
VALIDATION_FILE = "validation.jsonl"
DS_FILE = "ds_config.json"
ZERO_STAGES = {"zero1": 1, "zero2": 2, "zero3": 3}

HfOptim = Literal[
    "adamw_torch", "adamw_torch_fused", "adamw_bnb_8bit", "paged_adamw_32bit", "paged_adamw_8bit", "adafactor"
]
_OPTIM: dict[Optimizer, HfOptim] = {
    "adamw-8bit": "adamw_bnb_8bit",
    "paged-adamw": "paged_adamw_32bit",
    "paged-adamw-8bit": "paged_adamw_8bit",
    "adafactor": "adafactor",
}
_ADAMW: dict[OptimizerImpl, HfOptim] = {"foreach": "adamw_torch", "fused": "adamw_torch_fused"}
_OPTIM_BACK: dict[HfOptim, tuple[Optimizer, OptimizerImpl | None]] = {
    "adamw_torch": ("adamw", "foreach"),
    "adamw_torch_fused": ("adamw", "fused"),
    **{name: (opt, None) for opt, name in _OPTIM.items()},
}

Dtype = Literal["bfloat16", "float16", "float32"]
HfAttention = Literal["sdpa", "flash_attention_2", "eager"]
HF_ATTENTION: dict[Attention, HfAttention] = {"sdpa": "sdpa", "flash": "flash_attention_2", "eager": "eager"}
# (weights dtype, bf16 autocast, fp16 autocast) per plan precision.
_PRECISION: dict[Precision, tuple[Dtype, bool, bool]] = {
    "bf16": ("bfloat16", True, False),
    "bf16-mixed": ("float32", True, False),
    "fp16": ("float16", False, True),
    "fp16-mixed": ("float32", False, True),
    "fp32": ("float32", False, False),
}
_PRECISION_BACK: dict[tuple[str, bool, bool], Precision] = {flags: p for p, flags in _PRECISION.items()}


def option_back(name: HfOptim) -> tuple[Optimizer, OptimizerImpl | None]:
    """(plan optimizer, implementation) of a Trainer ``optim`` name."""
    return _OPTIM_BACK[name]


def precision_flags(precision: Precision) -> tuple[Dtype, bool, bool]:
    """(weights dtype, bf16, fp16) of a plan precision."""
    return _PRECISION[precision]


def compute_dtype(precision: Precision) -> Dtype:
    return "bfloat16" if precision.startswith("bf16") else "float16" if precision.startswith("fp16") else "float32"


def check_trainer_plan(target: Target) -> None:
    """Refuse what the Trainer cannot run with the estimated memory (shared by every Trainer-based format)."""
    plan = target.plan
    if plan.optimizer_in_backward:
        raise ExportError(
            "optimizer_in_backward",
            "the Trainer steps the optimizer after the whole backward pass; torchtune's full recipes can "
            "(optimizer_in_bwd); set it to false or export to torchtune",
        )
    zero = plan.sharding in ZERO_STAGES
    if plan.method == "full" and plan.precision == "fp16" and not zero:
        raise ExportError(
            "precision",
            "full fine-tuning of fp16 weights under the Trainer's fp16 GradScaler fails (it refuses to unscale fp16 "
            "gradients); allowed here: bf16, bf16-mixed, fp16-mixed, fp32, or fp16 with DeepSpeed ZeRO",
        )
    if zero and plan.precision.endswith("-mixed"):
        raise ExportError(
            "precision",
            f"{plan.precision!r}: DeepSpeed casts the model to 16-bit and keeps the fp32 master copy in the "
            "optimizer, which is precision 'bf16'/'fp16' with ZeRO (the estimate counts the master copy); "
            "allowed with ZeRO: bf16, fp16, fp32",
        )
    if plan.quantized == "int8" and plan.sharding in ("zero3", "fsdp"):
        raise ExportError(
            "quantization",
            "int8 (LLM.int8) weights cannot be sharded by FSDP or ZeRO-3; use nf4, or sharding none/zero1/zero2",
        )
    if zero and plan.cpu_offload and plan.optimizer != "adamw":
        raise ExportError(
            "optimizer",
            f"{plan.optimizer!r}: ZeRO-Offload steps on the CPU with DeepSpeed's CPU Adam; only 'adamw' is offloaded",
        )
    check_trainer_kernels(target)
    require_default(target, "logits_fp32", "the Trainer's causal-LM loss always upcasts the logits to fp32")
    require_default(target, "checkpoint_granularity", "the Trainer's gradient checkpointing saves whole blocks")
    require_default(target, "adapter_dtype", "PEFT keeps the adapters in fp32 over a 16-bit base model")
    require_default(target, "compile", "the generated script does not compile the model (torch_compile)")
    require_default(target, "activation_offloading", "the Trainer has no activation offloading")
    require_default(target, "nf4_quantization", "bitsandbytes quantizes NF4 with a CUDA kernel, not whole-tensor")
    if plan.padding == "longest":
        raise ExportError(
            "padding",
            "'longest': train.py packs the samples into rows of seq_len, so every batch has one shape; "
            "use 'packed' or leave it null",
        )


def uses_liger(target: Target) -> bool:
    """Whether the run patches in Liger's kernels (the plan's ``kernels``, or its fused loss on the Trainer)."""
    return target.recipe.kernels == "liger"


def check_trainer_kernels(target: Target) -> None:
    """Refuse kernels and losses a Trainer-based format cannot switch on (see the module rules)."""
    recipe = target.recipe
    if recipe.kernels == "transformer-engine":
        raise ExportError(
            "kernels",
            "'transformer-engine': the Trainer has no switch for Transformer Engine's fused norm + linear modules; "
            "allowed here: 'liger' or 'none'",
        )
    if recipe.kernels == "liger":
        if recipe.loss != "fused":
            raise ExportError(
                "loss",
                f"{recipe.loss!r}: Liger's kernels (use_liger_kernel) replace the loss with its fused linear "
                "cross-entropy; leave loss null or 'fused'",
            )
        return
    require_default(target, "loss", "the Trainer computes the standard cross-entropy")


def hf_optim(target: Target) -> HfOptim:
    """The Trainer's ``optim`` name for the plan's optimizer (see the module rules)."""
    plan = target.plan
    if plan.optimizer == "sgd":
        raise ExportError(
            "optimizer",
            "'sgd': the Trainer's sgd is torch.optim.SGD without momentum, while the estimate keeps a momentum buffer "
            "per parameter; allowed: adamw, adamw-8bit, paged-adamw, paged-adamw-8bit, adafactor (or torchtune)",
        )
    if plan.optimizer == "adamw":
        impl = target.recipe.optimizer_impl
        if impl == "for-loop":
            raise ExportError(
                "optimizer_impl",
                "'for-loop': the Trainer's AdamW is adamw_torch (foreach) or adamw_torch_fused; allowed: foreach/fused",
            )
        return _ADAMW[impl]
    require_default(target, "optimizer_impl", f"the Trainer's {_OPTIM[plan.optimizer]} has a single implementation")
    return _OPTIM[plan.optimizer]


def quantization_config(target: Target) -> dict[str, Any] | None:
    """``BitsAndBytesConfig`` arguments, or None for an unquantized base."""
    plan = target.plan
    if plan.quantized is None:
        return None
    if plan.quantized == "int8":
        return {"load_in_8bit": True}
    dtype = compute_dtype(plan.precision)
    config: dict[str, Any] = {
        "load_in_4bit": True,
        "bnb_4bit_quant_type": "nf4",
        "bnb_4bit_compute_dtype": dtype,
        # Nested quantization of the block constants, as the estimate resolved it (plan.double_quant).
        "bnb_4bit_use_double_quant": target.recipe.nf4_double_quant,
    }
    if plan.sharding in ("zero3", "fsdp"):
        # FSDP / ZeRO-3 shard tensors of one dtype: store the packed 4-bit weights as the compute dtype.
        config["bnb_4bit_quant_storage"] = dtype
    return config


def lora_config(target: Target) -> dict[str, Any] | None:
    """PEFT ``LoraConfig`` arguments, or None for full fine-tuning."""
    if target.plan.method == "full":
        return None
    lora = lora_settings(target.plan, target.recipe)
    return {
        "r": lora.rank,
        "lora_alpha": lora.alpha,
        "lora_dropout": lora.dropout,
        "target_modules": hf_target_modules(lora.targets, target.arch),
        "bias": "none",
        "task_type": "CAUSAL_LM",
    }


def training_args(target: Target, accumulation: int, sharding_args: Mapping[str, Any]) -> dict[str, Any]:
    """``TrainingArguments``: batch split, precision, checkpointing, optimizer, save/eval steps, sharding."""
    plan = target.plan
    _, bf16, fp16 = precision_flags(plan.precision)
    rules = policy(plan, accumulation)
    args: dict[str, Any] = {
        # The default checkpoint folder; train.py takes $GPUPLAN_CHECKPOINT_DIR first (services/export/resume.py).
        "output_dir": DEFAULT_CHECKPOINT_DIR,
        "per_device_train_batch_size": plan.micro_batch_size,
        # Evaluation at the training micro-batch keeps it inside the memory the setup was sized for.
        "per_device_eval_batch_size": plan.micro_batch_size,
        "gradient_accumulation_steps": accumulation,
        "num_train_epochs": plan.data.epochs if plan.data is not None else 1.0,
        "learning_rate": rules.learning_rate,
        "lr_scheduler_type": "cosine",
        # An integer is steps; a float below 1 is the Trainer's ratio of all steps.
        "warmup_steps": rules.warmup_steps if rules.warmup_steps is not None else WARMUP_RATIO,
        "weight_decay": rules.weight_decay,
        "max_grad_norm": rules.max_grad_norm,
        "bf16": bf16,
        "fp16": fp16,
        # transformers >= 5.23 names it activation_checkpointing (gradient_checkpointing is a deprecated alias).
        "activation_checkpointing": plan.gradient_checkpointing,
        "optim": hf_optim(target),
        # TrainingArguments.use_liger_kernel (transformers >= 4.45) patches Liger's kernels into the model.
        "use_liger_kernel": uses_liger(target),
        "logging_steps": 10,
        "report_to": "none",
    }
    if plan.gradient_checkpointing:
        # Non-reentrant checkpointing needs no input gradients, so frozen (PEFT) embeddings work as they are.
        args["activation_checkpointing_kwargs"] = {"use_reentrant": False}
    if target.save_steps is not None:
        args.update(
            save_strategy="steps",
            save_steps=target.save_steps,
            eval_strategy="steps",
            eval_steps=target.save_steps,
            # Keep only the loss in evaluation: gathered logits (batch x seq x vocab per step) would pile up.
            prediction_loss_only=True,
        )
    args.update(sharding_args)
    return args


def trainer_sharding_args(target: Target) -> dict[str, Any]:
    """The Trainer's own sharding arguments: ``fsdp`` + ``fsdp_config`` (FSDP2) or ``deepspeed``."""
    plan = target.plan
    if plan.sharding == "fsdp":
        return {"fsdp": True, "fsdp_config": fsdp_config(plan.cpu_offload)}
    if plan.sharding in ZERO_STAGES:
        return {"deepspeed": DS_FILE}
    return {}


def fsdp_config(cpu_offload: bool) -> dict[str, Any]:
    """FSDP2 full shard wrapping each transformer block (the model's ``_no_split_modules``)."""
    return {
        "version": 2,
        "reshard_after_forward": True,
        "cpu_offload": cpu_offload,
        "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "cpu_ram_efficient_loading": True,
        "state_dict_type": "SHARDED_STATE_DICT",
    }


def hf_sections(target: Target, accumulation: int, sharding_args: Mapping[str, Any]) -> dict[str, Any]:
    """Every argument of the generated script, by the call it goes to (the content of hf_args.json)."""
    plan = target.plan
    dtype, _, _ = precision_flags(plan.precision)
    attention = target.recipe.attention
    return {
        "model": {
            "pretrained_model_name_or_path": target.model_id,
            "dtype": dtype,
            "attn_implementation": HF_ATTENTION[attention],
        },
        "quantization_config": quantization_config(target),
        "lora_config": lora_config(target),
        # TRL's SFTConfig names: max_length (TRL renamed max_seq_length to max_length) and packing.
        "data": {"max_length": plan.seq_len, "packing": True},
        "training_args": training_args(target, accumulation, sharding_args),
    }


def trainer_notes(target: Target) -> list[str]:
    plan = target.plan
    notes = [
        "train.py reads train.jsonl and packs the rows into blocks of max_length tokens, the "
        "micro-batch shape the estimate assumed",
        "train.py saves to $GPUPLAN_CHECKPOINT_DIR (default outputs) and resumes from the newest complete "
        "checkpoint-N there (one with trainer_state.json)",
    ]
    if target.save_steps is not None and target.checkpoint_interval_s is not None:
        notes.append(
            f"checkpoints and evaluation every {target.save_steps} optimizer steps "
            f"(~{target.checkpoint_interval_s / 60:.0f} min); evaluation reads {VALIDATION_FILE} when it exists "
            "(without it evaluation is off)"
        )
    notes += lora_notes(plan, target.recipe)
    if plan.sharding == "fsdp" and plan.optimizer in ("adamw-8bit", "paged-adamw", "paged-adamw-8bit"):
        notes.append("bitsandbytes optimizers under FSDP are not supported by every bitsandbytes release; test first")
    return notes


# --------------------------------------------------------------------------------------------------
# The script


def _kwargs(values: Mapping[str, Any], indent: str) -> str:
    return "".join(f"{indent}{key}={value!r},\n" for key, value in values.items())


_ROLES = {
    "user": "user",
    "human": "user",
    "system": "system",
    "assistant": "assistant",
    "gpt": "assistant",
    "bot": "assistant",
    "model": "assistant",
}


def _segments_code(data: DataFormat) -> str:
    """``segments(row, tokenizer)``: the (text, trained) pieces of one row in the data format."""
    doc = '    """The (text, counts in the loss) pieces of one row."""\n'
    if data.kind == "text":
        return f"def segments(row, tokenizer):\n{doc}    return [(row['text'], True)]\n"
    if data.chat:
        return (
            f"ROLES = {_ROLES!r}\n\n\n"
            f"def segments(row, tokenizer):\n{doc}"
            "    if tokenizer.chat_template is None:\n"
            "        raise SystemExit('the tokenizer has no chat template: use the instruct model\\'s tokenizer '\n"
            "                         'or set tokenizer.chat_template before training on chat rows')\n"
            f"    turns = [{{'role': ROLES[m[{data.role_key!r}].lower()], 'content': m[{data.content_key!r}]}} "
            f"for m in row[{data.messages_field!r}]]\n"
            "    render = tokenizer.apply_chat_template\n"
            "    pieces, done = [], ''\n"
            "    for i, turn in enumerate(turns):\n"
            "        if turn['role'] != 'assistant':\n"
            "            continue\n"
            "        prompt = render(turns[:i], tokenize=False, add_generation_prompt=True) if i else ''\n"
            "        text = render(turns[: i + 1], tokenize=False)\n"
            "        if not (prompt.startswith(done) and text.startswith(prompt)):\n"
            "            raise SystemExit('the chat template does not render turns as prefixes: cannot mask prompts')\n"
            "        pieces += [(prompt[len(done):], False), (text[len(prompt):], True)]\n"
            "        done = text\n"
            "    rest = render(turns, tokenize=False)[len(done):]\n"
            "    return pieces + ([(rest, False)] if rest else [])\n"
        )
    instruction, extra, answer = data.instruction_fields
    if data.kind == "prompt_completion":
        return f"def segments(row, tokenizer):\n{doc}    return [(row['prompt'], False), (row['completion'], True)]\n"
    return (
        f"PROMPT_WITH_INPUT = {ALPACA_PROMPT_WITH_INPUT!r}\n"
        f"PROMPT = {ALPACA_PROMPT!r}\n\n\n"
        f"def segments(row, tokenizer):\n{doc}"
        f"    extra = row.get({extra!r}) or ''\n"
        "    if extra:\n"
        f"        prompt = PROMPT_WITH_INPUT.format(instruction=row[{instruction!r}], input=extra)\n"
        "    else:\n"
        f"        prompt = PROMPT.format(instruction=row[{instruction!r}])\n"
        f"    return [(prompt, False), (row[{answer!r}], True)]\n"
    )


def train_script(header: list[str], sections: Mapping[str, Any], data: DataFormat) -> str:
    """``train.py``: the Trainer run with the arguments of ``sections`` written out as literals."""
    model = sections["model"]
    quant = sections["quantization_config"]
    lora = sections["lora_config"]
    args = sections["training_args"]
    seq = sections["data"]["max_length"]
    evaluates = args.get("eval_strategy", "no") != "no"
    imports = [
        "AutoModelForCausalLM",
        "AutoTokenizer",
        "HfArgumentParser",
        "Trainer",
        "TrainingArguments",
        "default_data_collator",
    ]
    if quant is not None:
        imports.insert(2, "BitsAndBytesConfig")
    out = comment_block(header)
    name = model["pretrained_model_name_or_path"]
    # The name in a comment line, not the docstring: a name with three quotes would end it (a probe of the exports).
    out += f"# Fine-tune {one_line(name)} with the Hugging Face Trainer (the values of {ARGS_FILE}).\n"
    out += f'"""Fine-tune the model above with the Hugging Face Trainer (the values of {ARGS_FILE})."""\n\n'
    out += "from check_versions import check_versions\n\ncheck_versions()  # before the libraries load\n\n"
    out += "import os  # noqa: E402\nimport sys  # noqa: E402\nfrom itertools import chain  # noqa: E402\n\n"
    out += "from datasets import load_dataset  # noqa: E402\n"
    if lora is not None:
        out += "from peft import LoraConfig, get_peft_model  # noqa: E402\n"
    out += f"from transformers import {', '.join(imports)}  # noqa: E402\n"
    out += f"from {RESUME_FILE.removesuffix('.py')} import checkpoint_dir, last_hf_checkpoint  # noqa: E402\n\n"
    out += f"MAX_SEQ_LENGTH = {seq!r}\n"
    out += f"# {one_line(data.describe())}.\n"
    out += 'TRAIN_FILE = "train.jsonl"\n'
    out += f"# Optional: {VALIDATION_FILE} beside it is evaluated every eval_steps; without it evaluation is off.\n"
    out += f"VALIDATION_FILE = {VALIDATION_FILE!r}\n"
    out += f"ADD_SPECIAL_TOKENS = {not data.chat!r}  # a chat template writes its own begin-of-text token\n\n\n"
    out += _segments_code(data) + "\n\n"
    out += (
        "def encode(row, tokenizer):\n"
        '    """Token ids of one row, and labels that are -100 where the loss does not count."""\n'
        "    ids, labels = [], []\n"
        "    for text, trained in segments(row, tokenizer):\n"
        "        piece = tokenizer(text, add_special_tokens=ADD_SPECIAL_TOKENS and not ids)['input_ids']\n"
        "        ids += piece\n"
        "        labels += piece if trained else [-100] * len(piece)\n"
        "    ids.append(tokenizer.eos_token_id)\n"
        "    labels.append(tokenizer.eos_token_id)\n"
        '    return {"input_ids": ids, "labels": labels}\n\n\n'
        "def pack(batch):\n"
        '    """Concatenate the rows and cut MAX_SEQ_LENGTH blocks: micro-batch x MAX_SEQ_LENGTH tokens."""\n'
        '    ids = list(chain.from_iterable(batch["input_ids"]))\n'
        '    labels = list(chain.from_iterable(batch["labels"]))\n'
        "    usable = len(ids) // MAX_SEQ_LENGTH * MAX_SEQ_LENGTH\n"
        "    starts = range(0, usable, MAX_SEQ_LENGTH)\n"
        "    return {\n"
        '        "input_ids": [ids[i : i + MAX_SEQ_LENGTH] for i in starts],\n'
        '        "attention_mask": [[1] * MAX_SEQ_LENGTH for _ in starts],\n'
        '        "labels": [labels[i : i + MAX_SEQ_LENGTH] for i in starts],\n'
        "    }\n\n\n"
        "def main():\n"
    )
    # TrainingArguments first: under ZeRO-3 it makes from_pretrained load the weights already partitioned.
    # The values of hf_args.json are the defaults; TrainingArguments flags on the command line override them
    # (python train.py --max_steps 10). output_dir is the run's checkpoint folder (resume.py).
    values = {key: value for key, value in args.items() if key != "output_dir"}
    out += (
        "    parser = HfArgumentParser(TrainingArguments)\n"
        "    parser.set_defaults(\n"
        "        output_dir=checkpoint_dir(),\n"
        f"{_kwargs(values, '        ')}    )\n"
        '    data_files = {"train": TRAIN_FILE}\n'
        "    if os.path.exists(VALIDATION_FILE):\n"
        '        data_files["validation"] = VALIDATION_FILE\n'
    )
    if evaluates:
        # The Trainer refuses eval steps without eval data.
        out += "    else:\n        parser.set_defaults(eval_strategy='no')\n"
    out += (
        "    (args,) = parser.parse_args_into_dataclasses()\n"
        "    # The newest checkpoint-N with trainer_state.json (written last): a save cut short is skipped.\n"
        "    resume = last_hf_checkpoint(args.output_dir)\n"
        '    if int(os.environ.get("RANK", "0")) == 0:\n'
        "        where = f'resuming from {resume}' if resume else 'no complete checkpoint: training from the start'\n"
        "        print(f'train.py: checkpoints in {args.output_dir}; {where}', file=sys.stderr, flush=True)\n"
    )
    model_kwargs = dict(model)
    if quant is not None:
        out += f"    quantization_config = BitsAndBytesConfig(\n{_kwargs(quant, '        ')}    )\n"
    out += f"    model = AutoModelForCausalLM.from_pretrained(\n{_kwargs(model_kwargs, '        ')}"
    if quant is not None:
        out += "        quantization_config=quantization_config,\n"
    out += "    )\n"
    if lora is not None:
        out += f"    model = get_peft_model(model, LoraConfig(\n{_kwargs(lora, '        ')}    ))\n"
    out += (
        f"    tokenizer = AutoTokenizer.from_pretrained({name!r})\n"
        '    raw = load_dataset("json", data_files=data_files)\n'
        '    columns = raw["train"].column_names\n'
        "    tokenized = raw.map(lambda row: encode(row, tokenizer), remove_columns=columns)\n"
        '    data = tokenized.map(pack, batched=True, remove_columns=tokenized["train"].column_names)\n'
        "    trainer = Trainer(\n"
        "        model=model,\n"
        "        args=args,\n"
        '        train_dataset=data["train"],\n'
        '        eval_dataset=data.get("validation"),\n'
        "        data_collator=default_data_collator,\n"
        "    )\n"
        "    trainer.train(resume_from_checkpoint=resume)\n\n\n"
        'if __name__ == "__main__":\n'
        "    main()\n"
    )
    return out


# --------------------------------------------------------------------------------------------------
# Reading hf_args.json back


class _Section(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)


class ModelArgs(_Section):
    pretrained_model_name_or_path: str
    dtype: Dtype
    attn_implementation: HfAttention


class QuantArgs(_Section):
    load_in_4bit: bool = False
    load_in_8bit: bool = False
    bnb_4bit_quant_type: Literal["nf4"] = "nf4"
    bnb_4bit_use_double_quant: bool = False


class LoraArgs(_Section):
    r: int
    lora_alpha: int
    lora_dropout: float
    target_modules: str | list[str]


class DataArgs(_Section):
    max_length: int
    packing: Literal[True]


class TrainingArgs(_Section):
    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    bf16: bool = False
    fp16: bool = False
    activation_checkpointing: bool = False
    optim: HfOptim
    use_liger_kernel: bool = False
    fsdp: bool = False
    fsdp_config: dict[str, Any] | None = None
    deepspeed: str | None = None


class HfArgs(_Section):
    model: ModelArgs
    quantization_config: QuantArgs | None = None
    lora_config: LoraArgs | None = None
    data: DataArgs
    training_args: TrainingArgs


def read_hf_args(files: Mapping[str, str]) -> HfArgs:
    return validated(HfArgs, load_json(files, ARGS_FILE), ARGS_FILE)


def precision_of(dtype: str, bf16: bool, fp16: bool, where: str) -> Precision:
    found = _PRECISION_BACK.get((dtype, bf16, fp16))
    if found is None:
        raise ExportError(where, f"dtype {dtype} with bf16={bf16}, fp16={fp16} is no plan precision")
    return found


def plan_fields(args: HfArgs, arch: Architecture) -> dict[str, Any]:
    """The plan fields hf_args.json carries (not GPUs and sharding, which the launcher and configs carry)."""
    t = args.training_args
    optimizer, impl = option_back(t.optim)
    quant = args.quantization_config
    quantization = None
    if quant is not None:
        if quant.load_in_4bit == quant.load_in_8bit:
            raise ExportError(f"{ARGS_FILE}:quantization_config", "set exactly one of load_in_4bit, load_in_8bit")
        quantization = "nf4" if quant.load_in_4bit else "int8"
    fields: dict[str, Any] = {
        "framework": "hf-trainer",
        "mode": "train",
        "method": "full" if args.lora_config is None else "lora" if quantization is None else "qlora",
        "quantization": quantization,
        "lora": None,
        "precision": precision_of(args.model.dtype, t.bf16, t.fp16, f"{ARGS_FILE}:model.dtype"),
        "optimizer": optimizer,
        "optimizer_impl": impl,
        "optimizer_in_backward": False,
        "micro_batch_size": t.per_device_train_batch_size,
        "gradient_accumulation_steps": t.gradient_accumulation_steps,
        "seq_len": args.data.max_length,
        "gradient_checkpointing": t.activation_checkpointing,
        "attention": {v: k for k, v in HF_ATTENTION.items()}[args.model.attn_implementation],
        "loss": None,
        "logits_fp32": None,
        "checkpoint_granularity": None,
        "adapter_dtype": None,
        "kv_cache_dtype": None,
        "kernels": "liger" if t.use_liger_kernel else None,
        "double_quant": True if quant is not None and quant.bnb_4bit_use_double_quant else None,
    }
    if args.lora_config is not None:
        lora = args.lora_config
        fields["lora"] = {
            "rank": lora.r,
            "alpha": lora.lora_alpha,
            "dropout": lora.lora_dropout,
            "targets": roles_from_hf(lora.target_modules, arch, f"{ARGS_FILE}:lora_config.target_modules"),
        }
    return fields


def trainer_sharding(args: TrainingArgs) -> tuple[str, bool] | None:
    """(sharding, cpu_offload) from the Trainer's own fsdp argument, or None when it has none."""
    if not args.fsdp:
        return None
    config = args.fsdp_config or {}
    if config.get("version") != 2 or config.get("reshard_after_forward") is not True:
        raise ExportError(f"{ARGS_FILE}:training_args.fsdp_config", "expected FSDP2 full shard (version 2, resharded)")
    return "fsdp", bool(config.get("cpu_offload", False))
