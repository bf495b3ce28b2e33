"""The training-plan schema shared by the API, the CLI, the estimator and the benchmark cases.

The base fields are exactly those of ``shared/benchmarks/README.md``; everything added here is optional
and defaults to "what the chosen framework does", so every published case stays a valid plan.
"""

from __future__ import annotations

import itertools
import operator
import re
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

from services.core.json_limits import JsonInputError, check_value
from services.core.request_models import ClosedModel, SingleLine
from services.estimator.versions import RELEASES, parse_framework_version

Method = Literal["full", "lora", "qlora"]
Framework = Literal["hf-trainer", "torchtune", "litgpt", "torchtitan", "axolotl", "unsloth", "pytorch"]
Precision = Literal["bf16", "fp16", "bf16-mixed", "fp16-mixed", "fp32"]
# The format of the base weights. Training over a quantized base (QLoRA) takes nf4 or int8; a served model
# may also be fp8, or 4-bit with group-wise scales as AWQ and GPTQ checkpoints store it.
Quantization = Literal["nf4", "int8", "fp8", "awq", "gptq"]
TRAINING_QUANTIZATIONS: tuple[Quantization, ...] = ("nf4", "int8")
KvCacheDtype = Literal["bf16", "fp16", "fp32", "fp8"]
# Precisions a model is served in: the "-mixed" ones are training recipes (fp32 master weights under autocast).
SERVING_PRECISIONS: tuple[Precision, ...] = ("bf16", "fp16", "fp32")
Optimizer = Literal["adamw", "adamw-8bit", "paged-adamw", "paged-adamw-8bit", "adafactor", "sgd"]
Sharding = Literal["none", "zero1", "zero2", "zero3", "fsdp"]
LoraRole = Literal["q", "k", "v", "o", "gate", "up", "down", "lm_head"]
Mode = Literal["train", "inference"]
Attention = Literal["sdpa", "flash", "eager"]
Loss = Literal["standard", "chunked", "fused"]
OptimizerImpl = Literal["foreach", "fused", "for-loop"]
CheckpointGranularity = Literal["block", "selective"]
AdapterDtype = Literal["fp32", "bf16", "fp16"]
Padding = Literal["packed", "max-length", "longest"]
# Fused training kernels patched into the model: Liger (linkedin/Liger-Kernel), Unsloth's Triton kernels (only
# through Unsloth), NVIDIA Transformer Engine's fused norm + linear modules.
Kernels = Literal["none", "liger", "unsloth", "transformer-engine"]

ALL_LINEAR_ROLES: tuple[LoraRole, ...] = ("q", "k", "v", "o", "gate", "up", "down")


# The largest samples per optimizer step a plan may ask for (micro-batch x accumulation x GPUs): 2**20.
# Real runs: DeepSeek-V3 15,360 sequences; PaLM 540B up to 4,096; Llama 3.1 405B 2,048 (16M tokens of
# 8,192). The planner enumerates the divisors of this number, so it bounds the planner's work too.
MAX_EFFECTIVE_BATCH_SIZE = 2**20
# The longest example a data set may hold, in tokens (2**22: 32x the longest context windows of published models,
# 128k tokens), and so the most its mean can be.
MAX_EXAMPLE_TOKENS = 4_194_304
# The model name is stored in a 200-character column; HF ids are at most 96 characters (owner/name).
MAX_MODEL_NAME_CHARS = 200


