"""`gpuplan estimate`: peak GPU memory, fit per card, tokens/s and cost of a plan."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any, get_args

from services.cli.common import CliError, Subparsers, examples, float_arg, int_arg, read_json, read_plan_file
from services.cli.render import render_estimate
from services.estimator.estimate import estimate
from services.estimator.plan import KvCacheDtype, Plan, Quantization
from services.estimator.validation import parse_plan

if TYPE_CHECKING:
    from services.hub.service import ResolvedModel

# Flags that set plan fields: (flag, plan key, argparse options).
PLAN_FLAGS: list[tuple[str, str, dict[str, Any]]] = [
    ("--method", "method", {"choices": ["full", "lora", "qlora"]}),
    (
        "--framework",
        "framework",
        {"choices": ["hf-trainer", "torchtune", "litgpt", "torchtitan", "axolotl", "unsloth", "pytorch"]},
    ),
    ("--precision", "precision", {"choices": ["bf16", "fp16", "bf16-mixed", "fp16-mixed", "fp32"]}),
    ("--quantization", "quantization", {"choices": list(get_args(Quantization))}),
    ("--kv-cache-dtype", "kv_cache_dtype", {"choices": list(get_args(KvCacheDtype))}),
    (
        "--optimizer",
        "optimizer",
        {"choices": ["adamw", "adamw-8bit", "paged-adamw", "paged-adamw-8bit", "adafactor", "sgd"]},
    ),
    ("--micro-batch-size", "micro_batch_size", {"type": int, "metavar": "N"}),
    ("--seq-len", "seq_len", {"type": int, "metavar": "TOKENS"}),
    # Inference: the KV cache holds concurrent sequences x context tokens (micro_batch_size x seq_len).
    (
        "--concurrent-sequences",
        "micro_batch_size",
        {"type": int, "metavar": "N", "help": "inference: sequences served at once (sets micro_batch_size)"},
    ),
    (
        "--context-len",
        "seq_len",
        {"type": int, "metavar": "TOKENS", "help": "inference: prompt + generated tokens per sequence (sets seq_len)"},
    ),
    ("--gpus", "gpus", {"type": int, "metavar": "N"}),
    ("--sharding", "sharding", {"choices": ["none", "zero1", "zero2", "zero3", "fsdp"]}),
    ("--grad-accum", "gradient_accumulation_steps", {"type": int, "metavar": "N"}),
    ("--mode", "mode", {"choices": ["train", "inference"]}),
    ("--attention", "attention", {"choices": ["sdpa", "flash", "eager"]}),
    ("--padding", "padding", {"choices": ["packed", "max-length", "longest"]}),
    ("--kernels", "kernels", {"choices": ["none", "liger", "unsloth", "transformer-engine"]}),
    (
        "--framework-version",
        "framework_version",
        {"metavar": "VERSION", "help": "the framework's release (transformers for hf-trainer), e.g. 2025.3.19"},
    ),
]


class _FieldFlag(argparse.Action):
    """Stores a plan field that several flags set (--seq-len and --context-len; --micro-batch-size,
    --concurrent-sequences and --batch): two of them with different values contradict each other, and the last one
    silently won. The same flag given twice keeps argparse's rule (the last one counts)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        given: dict[str, tuple[str | None, Any]] = vars(namespace).setdefault("field_flags", {})
        earlier = given.get(self.dest)
        if earlier is not None and earlier[0] != option_string and earlier[1] != values:
            parser.error(f"{option_string} {values} contradicts {earlier[0]} {earlier[1]}: both set {self.dest}")
        given[self.dest] = (option_string, values)
        setattr(namespace, self.dest, values)


