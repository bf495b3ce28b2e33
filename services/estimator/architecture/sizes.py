"""The parsed architecture against the size bounds of services/estimator/bounds.py."""

from __future__ import annotations

from services.estimator.architecture.model import Architecture
from services.estimator.bounds import (
    EXPERTS,
    EXPERTS_PER_TOKEN,
    HEAD_DIM,
    HEADS,
    HIDDEN,
    INTERMEDIATE,
    LAYERS,
    POSITIONS,
    VOCAB,
    over_bound,
)
from services.estimator.errors import EstimatorError


def check_architecture_sizes(arch: Architecture) -> None:
    """Refuse a parsed architecture with any size over its bound (whatever config field it came from)."""
    prefix = "model.config."
    if arch.num_layers > LAYERS.limit:
        raise over_bound(prefix + "num_hidden_layers", arch.num_layers, LAYERS)
    if arch.hidden_size > HIDDEN.limit:
        raise over_bound(prefix + "hidden_size", arch.hidden_size, HIDDEN)
    if arch.vocab_size > VOCAB.limit:
        raise over_bound(prefix + "vocab_size", arch.vocab_size, VOCAB)
    if arch.max_position_embeddings is not None and arch.max_position_embeddings > POSITIONS.limit:
        raise over_bound(prefix + "max_position_embeddings", arch.max_position_embeddings, POSITIONS)
    for block in arch.blocks:
        if block.num_heads > HEADS.limit:
            raise over_bound(prefix + "num_attention_heads", block.num_heads, HEADS)
        if block.head_dim > HEAD_DIM.limit:
            raise over_bound(prefix + "head_dim", block.head_dim, HEAD_DIM)
        if block.intermediate_size > INTERMEDIATE.limit:
            raise over_bound(prefix + "intermediate_size", block.intermediate_size, INTERMEDIATE)
        if block.num_experts > EXPERTS.limit:
            raise over_bound(prefix + "num_experts", block.num_experts, EXPERTS)
        if block.experts_per_token > EXPERTS_PER_TOKEN.limit:
            raise over_bound(prefix + "num_experts_per_tok", block.experts_per_token, EXPERTS_PER_TOKEN)
        if block.num_experts < 1 or block.experts_per_token < 1:
            # A MoE layer of no experts, or routing each token to none, has no MLP to train: a config that says so
            # is cut short or wrong, and was sized as a model with its MLPs gone (a probe of the estimator).
            field, count = (
                ("num_experts", block.num_experts)
                if block.num_experts < 1
                else ("num_experts_per_tok", block.experts_per_token)
            )
            raise EstimatorError(prefix + field, f"{count} experts: a MoE layer routes each token to at least one")
        if block.num_experts > 1 and block.experts_per_token > block.num_experts:
            raise EstimatorError(
                prefix + "num_experts_per_tok",
                f"{block.experts_per_token} is more than the {block.num_experts} experts of the layer",
            )
        widest = HIDDEN.limit * HEADS.limit  # a projection wider than this has no real counterpart
        for lin in block.linears:
            if lin.in_features > widest or lin.out_features > widest or lin.copies > EXPERTS.limit:
                raise EstimatorError(
                    prefix.rstrip("."),
                    f"layer {lin.name} is {lin.in_features:,} x {lin.out_features:,}"
                    f"{f' x {lin.copies:,} experts' if lin.copies > 1 else ''}: larger than any real model",
                )