class _Strict(ClosedModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class GenericModel(_Strict):
    """A model known only by its size (SEEDS.md section 3): no architecture, so a coarser estimate."""

    # 10^14 parameters: about 60x the largest published (Switch-C, 1.6 T).
    parameters: StrictInt = Field(gt=0, le=10**14, description="total parameter count")
    dtype: Literal["fp32", "bf16", "fp16", "int8", "int4"] = "bf16"
    activation_bytes_per_sample: StrictInt = Field(
        default=0, ge=0, le=2**50, description="activation memory of one training sample, in bytes"
    )
    safety_margin: StrictFloat = Field(
        default=0.2, ge=0.1, le=0.3, description="fraction added against out-of-memory (10-30%)"
    )


# Characters that end or break a line of text (C0, DEL, C1, the Unicode line and paragraph separators): what a model
# name may not hold, and what the exports keep out of a comment line (services.export.render.one_line).
CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


class ModelSpec(_Strict):
    """Which model: an HF id from the bundled catalog, an HF config.json, or a generic size."""

    name: str | None = Field(default=None, min_length=1, max_length=200)
    config: dict[str, Any] | None = None
    generic: GenericModel | None = None

    @field_validator("name")
    @classmethod
    def _one_line(cls, value: str | None) -> str | None:
        # A name is one line of text: exports write it into launch.sh and train.py, where a line break in it
        # became a command of its own (a probe of the exports).
        if value is not None and CONTROL_CHARACTERS.search(value):
            raise ValueError(f"control characters (line breaks, tabs) are not part of a model name: {value[:40]!r}")
        return value

    @field_validator("config", mode="before")
    @classmethod
    def _plain_json(cls, value: Any) -> Any:
        """A config.json is plain JSON: bounded depth, finite numbers, text a database can store, and a
        ``_name_or_path`` that fits the model name column."""
        if isinstance(value, dict):
            try:
                check_value(value)
            except JsonInputError as exc:
                raise ValueError(f"{exc.field}: {exc.message}") from None
            name = value.get("_name_or_path")
            if name is not None and (not isinstance(name, str) or len(name) > MAX_MODEL_NAME_CHARS):
                raise ValueError(
                    f"_name_or_path: must be text of at most {MAX_MODEL_NAME_CHARS} characters "
                    f"(an HF model id), got {str(name)[:60]!r}..."
                )
        return value

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        if self.name is None and self.config is None and self.generic is None:
            raise ValueError("give the model's 'name' (an HF id), its 'config' (config.json) or 'generic'")
        if self.generic is not None and (self.name is not None or self.config is not None):
            # A generic size replaces the architecture: a name or config beside it would label an estimate it
            # does not size.
            raise ValueError("'generic' sizes a model known by its size alone: give it without 'name' or 'config'")
        return self


class LoraSpec(_Strict):
    rank: StrictInt = Field(ge=1, le=4096)
    alpha: StrictInt | None = Field(default=None, ge=1, le=65_536)  # usually 1-2x the rank
    # Each role at most once: the list is never longer than the roles there are (LoraRole's 8).
    targets: Annotated[list[LoraRole], Field(max_length=len(get_args(LoraRole)))] | Literal["all-linear"] = "all-linear"
    dropout: StrictFloat | None = Field(default=None, ge=0.0, lt=1.0, description="None: the framework default")

    @field_validator("targets")
    @classmethod
    def _each_role_once(cls, value: list[LoraRole] | str) -> list[LoraRole] | str:
        # A role twice is one adapter, which the estimate counted twice. (An empty list is allowed: a frozen base
        # with no adapter, how the accuracy cases model prompt, prefix and LayerNorm tuning.)
        if isinstance(value, list):
            twice = sorted({role for role in value if value.count(role) > 1})
            if twice:
                raise ValueError(f"each role once: {', '.join(twice)} given more than once")
        return value


LENGTH_PERCENTILE_FIELDS = (
    "p50_tokens_per_example",
    "p90_tokens_per_example",
    "p99_tokens_per_example",
    "max_tokens_per_example",
)
_length_percentile_values = operator.attrgetter(*LENGTH_PERCENTILE_FIELDS)  # as a tuple, read in C


def check_length_percentiles(given: list[tuple[str, int | None]]) -> None:
    """Length percentiles come all together or not at all, and never decrease (ValueError names the field)."""
    if all(v is None for _, v in given):
        return
    names = [name for name, _ in given]
    missing = [name for name, v in given if v is None]
    if missing:
        raise ValueError(f"{missing[0]}: give all of {', '.join(names)} or none")
    for (low_name, low), (high_name, high) in itertools.pairwise(given):
        if high is not None and low is not None and high < low:
            raise ValueError(f"{high_name}: {high} is below {low_name} {low}; percentiles cannot decrease")


class DataSpec(_Strict):
    """The data set: total tokens, or examples times their average length."""

    tokens: StrictInt | None = Field(default=None, gt=0, le=10**15)
    examples: StrictInt | None = Field(default=None, gt=0, le=10**12)
    # Every example has at least one token, and none more than the longest the length percentiles allow; a mean
    # below 1 (5e-324 was accepted) divided the padding's share of the row by zero.
    avg_tokens_per_example: StrictFloat | None = Field(default=None, ge=1, le=MAX_EXAMPLE_TOKENS)
    epochs: StrictFloat = Field(default=1.0, gt=0, le=1000)
    # The length distribution where it is known (a checked data set gives it): padding to the longest sample
    # of a micro-batch is then computed from it instead of from the mean alone.
    p50_tokens_per_example: StrictInt | None = Field(default=None, gt=0, le=MAX_EXAMPLE_TOKENS)
    p90_tokens_per_example: StrictInt | None = Field(default=None, gt=0, le=MAX_EXAMPLE_TOKENS)
    p99_tokens_per_example: StrictInt | None = Field(default=None, gt=0, le=MAX_EXAMPLE_TOKENS)
    max_tokens_per_example: StrictInt | None = Field(default=None, gt=0, le=MAX_EXAMPLE_TOKENS)

    @model_validator(mode="after")
    def _size_given(self) -> DataSpec:
        if self.tokens is None and (self.examples is None or self.avg_tokens_per_example is None):
            raise ValueError("give 'tokens', or 'examples' together with 'avg_tokens_per_example'")
        if self.tokens is not None and self.examples is not None:  # examples was ignored: the size came from tokens
            raise ValueError("examples: give 'tokens', or 'examples' with 'avg_tokens_per_example', not both")
        check_length_percentiles([(name, getattr(self, name)) for name in LENGTH_PERCENTILE_FIELDS])
        longest, mean = self.max_tokens_per_example, self.avg_tokens_per_example
        if longest is not None and mean is not None and mean > longest:
            raise ValueError(
                f"avg_tokens_per_example: {mean:g} is more than max_tokens_per_example ({longest}): no data set "
                "averages longer than its longest example"
            )
        total = self.total_tokens()
        if total < 1:  # 1e-300 epochs were accepted: a run of no token, priced as its start-up alone
            raise ValueError(
                f"epochs: {self.epochs:g} epochs of this data set is {total:.3g} tokens; a run trains at least one"
            )
        return self

    def length_percentiles(self) -> tuple[tuple[float, int], ...] | None:
        """((share of examples, tokens), ...) at the 50th, 90th, 99th percentile and the maximum, if given."""
        values = _length_percentile_values(self)
        if None in values:
            return None
        return tuple(zip((0.5, 0.9, 0.99, 1.0), values, strict=True))

    def total_tokens(self) -> float:
        per_epoch = self.tokens if self.tokens is not None else self.examples * self.avg_tokens_per_example  # type: ignore[operator]
        return float(per_epoch) * self.epochs


class Plan(_Strict):
    """One fine-tuning (or inference) run, per ``shared/benchmarks/README.md`` plus optional extensions."""

    model: ModelSpec
    method: Method = "full"
    framework: Framework = "hf-trainer"
    lora: LoraSpec | None = None
    precision: Precision = "bf16"
    quantization: Quantization | None = Field(
        default=None,
        description="the base weights' format: nf4 or int8 under method 'qlora'; inference also fp8, awq, gptq "
        "(None: the precision, or NF4 for QLoRA)",
    )
    optimizer: Optimizer = "adamw"
    optimizer_in_backward: StrictBool = False
    micro_batch_size: StrictInt = Field(
        default=1, ge=1, le=65536, description="samples per micro-batch; inference: concurrent sequences"
    )
    seq_len: StrictInt = Field(
        default=2048,
        ge=1,
        le=4_194_304,
        description="tokens per sample; inference: context length per sequence (prompt and generated tokens)",
    )
    gradient_checkpointing: StrictBool = False
    gpus: StrictInt = Field(default=1, ge=1, le=65536)
    sharding: Sharding = "none"
    cpu_offload: StrictBool = False

    # Extensions (all optional; None means "the framework's default").
    mode: Mode = "train"
    gradient_accumulation_steps: StrictInt | None = Field(default=None, ge=1, le=100_000)
    attention: Attention | None = None
    loss: Loss | None = None
    logits_fp32: StrictBool | None = None
    optimizer_impl: OptimizerImpl | None = None
    checkpoint_granularity: CheckpointGranularity | None = None
    adapter_dtype: AdapterDtype | None = None
    kv_cache_dtype: KvCacheDtype | None = Field(
        default=None,
        description="inference only: the dtype of the KV cache; None: the serving precision (fp32 for fp32)",
    )
    compile: StrictBool | None = Field(
        default=None,
        description="torch.compile of the transformer blocks (and of the loss where the framework compiles it): "
        "torchtune's 'compile', the Trainer's 'torch_compile'",
    )
    activation_offloading: StrictBool | None = Field(
        default=None,
        description="activations saved for backward are moved to host memory during the forward pass and "
        "brought back in backward (torchtune's 'enable_activation_offloading')",
    )
    nf4_quantization: Literal["chunked", "whole-tensor"] | None = Field(
        default=None,
        description="how the NF4 base is quantized while loading: 'chunked' (bitsandbytes, torchao 0.2 and "
        "later) or 'whole-tensor' (torchao 0.1, which compares every element with all 16 NF4 levels at once)",
    )
    double_quant: StrictBool | None = Field(
        default=None,
        description="nested quantization of an NF4 base's block constants (bitsandbytes bnb_4bit_use_double_quant: "
        "8-bit absmax with an fp32 scale per 256 blocks, 0.127 instead of 0.5 bits per weight); None: the "
        "framework's default (Unsloth and torchao's NF4: on; transformers' BitsAndBytesConfig: off)",
    )
    padding: Padding | None = Field(
        default=None,
        description="how training batches get their length: 'packed' (samples packed into rows of seq_len), "
        "'max-length' (every sample padded to seq_len) or 'longest' (each batch padded to its longest sample, or "
        "unpadded at batch 1, so batch shapes vary from step to step); None: the framework's default",
    )
    kernels: Kernels | None = Field(
        default=None,
        description="fused kernels patched into the model: 'liger' (Liger's RMSNorm, SwiGLU, RoPE and fused linear "
        "cross-entropy: the Trainer's use_liger_kernel), 'unsloth' (Unsloth's own, framework 'unsloth' only), "
        "'transformer-engine' (TE's fused norm + linear modules) or 'none'; None: the framework's default "
        "(unsloth: 'unsloth'; hf-trainer with loss 'fused': 'liger'; else 'none')",
    )
    framework_version: SingleLine | None = Field(
        default=None,
        min_length=1,
        max_length=40,
        description="the release of the framework the run uses (hf-trainer: transformers; pytorch: torch; else the "
        "framework's own package, e.g. unsloth '2025.3.19', torchtune '0.2.1'): the defaults that changed between "
        "releases follow it; None: the newest release known ("
        + ", ".join(f"{f} {r[2]}" for f, r in RELEASES.items())
        + ")",
    )
    data: DataSpec | None = None

    @field_validator("kernels")
    @classmethod
    def _kernels_of_the_framework(cls, value: Kernels | None, info: ValidationInfo) -> Kernels | None:
        # A field validator (framework is declared, so validated, before kernels) and not the model check
        # below: its error is located at kernels, the field to change, where a model check's has no location.
        framework = info.data.get("framework")
        if framework == "unsloth" and value not in (None, "unsloth"):
            raise ValueError("Unsloth always runs its own kernels; leave kernels unset or give 'unsloth'")
        if value == "unsloth" and framework is not None and framework != "unsloth":
            raise ValueError(f"Unsloth's kernels come only with framework 'unsloth', not {framework!r}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Plan:
        if self.framework_version is not None:
            parse_framework_version(self.framework, self.framework_version)
        if self.mode == "inference":
            _check_serving(self)
        elif self.quantization is not None and self.quantization not in TRAINING_QUANTIZATIONS:
            raise ValueError(
                f"quantization: {self.quantization!r} is a serving format (use mode 'inference'); training over "
                f"a quantized base takes one of {', '.join(TRAINING_QUANTIZATIONS)} with method 'qlora'"
            )
        elif self.kv_cache_dtype is not None:
            raise ValueError("kv_cache_dtype: only inference keeps a KV cache; use mode 'inference' or leave it unset")
        if self.method == "full" and self.quantization is not None and self.is_training:
            raise ValueError(
                "quantization: a quantized base cannot be fully fine-tuned; use method 'qlora' "
                "or set quantization to null"
            )
        if self.method == "full" and self.lora is not None:
            raise ValueError("lora: adapter settings need method 'lora' or 'qlora', not 'full'")
        if self.cpu_offload and self.sharding == "none":
            raise ValueError("cpu_offload: offloading needs sharding 'zero2', 'zero3' or 'fsdp'")
        if self.nf4_quantization is not None and self.quantized != "nf4":
            raise ValueError("nf4_quantization: only an NF4 base (method 'qlora', quantization 'nf4') is quantized")
        if self.double_quant is not None and self.quantized != "nf4":
            raise ValueError("double_quant: only an NF4 base (method 'qlora', quantization 'nf4') has nested constants")
        if self.activation_offloading and self.mode != "train":
            raise ValueError("activation_offloading: only a training step saves activations; use mode 'train'")
        effective = self.effective_batch_size
        if effective > MAX_EFFECTIVE_BATCH_SIZE:
            raise ValueError(
                f"micro_batch_size: micro_batch_size x gradient_accumulation_steps x gpus is {effective:,} samples "
                f"per optimizer step; at most {MAX_EFFECTIVE_BATCH_SIZE:,} (the largest real runs use ~15,000)"
            )
        return self

    @property
    def is_training(self) -> bool:
        return self.mode == "train"

    @property
    def effective_batch_size(self) -> int:
        """Samples per optimizer step as written: micro-batch x accumulation steps x GPUs."""
        return self.micro_batch_size * (self.gradient_accumulation_steps or 1) * self.gpus

    @property
    def quantized(self) -> Quantization | None:
        """The base-weight quantization; QLoRA without an explicit one means NF4. A served AWQ or GPTQ
        checkpoint (config.json quantization_config.quant_method) is loaded as stored, at whatever bits it
        gives (services.estimator.memory.quantization.groupwise_layout reads them)."""
        if self.quantization is not None:
            return self.quantization
        if self.mode == "inference":
            stored = (self.model.config or {}).get("quantization_config")
            if isinstance(stored, dict):
                method = stored.get("quant_method")
                if method == "awq":
                    return "awq"
                if method == "gptq":
                    return "gptq"
            return None
        return "nf4" if self.method == "qlora" else None

    @property
    def tokens_per_micro_batch(self) -> int:
        return self.micro_batch_size * self.seq_len


# Fields that describe how a model trains, with the value that means "not given": an inference plan that
# sets one is refused rather than silently sized as something it is not.
_TRAINING_ONLY: tuple[tuple[str, object], ...] = (
    ("lora", None),
    ("optimizer", "adamw"),
    ("optimizer_in_backward", False),
    ("gradient_checkpointing", False),
    ("gradient_accumulation_steps", None),
    ("cpu_offload", False),
    ("loss", None),
    ("optimizer_impl", None),
    ("checkpoint_granularity", None),
    ("adapter_dtype", None),
    ("padding", None),
    ("nf4_quantization", None),
    ("kernels", None),
    ("double_quant", None),
)


def _check_serving(plan: Plan) -> None:
    """An inference plan serves the model as stored in ``quantization`` (or ``precision``): it trains nothing,
    so it takes no training method and no training setting (ValueError names the field)."""
    if plan.method != "full":
        raise ValueError(
            f"method: inference trains nothing, so {plan.method!r} does not apply; leave method unset and give "
            "the served weights' format in 'quantization' (nf4, int8, fp8, awq, gptq) or none for the precision"
        )
    if plan.precision not in SERVING_PRECISIONS:
        raise ValueError(
            f"precision: {plan.precision!r} is a training recipe (fp32 weights under autocast); a model is served "
            f"in one of {', '.join(SERVING_PRECISIONS)}"
        )
    if plan.activation_offloading:
        raise ValueError("activation_offloading: only a training step saves activations; use mode 'train'")
    for name, unset in _TRAINING_ONLY:
        if getattr(plan, name) != unset:
            raise ValueError(f"{name}: a training setting; an inference plan leaves it unset (mode is 'inference')")
