"""The architecture model: layers, blocks and exact parameter counts.

A parameter count here equals ``sum(p.numel() for p in model.parameters())`` of the HF model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

from services.estimator.memo import state_without_hash, value_hash_once

Role = str  # a LoRA target role: q, k, v, o, gate, up, down (lm_head is handled separately)
NormKind = Literal["rms", "layer", "nonparam"]
BlockKind = Literal["decoder", "encoder", "cross-decoder"]


@dataclass(frozen=True)
class Linear:
    """One linear layer of a block; ``copies`` > 1 for the experts of a mixture-of-experts layer."""

    name: str
    roles: tuple[Role, ...]
    in_features: int
    out_features: int
    bias: bool = False
    copies: int = 1

    # Derived values are cached on the (frozen) instance: an estimate reads them many times per layer.
    @cached_property
    def params(self) -> int:
        return self.copies * (self.in_features * self.out_features + (self.out_features if self.bias else 0))

    @cached_property
    def is_attention(self) -> bool:
        return bool(set(self.roles) & {"q", "k", "v", "o"})


@dataclass(frozen=True)
class Block:
    """A repeated transformer block (``count`` identical copies)."""

    kind: BlockKind
    count: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    linears: tuple[Linear, ...]
    norm_params: int
    norm_count: int
    other_params: int = 0
    mlp_gated: bool = True
    intermediate_size: int = 0
    experts_per_token: int = 1
    num_experts: int = 1
    parallel_residual: bool = False

    @cached_property
    def linear_params(self) -> int:
        return sum(lin.params for lin in self.linears)

    @cached_property
    def params(self) -> int:
        return self.linear_params + self.norm_params + self.other_params

    @cached_property
    def active_params(self) -> int:
        """Parameters a token passes through (experts scaled by experts_per_token / num_experts)."""
        total = self.norm_params + self.other_params
        for lin in self.linears:
            if lin.copies > 1:
                total += lin.params * self.experts_per_token // lin.copies
            else:
                total += lin.params
        return total


@dataclass(frozen=True)
class Architecture:
    model_type: str
    hidden_size: int
    vocab_size: int
    tie_word_embeddings: bool
    blocks: tuple[Block, ...]
    norm: NormKind
    activation: str
    embedding_params: int
    position_embedding_params: int = 0
    extra_params: int = 0  # final norms, embedding layer norms
    lm_head_bias: bool = False
    max_position_embeddings: int | None = None
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0
    vision_params: int = 0
    rotary: bool = True  # RoPE on q and k (GPT-2, BLOOM, T5 and ALiBi Falcon have none)
    notes: tuple[str, ...] = field(default_factory=tuple)
    # "low" where the family is unknown and the shapes come from the standard keys (see generic_decoder);
    # its notes then name each assumption.
    confidence: Literal["high", "low"] = "high"
    # Bits per parameter the published checkpoint stores for the experts' weight matrices (gpt-oss: MXFP4,
    # 4 bits plus one 8-bit scale per 32 values = 4.25); None where the checkpoint is in the model dtype.
    expert_weight_stored_bits: float | None = None
    # Gemma 2's logit soft-capping, cap * tanh(x / cap) (config attn_logit_softcapping, final_logit_softcapping;
    # 0 where none): the memory cost is the kept tanh output, so only whether a cap is set matters.
    attention_logit_softcap: float = 0.0
    final_logit_softcap: float = 0.0

    # Hashed by value once: the memos look it up on every estimate (services/estimator/memo.py).
    __hash__ = value_hash_once
    __getstate__ = state_without_hash

    @cached_property
    def parameters(self) -> ParameterCounts:
        """Parameter counts per component, counted once per architecture (``parameter_counts``)."""
        return _count_parameters(self)

    @property
    def low_confidence(self) -> bool:
        """Shapes read from generic config keys: the uncertainty band is widened for it (estimate and planner)."""
        return self.confidence == "low"

    @cached_property
    def num_layers(self) -> int:
        return sum(b.count for b in self.blocks)

    @property
    def lm_head_params(self) -> int:
        if self.tie_word_embeddings:
            return 0
        return self.hidden_size * self.vocab_size + (self.vocab_size if self.lm_head_bias else 0)

    @property
    def lm_head_matmul_params(self) -> int:
        """The output projection's weights as used in the matmul, tied or not."""
        return self.hidden_size * self.vocab_size

    @cached_property
    def is_moe(self) -> bool:
        return any(b.num_experts > 1 for b in self.blocks)

    @cached_property
    def largest_block_params(self) -> int:
        return max(b.params for b in self.blocks)

    @cached_property
    def largest_linear_weights(self) -> int:
        """Weights of the largest block linear (in x out): the size of one layer's temporary weight copy."""
        return max(lin.in_features * lin.out_features for b in self.blocks for lin in b.linears)

    @cached_property
    def block_linear_weights(self) -> int:
        """Weights of every block linear, all layers (no biases): what a quantized base stores in 4/8 bits."""
        return sum(b.count * lin.copies * lin.in_features * lin.out_features for b in self.blocks for lin in b.linears)


@dataclass(frozen=True)
class ParameterCounts:
    """Parameter counts per component; ``total`` matches the HF model's ``numel`` sum."""

    embedding: int
    position_embedding: int
    attention: int
    mlp: int
    norms: int
    other: int
    lm_head: int
    vision: int
    total: int
    active: int

    @property
    def non_embedding(self) -> int:
        return self.total - self.embedding - self.position_embedding - self.lm_head - self.vision


def parameter_counts(arch: Architecture) -> ParameterCounts:
    """Parameter counts per component; ``total`` matches the HF model's ``numel`` sum."""
    return arch.parameters


def _count_parameters(arch: Architecture) -> ParameterCounts:
    attention = sum(lin.params * b.count for b in arch.blocks for lin in b.linears if lin.is_attention)
    mlp = sum(lin.params * b.count for b in arch.blocks for lin in b.linears if not lin.is_attention)
    norms = sum(b.norm_params * b.count for b in arch.blocks) + arch.extra_params
    other = sum(b.other_params * b.count for b in arch.blocks)
    total = (
        arch.embedding_params
        + arch.position_embedding_params
        + attention
        + mlp
        + norms
        + other
        + arch.lm_head_params
        + arch.vision_params
    )
    active = total - sum((b.params - b.active_params) * b.count for b in arch.blocks)
    return ParameterCounts(
        embedding=arch.embedding_params,
        position_embedding=arch.position_embedding_params,
        attention=attention,
        mlp=mlp,
        norms=norms,
        other=other,
        lm_head=arch.lm_head_params,
        vision=arch.vision_params,
        total=total,
        active=active,
    )


def checkpoint_bytes(arch: Architecture, bytes_per_param: float) -> float:
    """Bytes of the published checkpoint: every parameter at ``bytes_per_param`` (2 for bf16), except the
    experts' weight matrices where the checkpoint stores them in fewer bits (gpt-oss: MXFP4, 4.25 bits;
    OpenAI's model card gives 12.8 GiB for gpt-oss-20b and 60.8 GiB for gpt-oss-120b)."""
    total = parameter_counts(arch).total
    if arch.expert_weight_stored_bits is None:
        return total * bytes_per_param
    experts = sum(
        b.count * lin.copies * lin.in_features * lin.out_features
        for b in arch.blocks
        for lin in b.linears
        if lin.copies > 1
    )
    return (total - experts) * bytes_per_param + experts * arch.expert_weight_stored_bits / 8.0
