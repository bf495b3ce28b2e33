"""How a config.json says its weights are stored: ``torch_dtype`` (``dtype`` since transformers 4.56) and
``quantization_config``. A value no loader reads is a typo or another file: refused naming the field."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.estimator.errors import EstimatorError

# transformers' PretrainedConfig.__init__ turns a dtype string into ``getattr(torch, name)``, so the
# names it loads are torch's dtype attributes (torch 2.x; "auto", "fp16" or "torch.float16" fail there).
TORCH_DTYPE_NAMES = frozenset(
    (
        *("float32", "float", "float64", "double", "float16", "half", "bfloat16"),
        *("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2"),
        *("complex32", "chalf", "complex64", "cfloat", "complex128", "cdouble", "bool"),
        *("int8", "int16", "short", "int32", "int", "int64", "long", "uint8", "uint16", "uint32", "uint64"),
        *("int1", "int2", "int3", "int4", "int5", "int6", "int7", "uint1", "uint2", "uint3", "uint4", "uint5"),
        *("uint6", "uint7", "qint8", "quint8", "qint32", "quint4x2", "quint2x4"),
        *("bits1x8", "bits2x4", "bits4x2", "bits8", "bits16", "bit"),
    )
)
_DTYPE_KEYS = ("torch_dtype", "dtype")
# The bit widths transformers' quantization configs load (utils/quantization_config.py): AutoRound 2-8,
# GPTQ and AWQ 2, 3, 4 or 8, HIGGS 2-4, SpQR 3, Metal 2, 4 or 8.
QUANTIZATION_BITS = (2, 8)
# The widths GPTQ packs (AutoGPTQ's QuantLinear raises "Only 2,3,4,8 bits are supported."; transformers'
# GPTQConfig.post_init "Only support quantization to [2,3,4,8] bits"); AWQ checkpoints are read in its layout.
GROUPWISE_BITS = (2, 3, 4, 8)
_GROUPWISE_METHODS = ("awq", "gptq")


def _dtype_problem(value: Any) -> str | None:
    """Why ``value`` is no dtype transformers loads (None: it is one)."""
    if isinstance(value, str) and value in TORCH_DTYPE_NAMES:
        return None
    bare = value.removeprefix("torch.") if isinstance(value, str) else None
    hint = f" (write {bare!r})" if bare != value and bare in TORCH_DTYPE_NAMES else ""
    return (
        f"must be a torch dtype name as transformers writes it: 'bfloat16', 'float16', 'float32', "
        f"'float8_e4m3fn', ... (or null), got {value!r:.60}{hint}"
    )


def check_dtype(config: Mapping[str, Any], field: str) -> None:
    """Refuse a ``torch_dtype``/``dtype`` transformers cannot load; null or absent is allowed, and a mapping
    gives one dtype per sub-config (PretrainedConfig.dict_dtype_to_str writes it so)."""
    for key in _DTYPE_KEYS:
        value = config.get(key)
        if value is None:
            continue
        if isinstance(value, Mapping):
            for name, dtype in value.items():
                problem = _dtype_problem(dtype) if dtype is not None else None
                if problem is not None:
                    raise EstimatorError(f"{field}.{key}.{name}", problem)
            continue
        problem = _dtype_problem(value)
        if problem is not None:
            raise EstimatorError(f"{field}.{key}", problem)


def check_quantization_config(config: Mapping[str, Any], field: str) -> None:
    """Refuse a ``quantization_config`` that is no object, or whose ``bits`` is no integer transformers
    loads (a list, text, a bool, null or 2.5 included), or an AWQ or GPTQ one no GPTQ layout packs; absent
    bits stay the quantizer's default."""
    quant = config.get("quantization_config")
    if quant is None:
        return
    if not isinstance(quant, Mapping):
        raise EstimatorError(f"{field}.quantization_config", f"must be a JSON object, got {quant!r:.60}")
    if "bits" in quant:
        bits = quant["bits"]
        low, high = QUANTIZATION_BITS
        # The range first: int() of an infinite float raises.
        if isinstance(bits, bool) or not isinstance(bits, int | float) or not low <= bits <= high or bits != int(bits):
            raise EstimatorError(
                f"{field}.quantization_config.bits", f"must be an integer from {low} to {high}, got {bits!r:.60}"
            )
    method = quant.get("quant_method")
    if method in _GROUPWISE_METHODS:
        _check_groupwise(quant, method, f"{field}.quantization_config")


def _check_groupwise(quant: Mapping[str, Any], method: str, field: str) -> None:
    """An AWQ or GPTQ config's bits (2, 3, 4 or 8) and group_size (input rows per group, or -1 for one group
    per row: GPTQConfig.post_init refuses anything else, "group_size must be greater than 0 or equal to -1")."""
    bits = quant.get("bits", 4)
    if bits not in GROUPWISE_BITS:
        raise EstimatorError(
            f"{field}.bits", f"a {method.upper()} checkpoint packs 2, 3, 4 or 8 bits per weight, got {bits!r:.60}"
        )
    if "group_size" not in quant:
        return  # 128, as both configs default
    group = quant["group_size"]
    whole = isinstance(group, int) or (isinstance(group, float) and group.is_integer())  # inf and nan are not
    if isinstance(group, bool) or not whole or not (group >= 1 or group == -1):
        raise EstimatorError(f"{field}.group_size", f"must be a positive integer or -1, got {group!r:.60}")


def check_checkpoint_fields(config: Mapping[str, Any], field: str = "model.config") -> None:
    """The storage fields of a config.json and of its sub-configs (``text_config``, ``vision_config``: the
    nested objects with a ``model_type``)."""
    check_dtype(config, field)
    check_quantization_config(config, field)
    for key, value in config.items():
        if isinstance(value, Mapping) and "model_type" in value:
            check_dtype(value, f"{field}.{key}")
