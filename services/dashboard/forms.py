"""The plan form: what the browser posts, turned into the API's plan request or into messages per
input (pure; the same PlanRequest schema and error wording as POST /v1/plans)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, get_args

from pydantic import ValidationError

from services.catalog.models import find_model
from services.core import json_limits
from services.dashboard.views import echo, readable
from services.estimator.errors import UnknownModelError
from services.estimator.plan import (
    MAX_EXAMPLE_TOKENS,
    SERVING_PRECISIONS,
    KvCacheDtype,
    Method,
    Precision,
    Quantization,
)
from services.estimator.validation import describe_errors
from services.hub.ids import is_hub_id
from services.plans.schemas import PlanRequest

METHODS: tuple[str, ...] = get_args(Method)
PRECISIONS: tuple[str, ...] = get_args(Precision)
# The inference form's own inputs: what the weights are served as ("" is the serving precision itself), the
# KV cache's dtype ("" likewise), and the shape of the load (never the training method or batch).
SERVING_WEIGHTS: tuple[str, ...] = ("", *get_args(Quantization))
SERVING_WEIGHT_LABELS = {
    "": "as the serving precision (16-bit)",
    "fp8": "fp8 (1 byte per weight)",
    "int8": "int8, LLM.int8 (1 byte + row scales)",
    "awq": "int4 AWQ (group 128)",
    "gptq": "int4 GPTQ (group 128)",
    "nf4": "int4 NF4, bitsandbytes (block 64)",
}
KV_CACHE_DTYPES: tuple[str, ...] = ("", *get_args(KvCacheDtype))
MAX_CONFIG_BYTES = 200_000

# The form's inputs, with their defaults (what an empty form shows).
DEFAULTS: dict[str, str] = {
    "mode": "train",
    "model_source": "catalog",
    "model": "meta-llama/Llama-3.1-8B",
    "config_json": "",
    "method": "qlora",
    "lora_rank": "16",
    "precision": "bf16",
    "micro_batch_size": "4",
    "seq_len": "2048",
    "gradient_checkpointing": "on",
    "examples": "10000",
    "avg_tokens": "512",
    "tokens": "",
    "epochs": "3",
    "budget_usd": "",
    "serving_precision": "bf16",
    "weights": "",
    "kv_cache_dtype": "",
    "context_len": "8192",
    "concurrent_sequences": "1",
}

MODES: tuple[str, ...] = ("train", "inference")

# Where a problem reported on a schema field is shown in the form.
_FIELD_INPUTS = {
    "mode": "mode",
    "model": "model",
    "model.name": "model",
    "model.config": "config_json",
    "method": "method",
    "lora": "lora_rank",
    "lora.rank": "lora_rank",
    "precision": "precision",
    "quantization": "method",
    "micro_batch_size": "micro_batch_size",
    "seq_len": "seq_len",
    "dataset": "examples",
    "dataset.examples": "examples",
    "dataset.avg_tokens": "avg_tokens",
    "dataset.tokens": "tokens",
    "epochs": "epochs",
    "constraints.budget_usd": "budget_usd",
    "constraints": "budget_usd",
}


# The inference form's inputs for the same schema fields.
_SERVING_INPUTS = {
    **_FIELD_INPUTS,
    "precision": "serving_precision",
    "quantization": "weights",
    "method": "weights",
    "kv_cache_dtype": "kv_cache_dtype",
    "micro_batch_size": "concurrent_sequences",
    "seq_len": "context_len",
}


def input_for(schema_field: str | None, values: Mapping[str, str]) -> str:
    """The form input that shows a problem with ``schema_field`` ('form' when none fits)."""
    if not schema_field:
        return "form"
    if schema_field.startswith("model.config") or (
        schema_field.startswith("model") and values.get("model_source") == "config"
    ):
        return "config_json"
    inputs = _SERVING_INPUTS if values.get("mode") == "inference" else _FIELD_INPUTS
    for prefix in sorted(inputs, key=len, reverse=True):
        if schema_field == prefix or schema_field.startswith(prefix + "."):
            return inputs[prefix]
    return "form"


@dataclass
class PlanForm:
    """The submitted values (shown again on error) and the messages, by input name."""

    values: dict[str, str]
    errors: dict[str, str] = field(default_factory=dict)

    def add(self, name: str, message: str) -> None:
        self.errors.setdefault(name, readable(message))


def blank_form() -> PlanForm:
    return PlanForm(values=dict(DEFAULTS))


def _int(form: PlanForm, name: str, label: str, lo: int, hi: int, required: bool = True) -> int | None:
    raw = form.values.get(name, "").strip().replace(",", "").replace("_", "")
    if not raw:
        if required:
            form.add(name, f"{label}: required")
        return None
    try:
        value = int(raw)
    except ValueError:
        form.add(name, f"{label}: a whole number from {lo:,} to {hi:,} (got {echo(raw)})")
        return None
    if not lo <= value <= hi:
        form.add(name, f"{label}: from {lo:,} to {hi:,} (got {value:,})")
        return None
    return value


def _shown(value: float) -> str:
    """A bound as people write it: 4,194,304, not 4.1943e+06."""
    return f"{value:,.0f}" if float(value).is_integer() and abs(value) < 1e15 else f"{value:g}"


def _float(form: PlanForm, name: str, label: str, lo: float, hi: float, required: bool = True) -> float | None:
    raw = form.values.get(name, "").strip().replace(",", "")
    if not raw:
        if required:
            form.add(name, f"{label}: required")
        return None
    try:
        value = float(raw)
    except ValueError:
        form.add(name, f"{label}: a number above {_shown(lo)} and at most {_shown(hi)} (got {echo(raw)})")
        return None
    if not lo < value <= hi:
        form.add(name, f"{label}: above {_shown(lo)} and at most {_shown(hi)} (got {_shown(value)})")
        return None
    return value


def parse_plan_form(raw: Mapping[str, str]) -> tuple[PlanForm, PlanRequest | None]:
    """Validate the form; returns the request when every input is valid, else None with messages."""
    values = {k: str(raw.get(k, "")) for k in DEFAULTS}
    values["gradient_checkpointing"] = "on" if raw.get("gradient_checkpointing") else ""
    form = PlanForm(values=values)
    body: dict[str, Any] = {}

    if values["model_source"] == "config":
        text = values["config_json"].strip()
        if not text:
            form.add("config_json", "config.json: paste the model's config.json (or pick a catalog model)")
        elif len(text) > MAX_CONFIG_BYTES:
            form.add("config_json", f"config.json: at most {MAX_CONFIG_BYTES:,} characters")
        else:
            try:
                config = json_limits.loads(text, field="config.json")
            except json_limits.JsonInputError as exc:
                form.add("config_json", f"{exc.field}: {exc.message}")
            else:
                if isinstance(config, dict):
                    body["model"] = {"config": config}
                else:
                    form.add("config_json", "config.json: must be a JSON object")
    else:
        name = values["model"].strip()
        if name:
            body["model"] = {"name": name}
            try:
                find_model(name)  # reported now, beside the other inputs' problems
            except UnknownModelError as exc:
                if not is_hub_id(name):  # a Hub id (owner/name) is looked up on the Hub when submitted
                    form.add(
                        "model",
                        f"model: {exc.message} Type its Hugging Face id (owner/name) or paste its config.json.",
                    )
        else:
            form.add("model", "model: pick a model from the catalog (type to search) or paste a config.json")

    mode = values["mode"] or "train"
    if mode not in MODES:
        form.add("mode", f"mode: one of {', '.join(MODES)} (got {echo(mode)})")
    elif mode == "inference":
        # Inference memory is sized from the serving inputs alone: no training method, batch or data set.
        body.update(_serving_body(form, values))
        return _validated(form, body, values)
    method = values["method"]
    if method not in METHODS:
        form.add("method", f"method: one of {', '.join(METHODS)} (got {echo(method)})")
    body["method"] = method
    if method in ("lora", "qlora"):
        rank = _int(form, "lora_rank", "LoRA rank", 1, 4096)
        if rank is not None:
            body["lora"] = {"rank": rank}
    if values["precision"] not in PRECISIONS:
        form.add("precision", f"precision: one of {', '.join(PRECISIONS)} (got {echo(values['precision'])})")
    body["precision"] = values["precision"]
    for name, label, hi in (
        ("micro_batch_size", "micro-batch size", 65_536),
        ("seq_len", "sequence length", 4_194_304),
    ):
        value = _int(form, name, label, 1, hi)
        if value is not None:
            body[name] = value
    body["gradient_checkpointing"] = bool(values["gradient_checkpointing"])

    tokens = _int(form, "tokens", "tokens per epoch", 1, 10**15, required=False)
    if tokens is not None:
        body["dataset"] = {"tokens": tokens}
    else:
        examples = _int(form, "examples", "examples", 1, 10**12)
        avg = _float(form, "avg_tokens", "average tokens per example", 0, MAX_EXAMPLE_TOKENS)
        if examples is not None and avg is not None:
            body["dataset"] = {"examples": examples, "avg_tokens": avg}
    epochs = _float(form, "epochs", "epochs", 0, 1000)
    if epochs is not None:
        body["epochs"] = epochs
    budget = _float(form, "budget_usd", "budget (USD)", 0, 10**9, required=False)
    if budget is not None:
        body["constraints"] = {"budget_usd": budget}

    return _validated(form, body, values)


def _serving_body(form: PlanForm, values: Mapping[str, str]) -> dict[str, Any]:
    """The plan fields of the inference inputs: serving precision, weight format, KV cache dtype, context
    length (seq_len) and concurrent sequences (micro_batch_size)."""
    body: dict[str, Any] = {"mode": "inference"}
    precision = values["serving_precision"]
    if precision not in SERVING_PRECISIONS:
        form.add(
            "serving_precision",
            f"serving precision: one of {', '.join(SERVING_PRECISIONS)} (got {echo(precision)})",
        )
    body["precision"] = precision
    weights = values["weights"]
    if weights not in SERVING_WEIGHTS:
        form.add("weights", f"weights: one of {', '.join(w or 'none' for w in SERVING_WEIGHTS)} (got {echo(weights)})")
    elif weights:
        body["quantization"] = weights
    kv = values["kv_cache_dtype"]
    if kv not in KV_CACHE_DTYPES:
        form.add(
            "kv_cache_dtype", f"KV cache: one of {', '.join(k or 'none' for k in KV_CACHE_DTYPES)} (got {echo(kv)})"
        )
    elif kv:
        body["kv_cache_dtype"] = kv
    for name, key, label, hi in (
        ("context_len", "seq_len", "context length", 4_194_304),
        ("concurrent_sequences", "micro_batch_size", "concurrent sequences", 65_536),
    ):
        value = _int(form, name, label, 1, hi)
        if value is not None:
            body[key] = value
    return body


def _validated(form: PlanForm, body: dict[str, Any], values: Mapping[str, str]) -> tuple[PlanForm, PlanRequest | None]:
    if form.errors:
        return form, None
    try:
        request = PlanRequest.model_validate(body)
    except ValidationError as exc:
        for line in describe_errors(exc):
            schema_field, _, _message = line.partition(": ")
            form.add(input_for(schema_field, values), line)
        return form, None
    return form, request
