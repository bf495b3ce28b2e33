"""Upper bounds on model sizes: what real models use, with a wide margin.

An estimate's work must not grow with a number the caller types (issue 15.3: a pasted config with
200,000,000 layers ran 31 s of CPU). Every size the estimator reads is bounded here; a config over a
bound is refused with the field's name, the bound and the largest real value it is based on. The
margins are 6x to 25x, so a model larger than any published one still passes.

Two checks, both pure and cheap (the second lives with the architecture, which it reads):

- :func:`check_config_sizes` reads the raw config.json (and its nested ``text_config`` /
  ``vision_config``) before any parsing, naming the field as the user wrote it;
- ``architecture.sizes.check_architecture_sizes`` checks the parsed architecture against the same
  bounds, so a family parser that reads other field names (or derives a size) is covered too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from services.estimator.errors import EstimatorError


@dataclass(frozen=True)
class Bound:
    """The largest value accepted, and the largest real one it is based on (with its source)."""

    limit: int
    largest_real: str


# Sources: the models' config.json files on the Hugging Face Hub, and the papers named.
LAYERS = Bound(
    1024,
    "126 (Llama 3.1 405B); 118 (PaLM 540B, Chowdhery et al. 2022); 105 (Megatron-Turing NLG 530B); 61 (DeepSeek-V3)",
)
HIDDEN = Bound(131_072, "20,480 (Megatron-Turing NLG 530B); 18,432 (PaLM 540B); 16,384 (Llama 3.1 405B)")
INTERMEDIATE = Bound(524_288, "73,728 (PaLM 540B); 65,536 (T5-11B d_ff); 53,248 (Llama 3.1 405B)")
HEADS = Bound(2048, "128 (Llama 3.1 405B, DeepSeek-V3, Megatron-Turing NLG 530B)")
HEAD_DIM = Bound(4096, "256 (Gemma 7B, Gemma 2); 128 (Llama, T5-11B d_kv)")
EXPERTS = Bound(16_384, "2,048 (Switch-C, Fedus et al. 2021); 384 (Kimi K2); 256 (DeepSeek-V3)")
EXPERTS_PER_TOKEN = Bound(256, "8 (DeepSeek-V3, Qwen3-235B-A22B, Kimi K2)")
VOCAB = Bound(4_194_304, "262,208 (Gemma 3); 256,000 (Gemma); 250,880 (BLOOM); 250,112 (mT5)")
POSITIONS = Bound(268_435_456, "10,485,760 (Llama 4 Scout); 1,048,576 (Qwen2.5-1M)")
# Vision towers (SigLIP in Gemma 3: image 896, patch 14, 3 channels).
IMAGE_SIZE = Bound(65_536, "896 (Gemma 3's SigLIP); 448 (InternViT)")
CHANNELS = Bound(64, "3 (RGB)")
BUCKETS = Bound(65_536, "32 (T5), 128 (T5 relative_attention_max_distance)")

# config.json field names (all families this estimator parses, plus common aliases) -> bound.
CONFIG_FIELDS: dict[str, Bound] = {
    **dict.fromkeys(
        ("num_hidden_layers", "n_layer", "num_layers", "num_decoder_layers", "n_layers", "decoder_sparse_step"),
        LAYERS,
    ),
    **dict.fromkeys(("hidden_size", "n_embd", "d_model", "n_embed", "dim"), HIDDEN),
    **dict.fromkeys(
        (
            "intermediate_size",
            "n_inner",
            "d_ff",
            "ffn_hidden_size",
            "moe_intermediate_size",
            "shared_expert_intermediate_size",
            "ffn_dim",
        ),
        INTERMEDIATE,
    ),
    **dict.fromkeys(
        ("num_attention_heads", "n_head", "num_heads", "num_key_value_heads", "n_head_kv", "num_kv_heads", "n_heads"),
        HEADS,
    ),
    **dict.fromkeys(("head_dim", "d_kv", "kv_channels"), HEAD_DIM),
    **dict.fromkeys(("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts"), EXPERTS),
    **dict.fromkeys(("num_experts_per_tok", "moe_top_k", "top_k"), EXPERTS_PER_TOKEN),
    "vocab_size": VOCAB,
    **dict.fromkeys(("max_position_embeddings", "n_positions", "n_ctx", "seq_length"), POSITIONS),
    **dict.fromkeys(("image_size", "patch_size"), IMAGE_SIZE),
    "num_channels": CHANNELS,
    "relative_attention_num_buckets": BUCKETS,
}


# Fields the parsers divide by (head_dim = hidden / heads; patches = image / patch), and the MLP's width (every
# published dense model has one; zero would drop two thirds of its weights): zero is refused. The MoE widths may
# be absent or zero (no shared expert), so they are not here.
POSITIVE_FIELDS = frozenset(
    (
        *("num_attention_heads", "n_head", "num_heads", "n_heads", "patch_size", "hidden_size", "n_embd", "d_model"),
        *("intermediate_size", "d_ff", "ffn_hidden_size", "ffn_dim"),
    )
)


def over_bound(field: str, value: Any, bound: Bound) -> EstimatorError:
    return EstimatorError(
        field,
        f"{value!r} is larger than any real model: at most {bound.limit:,} (largest published: {bound.largest_real})",
    )


def check_config_sizes(config: Mapping[str, Any], field: str = "model.config") -> None:
    """Refuse any known size field of a config.json (or of its nested configs) over its bound."""
    stack: list[tuple[Mapping[str, Any], str]] = [(config, field)]
    while stack:
        current, path = stack.pop()
        for key, value in current.items():
            if isinstance(value, Mapping):
                stack.append((value, f"{path}.{key}"))
                continue
            bound = CONFIG_FIELDS.get(key)
            if bound is None or isinstance(value, bool) or not isinstance(value, int | float):
                continue
            if value > bound.limit:
                raise over_bound(f"{path}.{key}", value, bound)
            if key in POSITIVE_FIELDS and value < 1:
                raise EstimatorError(f"{path}.{key}", f"must be a positive integer, got {value!r}")
