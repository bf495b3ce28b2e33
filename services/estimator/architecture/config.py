"""Reading a config.json: typed fields with clear errors, and the layer shapes families share."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.estimator.architecture.model import Linear
from services.estimator.errors import EstimatorError


class Config:
    """Typed access to a config.json with clear errors for missing or malformed fields."""

    def __init__(self, raw: Mapping[str, Any]) -> None:
        self.raw = raw

    def _get(self, names: tuple[str, ...]) -> Any:
        for name in names:
            value = self.raw.get(name)
            if value is not None:
                return value
        return None

    def get_int(self, *names: str, default: int | None = None) -> int:
        value = self._get(names)
        if value is None:
            if default is not None:
                return default
            raise EstimatorError(f"model.config.{names[0]}", f"missing; a {self.model_type} config.json needs it")
        if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value) or value < 0:
            raise EstimatorError(f"model.config.{names[0]}", f"must be a non-negative integer, got {value!r}")
        return int(value)

    def opt_int(self, *names: str) -> int | None:
        return self.get_int(*names) if self._get(names) is not None else None

    def get_float(self, *names: str, default: float = 0.0) -> float:
        value = self._get(names)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise EstimatorError(f"model.config.{names[0]}", f"must be a number, got {value!r}")
        return float(value)

    def get_bool(self, *names: str, default: bool) -> bool:
        value = self._get(names)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise EstimatorError(f"model.config.{names[0]}", f"must be true or false, got {value!r}")
        return value

    def get_str(self, *names: str, default: str) -> str:
        value = self._get(names)
        return str(value) if value is not None else default

    @property
    def model_type(self) -> str:
        return str(self.raw.get("model_type", "?"))


def gated_mlp(hidden: int, inter: int, bias: bool = False, copies: int = 1, fused: bool = False) -> tuple[Linear, ...]:
    names = ("w1", "w3", "w2") if copies > 1 else ("gate_proj", "up_proj", "down_proj")
    if fused:
        return (
            Linear("gate_up_proj", ("gate", "up"), hidden, 2 * inter, bias, copies),
            Linear("down_proj", ("down",), inter, hidden, bias, copies),
        )
    return (
        Linear(names[0], ("gate",), hidden, inter, bias, copies),
        Linear(names[1], ("up",), hidden, inter, bias, copies),
        Linear(names[2], ("down",), inter, hidden, bias, copies),
    )


def qkvo(hidden: int, heads: int, kv_heads: int, head_dim: int, qkv_bias: bool, o_bias: bool) -> tuple[Linear, ...]:
    return (
        Linear("q_proj", ("q",), hidden, heads * head_dim, qkv_bias),
        Linear("k_proj", ("k",), hidden, kv_heads * head_dim, qkv_bias),
        Linear("v_proj", ("v",), hidden, kv_heads * head_dim, qkv_bias),
        Linear("o_proj", ("o",), heads * head_dim, hidden, o_bias),
    )


def int_list(c: Config, name: str) -> tuple[int, ...]:
    """A config field holding a list of non-negative integers (layer indices); absent means empty."""
    value = c.raw.get(name)
    if value is None:
        return ()
    if not isinstance(value, list) or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in value):
        raise EstimatorError(
            f"model.config.{name}", f"must be a list of layer indices (integers >= 0), got {value!r:.100}"
        )
    return tuple(value)


def sparse_layer_count(layers: int, step: int, dense_layers: tuple[int, ...]) -> int:
    """How many of ``layers`` layers hold experts: layer i does when (i + 1) % step == 0 and i is not in
    ``mlp_only_layers`` (transformers ``Qwen2MoeDecoderLayer`` / ``Qwen3MoeDecoderLayer``). Counted
    arithmetically, so the work does not grow with the layer count."""
    if step <= 0:
        return 0
    dense_sparse_slots = {i for i in dense_layers if i < layers and (i + 1) % step == 0}
    return layers // step - len(dense_sparse_slots)


def hidden_dropout_of(c: Config) -> float:
    return c.get_float("resid_pdrop", "hidden_dropout", "dropout_rate", "dropout")


def attention_dropout_of(c: Config) -> float:
    return c.get_float("attn_pdrop", "attention_dropout", "attention_probs_dropout_prob")


def first_key(c: Config, names: tuple[str, ...]) -> str | None:
    return next((n for n in names if c.raw.get(n) is not None), None)