def register(sub: Subparsers) -> None:
    est = sub.add_parser("estimate", help="peak GPU memory, fit per card, tokens/s and cost of a plan")
    examples(
        est,
        'gpuplan estimate --model meta-llama/Llama-3.1-8B --method qlora --seq-len 2048 --gpu "A100 80GB"',
        "gpuplan estimate --plan infra/examples/llama-3.1-8b-qlora.json --json",
        "gpuplan estimate --model meta-llama/Llama-3.1-70B --mode inference --quantization awq",
    )
    est.add_argument("--plan", metavar="FILE", help="plan JSON (the schema of benchmarks/README); flags override it")
    est.add_argument(
        "--model",
        metavar="HF_ID",
        help="a bundled model (see `gpuplan models`) or any Hugging Face id (owner/name), fetched once and cached",
    )
    est.add_argument("--config", metavar="FILE", help="the model's config.json, for models not in the catalog")
    est.add_argument("--gpu", metavar="NAME", help="GPU for tokens/s ('A100 80GB', 'h100', 'RTX 4090', ...)")
    est.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    for flag, key, options in PLAN_FLAGS:
        if options.get("type") is int:
            options = {**options, "type": int_arg(flag)}
        est.add_argument(flag, dest=key, action=_FieldFlag, **options)
    est.add_argument(
        "--batch", dest="micro_batch_size", action=_FieldFlag, type=int_arg("--batch"), help=argparse.SUPPRESS
    )
    est.add_argument("--lora-rank", type=int_arg("--lora-rank"), metavar="R")
    est.add_argument("--lora-alpha", type=int_arg("--lora-alpha"), metavar="A")
    est.add_argument("--lora-targets", metavar="ROLES", help="comma list of q,k,v,o,gate,up,down,lm_head or all-linear")
    est.add_argument("--gradient-checkpointing", dest="gradient_checkpointing", action="store_true", default=None)
    est.add_argument("--no-gradient-checkpointing", dest="gradient_checkpointing", action="store_false")
    est.add_argument("--cpu-offload", dest="cpu_offload", action="store_true", default=None)
    est.add_argument("--optimizer-in-backward", dest="optimizer_in_backward", action="store_true", default=None)
    est.add_argument("--double-quant", dest="double_quant", action="store_true", default=None)
    est.add_argument("--no-double-quant", dest="double_quant", action="store_false")
    est.add_argument("--dataset-tokens", type=int_arg("--dataset-tokens"), metavar="N", help="tokens per epoch")
    est.add_argument("--examples", type=int_arg("--examples"), metavar="N", help="examples per epoch")
    est.add_argument("--avg-tokens", type=float_arg("--avg-tokens"), metavar="N", help="average tokens per example")
    est.add_argument("--epochs", type=float_arg("--epochs"), metavar="N")
    est.set_defaults(handler=cmd_estimate)


def plan_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The plan the flags describe: --plan FILE first, then each flag overriding its field."""
    plan: dict[str, Any] = {}
    if args.plan:
        plan = read_plan_file(args.plan)
    if args.model or args.config:
        model: dict[str, Any] = {}
        if args.model:
            model["name"] = args.model
        if args.config:
            config = read_json(args.config, "--config")
            if not isinstance(config, dict):
                raise CliError(f"--config {args.config}: must hold a JSON object (a config.json)")
            model["config"] = config
        plan["model"] = model
    if "model" not in plan:
        raise CliError("no model: give --model HF_ID, --config FILE or --plan FILE")
    for _flag, key, _options in PLAN_FLAGS:
        value = getattr(args, key)
        if value is not None:
            plan[key] = value
    for key in ("gradient_checkpointing", "cpu_offload", "optimizer_in_backward", "double_quant"):
        if getattr(args, key) is not None:
            plan[key] = getattr(args, key)
    if args.lora_rank is not None or args.lora_alpha is not None or args.lora_targets is not None:
        lora = dict(plan.get("lora") or {})
        if args.lora_rank is not None:
            lora["rank"] = args.lora_rank
        lora.setdefault("rank", 16)
        if args.lora_alpha is not None:
            lora["alpha"] = args.lora_alpha
        if args.lora_targets is not None:
            targets = [t.strip() for t in args.lora_targets.split(",") if t.strip()]
            if not targets:
                raise CliError(
                    f"--lora-targets: no role given in {args.lora_targets!r}: name q,k,v,o,... or all-linear"
                )
            lora["targets"] = "all-linear" if targets == ["all-linear"] else targets
        plan["lora"] = lora
        plan.setdefault("method", "lora")
    if any(v is not None for v in (args.dataset_tokens, args.examples, args.avg_tokens, args.epochs)):
        data_spec = dict(plan.get("data") or {})
        for key, value in (
            ("tokens", args.dataset_tokens),
            ("examples", args.examples),
            ("avg_tokens_per_example", args.avg_tokens),
            ("epochs", args.epochs),
        ):
            if value is not None:
                data_spec[key] = value
        plan["data"] = data_spec
    return plan


def with_hub_model(plan: Plan) -> tuple[Plan, ResolvedModel | None]:
    """The plan with its named model's config.json filled in: the bundled catalog, else the disk cache
    (GPUPLAN_HUB_CACHE_DIR, default ~/.cache/gpuplan/hub), else the Hub (HF_TOKEN, HF_ENDPOINT), cached
    for the next run, which then works offline. Hub failures are one line naming model.name."""
    from services.core.errors import Unprocessable
    from services.hub.service import DiskCache, with_model_config

    try:
        return with_model_config(plan, DiskCache())
    except Unprocessable as exc:
        raise CliError(f"{exc.field or 'model.name'}: {exc.message}") from None


def cmd_estimate(args: argparse.Namespace) -> int:
    from services.cli.catalog import cli_offers

    plan, resolved = with_hub_model(parse_plan(plan_from_args(args)))
    result = estimate(plan, args.gpu, offers=cli_offers())
    if resolved is not None:
        from services.hub.service import checkpoint_note

        result = result.model_copy(update={"warnings": [*checkpoint_note(resolved), *result.warnings]})
    if args.json:
        print(json.dumps(result.model_dump(mode="json"), indent=2))
    else:
        print(render_estimate(result))
    return 0
