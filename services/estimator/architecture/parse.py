"""From a config.json to an :class:`Architecture`: the family table, the size checks, the entry point."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from services.estimator.architecture.checkpoint import check_checkpoint_fields
from services.estimator.architecture.classic import bloom, falcon, gpt2, gpt_neox, t5
from services.estimator.architecture.config import Config
from services.estimator.architecture.dense import cohere, gemma3_multimodal, glm, llama_like, phi, phi3
from services.estimator.architecture.generic import generic_decoder
from services.estimator.architecture.model import Architecture
from services.estimator.architecture.moe import deepseek, glm4_moe, gpt_oss, llama4, phimoe
from services.estimator.architecture.remote import baichuan, chatglm, internlm2, qwen1
from services.estimator.architecture.sizes import check_architecture_sizes
from services.estimator.bounds import check_config_sizes
from services.estimator.errors import EstimatorError
from services.estimator.memo import Canonical

# What a model_type can be (transformers' are lower-case identifiers such as "qwen2_moe" or "gemma3_text").
_MODEL_TYPE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_FAMILIES: dict[str, Callable[[Config], Architecture]] = {
    "llama": llama_like,
    "mistral": llama_like,
    "mixtral": llama_like,
    "qwen2": llama_like,
    "qwen2_moe": llama_like,
    "qwen3": llama_like,
    "qwen3_moe": llama_like,
    "gemma": llama_like,
    "gemma2": llama_like,
    "gemma3_text": llama_like,
    "gemma3": gemma3_multimodal,
    "olmo": llama_like,
    "olmo2": llama_like,
    "stablelm": llama_like,
    "phi": phi,
    "phi3": phi3,
    "gpt2": gpt2,
    "gpt_bigcode": gpt2,
    "gpt_neox": gpt_neox,
    "falcon": falcon,
    "bloom": bloom,
    "t5": t5,
    "mt5": t5,
    "qwen": qwen1,
    "deepseek_v2": deepseek,
    "deepseek_v3": deepseek,
    "gpt_oss": gpt_oss,
    "llama4": llama4,
    "llama4_text": llama4,
    "internlm2": internlm2,
    "baichuan": baichuan,
    "chatglm": chatglm,
    "glm": glm,
    "glm4": glm,
    "cohere": cohere,
    "cohere2": cohere,
    "granite": llama_like,
    "olmoe": llama_like,
    "phimoe": phimoe,
    "glm4_moe": glm4_moe,
    "seed_oss": llama_like,
}

SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(sorted(_FAMILIES))
# Parsed architectures interned by value (services.estimator.memo.Canonical).
CANONICAL_ARCHITECTURES = 256
canonical_architecture: Canonical[Architecture] = Canonical(CANONICAL_ARCHITECTURES)


def architecture_from_config(config: Mapping[str, Any]) -> Architecture:
    """Parse an HF config.json into an :class:`Architecture`. An unknown family gets a generic decoder
    (``confidence: low``); a config without the sizes, or whose torch_dtype or quantization_config.bits no
    loader reads, raises EstimatorError."""
    if not isinstance(config, Mapping):
        raise EstimatorError("model.config", "must be a JSON object (the model's config.json)")
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise EstimatorError("model.config.model_type", "missing; it names the architecture family")
    if not _MODEL_TYPE.fullmatch(model_type):
        # It is printed as given (the CLI's first line, the dashboard): "llama\x1b[2J" cleared a terminal.
        raise EstimatorError(
            "model.config.model_type", f"{model_type[:40]!r} is no architecture name (letters, digits, '_', '-', '.')"
        )
    # An unknown family is estimated from the standard keys (low confidence), never refused.
    parser = _FAMILIES.get(model_type) or partial(generic_decoder, known=SUPPORTED_MODEL_TYPES)
    check_config_sizes(config)
    check_checkpoint_fields(config)
    try:
        arch = parser(Config(config))
    except ZeroDivisionError:
        raise EstimatorError(
            "model.config", "a size the layer shapes are divided by is zero (heads, patch size)"
        ) from None
    check_architecture_sizes(arch)
    if arch.num_layers == 0 or arch.hidden_size == 0:
        raise EstimatorError("model.config", "num_hidden_layers and hidden_size must be positive")
    if arch.vocab_size <= 0:  # the embeddings and the logits are sized by it
        raise EstimatorError("model.config.vocab_size", f"must be positive, got {arch.vocab_size}")
    for block in arch.blocks:
        if block.num_heads and block.head_dim <= 0:  # attention's width per head
            raise EstimatorError("model.config.head_dim", f"must be positive, got {block.head_dim}")
        if block.num_heads == 0 or block.num_kv_heads == 0 or block.num_heads % block.num_kv_heads:
            raise EstimatorError(
                "model.config.num_key_value_heads",
                f"{block.num_kv_heads} must be positive and divide num_attention_heads ({block.num_heads})",
            )
    return canonical_architecture(arch)
