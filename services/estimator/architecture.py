"""Model architecture from a Hugging Face ``config.json``: layer shapes and exact parameter counts.

Each family's parser mirrors the module layout of its ``transformers`` modelling file (named in the
parser's docstring), so a parameter count here equals ``sum(p.numel() for p in model.parameters())``
of the HF model. Tests compare the totals with the published counts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from services.estimator.bounds import check_architecture_sizes, check_config_sizes
from services.estimator.errors import EstimatorError

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

    @property
    def params(self) -> int:
        return self.copies * (self.in_features * self.out_features + (self.out_features if self.bias else 0))

    @property
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

    @property
    def linear_params(self) -> int:
        return sum(lin.params for lin in self.linears)

    @property
    def params(self) -> int:
        return self.linear_params + self.norm_params + self.other_params

    @property
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

    @property
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

    @property
    def is_moe(self) -> bool:
        return any(b.num_experts > 1 for b in self.blocks)

    @property
    def largest_block_params(self) -> int:
        return max(b.params for b in self.blocks)


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


# --------------------------------------------------------------------------------------------------
# Reading config fields


class _Config:
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


def _gated_mlp(hidden: int, inter: int, bias: bool = False, copies: int = 1, fused: bool = False) -> tuple[Linear, ...]:
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


def _qkvo(hidden: int, heads: int, kv_heads: int, head_dim: int, qkv_bias: bool, o_bias: bool) -> tuple[Linear, ...]:
    return (
        Linear("q_proj", ("q",), hidden, heads * head_dim, qkv_bias),
        Linear("k_proj", ("k",), hidden, kv_heads * head_dim, qkv_bias),
        Linear("v_proj", ("v",), hidden, kv_heads * head_dim, qkv_bias),
        Linear("o_proj", ("o",), heads * head_dim, hidden, o_bias),
    )


def _int_list(c: _Config, name: str) -> tuple[int, ...]:
    """A config field holding a list of non-negative integers (layer indices); absent means empty."""
    value = c.raw.get(name)
    if value is None:
        return ()
    if not isinstance(value, list) or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in value):
        raise EstimatorError(
            f"model.config.{name}", f"must be a list of layer indices (integers >= 0), got {value!r:.100}"
        )
    return tuple(value)


def _sparse_layer_count(layers: int, step: int, dense_layers: tuple[int, ...]) -> int:
    """How many of ``layers`` layers hold experts: layer i does when (i + 1) % step == 0 and i is not in
    ``mlp_only_layers`` (transformers ``Qwen2MoeDecoderLayer`` / ``Qwen3MoeDecoderLayer``). Counted
    arithmetically, so the work does not grow with the layer count."""
    if step <= 0:
        return 0
    dense_sparse_slots = {i for i in dense_layers if i < layers and (i + 1) % step == 0}
    return layers // step - len(dense_sparse_slots)


def _hidden_dropout(c: _Config) -> float:
    return c.get_float("resid_pdrop", "hidden_dropout", "dropout_rate", "dropout")


def _attention_dropout(c: _Config) -> float:
    return c.get_float("attn_pdrop", "attention_dropout", "attention_probs_dropout_prob")


# --------------------------------------------------------------------------------------------------
# Family parsers


def _llama_like(c: _Config) -> Architecture:
    """llama, mistral, qwen2, qwen3, olmo, olmo2, stablelm, gemma(2,3), mixtral, qwen2_moe, qwen3_moe.

    transformers ``models/<family>/modeling_<family>.py``: q/k/v/o projections, a gated MLP (or
    experts), RMSNorm (LayerNorm for stablelm, a weightless LayerNorm for olmo).
    """
    mt = c.model_type
    h = c.get_int("hidden_size")
    layers = c.get_int("num_hidden_layers")
    heads = c.get_int("num_attention_heads")
    kv_heads = c.get_int("num_key_value_heads", default=heads)
    head_dim = c.get_int("head_dim", default=h // heads if heads else 0)
    vocab = c.get_int("vocab_size")
    inter = c.get_int("intermediate_size", default=0)
    notes: list[str] = []

    qkv_bias = c.get_bool("attention_bias", default=mt == "qwen2" or mt == "qwen2_moe")
    if mt in ("qwen2", "qwen2_moe"):
        qkv_bias, o_bias = True, False
    elif mt == "stablelm":
        qkv_bias, o_bias = c.get_bool("use_qkv_bias", default=False), False
    else:
        o_bias = qkv_bias
    mlp_bias = c.get_bool("mlp_bias", default=False)

    norm: NormKind = "rms"
    norm_width = h  # parameters per hidden-size norm
    if mt == "stablelm":
        norm, norm_width = "layer", 2 * h
    elif mt == "olmo":
        norm, norm_width = "nonparam", 0

    norms_per_layer = 4 if mt in ("gemma2", "gemma3_text", "gemma3") else 2
    parallel = mt == "stablelm" and c.get_bool("use_parallel_residual", default=False)
    if parallel:
        norms_per_layer = 1
    other = 0
    if mt in ("qwen3", "qwen3_moe", "gemma3_text", "gemma3"):
        other += 2 * head_dim  # per-head q_norm and k_norm (RMSNorm over head_dim)
    if mt == "olmo2":
        other += heads * head_dim + kv_heads * head_dim  # q_norm, k_norm over the projections
    if mt == "stablelm" and c.get_bool("qk_layernorm", default=False):
        other += (heads + kv_heads) * head_dim  # per-head LayerNorm weights, no bias

    attn = _qkvo(h, heads, kv_heads, head_dim, qkv_bias, o_bias)
    act = c.get_str("hidden_act", "hidden_activation", default="silu")

    def dense_block(count: int) -> Block:
        return Block(
            "decoder",
            count,
            heads,
            kv_heads,
            head_dim,
            attn + _gated_mlp(h, inter, mlp_bias),
            norm_params=norms_per_layer * norm_width,
            norm_count=norms_per_layer,
            other_params=other,
            mlp_gated=True,
            intermediate_size=inter,
            parallel_residual=parallel,
        )

    blocks: tuple[Block, ...]
    if mt == "mixtral":
        n_exp = c.get_int("num_local_experts")
        k = c.get_int("num_experts_per_tok", default=2)
        blocks = (
            Block(
                "decoder",
                layers,
                heads,
                kv_heads,
                head_dim,
                attn + _gated_mlp(h, inter, copies=n_exp),
                norm_params=2 * h,
                norm_count=2,
                other_params=other + h * n_exp,  # router
                intermediate_size=inter,
                experts_per_token=k,
                num_experts=n_exp,
            ),
        )
    elif mt in ("qwen2_moe", "qwen3_moe"):
        n_exp = c.get_int("num_experts")
        k = c.get_int("num_experts_per_tok")
        moe_inter = c.get_int("moe_intermediate_size")
        step = c.get_int("decoder_sparse_step", default=1)
        sparse_count = _sparse_layer_count(layers, step, _int_list(c, "mlp_only_layers"))
        experts = _gated_mlp(h, moe_inter, copies=n_exp)
        shared: tuple[Linear, ...] = ()
        router = h * n_exp
        shared_inter = c.get_int("shared_expert_intermediate_size", default=0)
        if shared_inter:
            shared = tuple(
                Linear("shared_" + lin.name, lin.roles, lin.in_features, lin.out_features)
                for lin in _gated_mlp(h, shared_inter)
            )
            router += h  # shared_expert_gate
        sparse = Block(
            "decoder",
            sparse_count,
            heads,
            kv_heads,
            head_dim,
            attn + experts + shared,
            norm_params=2 * h,
            norm_count=2,
            other_params=other + router,
            intermediate_size=moe_inter,
            experts_per_token=k,
            num_experts=n_exp,
        )
        blocks = (sparse, dense_block(layers - sparse_count)) if layers > sparse_count else (sparse,)
    else:
        blocks = (dense_block(layers),)

    tie_default = mt in ("gemma", "gemma2", "gemma3_text", "gemma3")
    tie = c.get_bool("tie_word_embeddings", default=tie_default)
    if mt == "olmo" and c.get_float("clip_qkv", default=0.0):
        notes.append("OLMo clips q/k/v activations (clip_qkv): no memory effect")
    return Architecture(
        model_type=mt,
        hidden_size=h,
        vocab_size=vocab,
        tie_word_embeddings=tie,
        blocks=blocks,
        norm=norm,
        activation=act,
        embedding_params=vocab * h,
        extra_params=norm_width,
        max_position_embeddings=c.opt_int("max_position_embeddings"),
        notes=tuple(notes),
        hidden_dropout=_hidden_dropout(c),
        attention_dropout=_attention_dropout(c),
    )


def _phi3(c: _Config) -> Architecture:
    """phi3 (Phi-3, Phi-3.5, Phi-4): fused qkv_proj and gate_up_proj (modeling_phi3.py)."""
    h = c.get_int("hidden_size")
    heads = c.get_int("num_attention_heads")
    kv = c.get_int("num_key_value_heads", default=heads)
    hd = c.get_int("head_dim", default=h // heads)
    inter = c.get_int("intermediate_size")
    vocab = c.get_int("vocab_size")
    linears = (
        Linear("qkv_proj", ("q", "k", "v"), h, (heads + 2 * kv) * hd),
        Linear("o_proj", ("o",), heads * hd, h),
        *_gated_mlp(h, inter, fused=True),
    )
    block = Block(
        "decoder",
        c.get_int("num_hidden_layers"),
        heads,
        kv,
        hd,
        linears,
        norm_params=2 * h,
        norm_count=2,
        intermediate_size=inter,
    )
    return Architecture(
        model_type="phi3",
        hidden_size=h,
        vocab_size=vocab,
        tie_word_embeddings=c.get_bool("tie_word_embeddings", default=False),
        blocks=(block,),
        norm="rms",
        activation=c.get_str("hidden_act", default="silu"),
        embedding_params=vocab * h,
        extra_params=h,
        max_position_embeddings=c.opt_int("max_position_embeddings"),
        hidden_dropout=_hidden_dropout(c),
        attention_dropout=_attention_dropout(c),
    )


def _phi(c: _Config) -> Architecture:
    """phi (phi-1, phi-1.5, phi-2): parallel attention + plain MLP, one LayerNorm (modeling_phi.py)."""
    h = c.get_int("hidden_size")
    heads = c.get_int("num_attention_heads")
    kv = c.get_int("num_key_value_heads", default=heads)
    hd = h // heads
    inter = c.get_int("intermediate_size", default=4 * h)
    vocab = c.get_int("vocab_size")
    linears = (
        *_qkvo(h, heads, kv, hd, qkv_bias=True, o_bias=True),
        Linear("fc1", ("up",), h, inter, True),
        Linear("fc2", ("down",), inter, h, True),
    )
    other = 0
    if c.get_bool("qk_layernorm", default=False):
        other = 2 * 2 * hd
    block = Block(
        "decoder",
        c.get_int("num_hidden_layers"),
        heads,
        kv,
        hd,
        linears,
        norm_params=2 * h,
        norm_count=1,
        other_params=other,
        mlp_gated=False,
        intermediate_size=inter,
        parallel_residual=True,
    )
    return Architecture(
        model_type="phi",
        hidden_size=h,
        vocab_size=vocab,
        tie_word_embeddings=c.get_bool("tie_word_embeddings", default=False),
        blocks=(block,),
        norm="layer",
        activation=c.get_str("hidden_act", default="gelu_new"),
        embedding_params=vocab * h,
        extra_params=2 * h,
        lm_head_bias=True,
        max_position_embeddings=c.opt_int("max_position_embeddings"),
        hidden_dropout=_hidden_dropout(c),
        attention_dropout=_attention_dropout(c),
    )


def _gpt2(c: _Config) -> Architecture:
    """gpt2 and gpt_bigcode: fused c_attn, learned positions, tied head (modeling_gpt2.py)."""
    mt = c.model_type
    h = c.get_int("n_embd", "hidden_size")
    heads = c.get_int("n_head", "num_attention_heads")
    hd = h // heads
    inter = c.get_int("n_inner", "intermediate_size", default=4 * h)
    vocab = c.get_int("vocab_size")
    positions = c.get_int("n_positions", "max_position_embeddings")
    kv = 1 if mt == "gpt_bigcode" and c.get_bool("multi_query", default=True) else heads
    linears = (
        Linear("c_attn", ("q", "k", "v"), h, h + 2 * kv * hd, True),
        Linear("c_proj", ("o",), h, h, True),
        Linear("c_fc", ("up",), h, inter, True),
        Linear("mlp.c_proj", ("down",), inter, h, True),
    )
    block = Block(
        "decoder",
        c.get_int("n_layer", "num_hidden_layers"),
        heads,
        kv,
        hd,
        linears,
        norm_params=4 * h,
        norm_count=2,
        mlp_gated=False,
        intermediate_size=inter,
    )
    return Architecture(
        rotary=False,
        model_type=mt,
        hidden_size=h,
        vocab_size=vocab,
        tie_word_embeddings=c.get_bool("tie_word_embeddings", default=True),
        blocks=(block,),
        norm="layer",
        activation=c.get_str("activation_function", default="gelu_new"),
        embedding_params=vocab * h,
        position_embedding_params=positions * h,
        extra_params=2 * h,
        max_position_embeddings=positions,
        hidden_dropout=c.get_float("resid_pdrop", default=0.1),
        attention_dropout=c.get_float("attn_pdrop", default=0.1),
    )


def _gpt_neox(c: _Config) -> Architecture:
    """gpt_neox (Pythia, StableLM-alpha): fused query_key_value, two LayerNorms (modeling_gpt_neox.py)."""
    h = c.get_int("hidden_size")
    heads = c.get_int("num_attention_heads")
    hd = h // heads
    inter = c.get_int("intermediate_size", default=4 * h)
    vocab = c.get_int("vocab_size")
    bias = c.get_bool("attention_bias", default=True)
    linears = (
        Linear("query_key_value", ("q", "k", "v"), h, 3 * h, bias),
        Linear("dense", ("o",), h, h, bias),
        Linear("dense_h_to_4h", ("up",), h, inter, True),
        Linear("dense_4h_to_h", ("down",), inter, h, True),
    )
    parallel = c.get_bool("use_parallel_residual", default=True)
    block = Block(
        "decoder",
        c.get_int("num_hidden_layers"),
        heads,
        heads,
        hd,
        linears,
        norm_params=4 * h,
        norm_count=2,
        mlp_gated=False,
        intermediate_size=inter,
        parallel_residual=parallel,
    )
    return Architecture(
        model_type="gpt_neox",
        hidden_size=h,
        vocab_size=vocab,
        tie_word_embeddings=c.get_bool("tie_word_embeddings", default=False),
        blocks=(block,),
        norm="layer",
        activation=c.get_str("hidden_act", default="gelu"),
        embedding_params=vocab * h,
        extra_params=2 * h,
        max_position_embeddings=c.opt_int("max_position_embeddings"),
        hidden_dropout=_hidden_dropout(c),
        attention_dropout=_attention_dropout(c),
    )


def _falcon(c: _Config) -> Architecture:
    """falcon (7B/40B/180B): fused query_key_value with multi-query or grouped KV (modeling_falcon.py)."""
    h = c.get_int("hidden_size")
    heads = c.get_int("num_attention_heads", "n_head")
    hd = h // heads
    new_arch = c.get_bool("new_decoder_architecture", default=False)
    if new_arch:
        kv = c.get_int("num_kv_heads", "n_head_kv", default=heads)
    elif c.get_bool("multi_query", default=True):
        kv = 1
    else:
        kv = heads
    bias = c.get_bool("bias", default=False)
    inter = c.get_int("ffn_hidden_size", default=4 * h)
    vocab = c.get_int("vocab_size")
    linears = (
        Linear("query_key_value", ("q", "k", "v"), h, (heads + 2 * kv) * hd, bias),
        Linear("dense", ("o",), h, h, bias),
        Linear("dense_h_to_4h", ("up",), h, inter, bias),
        Linear("dense_4h_to_h", ("down",), inter, h, bias),
    )
    parallel = c.get_bool("parallel_attn", default=True)
    n_norms = c.get_int("num_ln_in_parallel_attn", default=2) if new_arch else 1 if parallel else 2
    block = Block(
        "decoder",
        c.get_int("num_hidden_layers", "n_layer"),
        heads,
        kv,
        hd,
        linears,
        norm_params=n_norms * 2 * h,
        norm_count=n_norms,
        mlp_gated=False,
        intermediate_size=inter,
        parallel_residual=parallel or new_arch,
    )
    notes = ("ALiBi positions",) if c.get_bool("alibi", default=False) else ()
    return Architecture(
        rotary=not c.get_bool("alibi", default=False),
        model_type="falcon",
        hidden_size=h,
        vocab_size=vocab,
        tie_word_embeddings=c.get_bool("tie_word_embeddings", default=True),
        blocks=(block,),
        norm="layer",
        activation=c.get_str("activation", default="gelu"),
        embedding_params=vocab * h,
        extra_params=2 * h,
        max_position_embeddings=c.opt_int("max_position_embeddings"),
        notes=notes,
        hidden_dropout=_hidden_dropout(c),
        attention_dropout=_attention_dropout(c),
    )


def _bloom(c: _Config) -> Architecture:
    """bloom: ALiBi, fused query_key_value, an extra LayerNorm after the embedding (modeling_bloom.py)."""
    h = c.get_int("hidden_size", "n_embed")
    heads = c.get_int("n_head", "num_attention_heads")
    hd = h // heads
    vocab = c.get_int("vocab_size")
    inter = 4 * h
    linears = (
        Linear("query_key_value", ("q", "k", "v"), h, 3 * h, True),
        Linear("dense", ("o",), h, h, True),
        Linear("dense_h_to_4h", ("up",), h, inter, True),
        Linear("dense_4h_to_h", ("down",), inter, h, True),
    )
    block = Block(
        "decoder",
        c.get_int("n_layer", "num_hidden_layers"),
        heads,
        heads,
        hd,
        linears,
        norm_params=4 * h,
        norm_count=2,
        mlp_gated=False,
        intermediate_size=inter,
    )
    return Architecture(
        rotary=False,
        model_type="bloom",
        hidden_size=h,
        vocab_size=vocab,
        tie_word_embeddings=c.get_bool("tie_word_embeddings", default=True),
        blocks=(block,),
        norm="layer",
        activation="gelu",
        embedding_params=vocab * h,
        extra_params=4 * h,
        notes=("ALiBi positions",),
        hidden_dropout=c.get_float("hidden_dropout"),
        attention_dropout=c.get_float("attention_dropout"),
    )


def _t5(c: _Config) -> Architecture:
    """t5 / mt5 encoder-decoder (modeling_t5.py): relative position bias in the first layer of each stack."""
    d = c.get_int("d_model", "hidden_size")
    heads = c.get_int("num_heads", "num_attention_heads")
    d_kv = c.get_int("d_kv", default=d // heads)
    inner = heads * d_kv
    d_ff = c.get_int("d_ff", "intermediate_size")
    vocab = c.get_int("vocab_size")
    enc_layers = c.get_int("num_layers", "num_hidden_layers")
    dec_layers = c.get_int("num_decoder_layers", default=enc_layers)
    gated = c.get_str("feed_forward_proj", default="relu").startswith("gated")
    buckets = c.get_int("relative_attention_num_buckets", default=32)
    ff: tuple[Linear, ...]
    if gated:
        ff = (
            Linear("wi_0", ("gate",), d, d_ff),
            Linear("wi_1", ("up",), d, d_ff),
            Linear("wo", ("down",), d_ff, d),
        )
    else:
        ff = (Linear("wi", ("up",), d, d_ff), Linear("wo", ("down",), d_ff, d))
    self_attn = (
        Linear("q", ("q",), d, inner),
        Linear("k", ("k",), d, inner),
        Linear("v", ("v",), d, inner),
        Linear("o", ("o",), inner, d),
    )
    cross_attn = tuple(
        Linear("EncDecAttention." + lin.name, lin.roles, lin.in_features, lin.out_features) for lin in self_attn
    )
    # The relative-position table (buckets x heads) lives in the first layer of each stack; spreading it
    # over the layers keeps every block identical without changing the total.
    enc = Block(
        "encoder",
        enc_layers,
        heads,
        heads,
        d_kv,
        self_attn + ff,
        norm_params=2 * d,
        norm_count=2,
        mlp_gated=gated,
        intermediate_size=d_ff,
    )
    dec = Block(
        "cross-decoder",
        dec_layers,
        heads,
        heads,
        d_kv,
        self_attn + cross_attn + ff,
        norm_params=3 * d,
        norm_count=3,
        mlp_gated=gated,
        intermediate_size=d_ff,
    )
    tie = c.get_bool("tie_word_embeddings", default=True)
    return Architecture(
        rotary=False,
        model_type=c.model_type,
        hidden_size=d,
        vocab_size=vocab,
        tie_word_embeddings=tie,
        blocks=(enc, dec),
        norm="rms",
        activation="gelu" if gated else "relu",
        embedding_params=vocab * d,
        extra_params=2 * d + 2 * buckets * heads,
        notes=("encoder-decoder: seq_len is used for both stacks",),
        hidden_dropout=c.get_float("dropout_rate", default=0.1),
    )


def _siglip_params(v: _Config, text_hidden: int) -> int:
    """SigLIP vision tower + Gemma 3's projector (modeling_siglip.py, modeling_gemma3.py)."""
    hv = v.get_int("hidden_size")
    iv = v.get_int("intermediate_size")
    layers = v.get_int("num_hidden_layers")
    patch = v.get_int("patch_size")
    image = v.get_int("image_size")
    channels = v.get_int("num_channels", default=3)
    patch_embed = channels * patch * patch * hv + hv
    pos_embed = (image // patch) ** 2 * hv
    per_layer = 4 * (hv * hv + hv) + (hv * iv + iv) + (iv * hv + hv) + 2 * 2 * hv
    projector = hv + hv * text_hidden  # mm_soft_emb_norm + mm_input_projection_weight
    return patch_embed + pos_embed + layers * per_layer + 2 * hv + projector


def _gemma3_multimodal(c: _Config) -> Architecture:
    raw_text = c.raw.get("text_config") or {}
    if not isinstance(raw_text, Mapping):
        raise EstimatorError(
            "model.config.text_config", f"must be a JSON object (the language model's config), got {raw_text!r:.100}"
        )
    text = dict(raw_text)
    text.setdefault("model_type", "gemma3_text")
    if "vocab_size" not in text:
        text["vocab_size"] = 262208
    arch = _llama_like(_Config(text))
    vision = c.raw.get("vision_config")
    vision_params = _siglip_params(_Config(vision), arch.hidden_size) if isinstance(vision, dict) else 0
    return replace(
        arch,
        model_type="gemma3",
        vision_params=vision_params,
        notes=(*arch.notes, "the vision tower is counted in the weights; activations are text only"),
    )


_FAMILIES: dict[str, Callable[[_Config], Architecture]] = {
    "llama": _llama_like,
    "mistral": _llama_like,
    "mixtral": _llama_like,
    "qwen2": _llama_like,
    "qwen2_moe": _llama_like,
    "qwen3": _llama_like,
    "qwen3_moe": _llama_like,
    "gemma": _llama_like,
    "gemma2": _llama_like,
    "gemma3_text": _llama_like,
    "gemma3": _gemma3_multimodal,
    "olmo": _llama_like,
    "olmo2": _llama_like,
    "stablelm": _llama_like,
    "phi": _phi,
    "phi3": _phi3,
    "gpt2": _gpt2,
    "gpt_bigcode": _gpt2,
    "gpt_neox": _gpt_neox,
    "falcon": _falcon,
    "bloom": _bloom,
    "t5": _t5,
    "mt5": _t5,
}

SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(sorted(_FAMILIES))


def architecture_from_config(config: Mapping[str, Any]) -> Architecture:
    """Parse an HF config.json into an :class:`Architecture`; unknown families raise EstimatorError."""
    if not isinstance(config, Mapping):
        raise EstimatorError("model.config", "must be a JSON object (the model's config.json)")
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise EstimatorError("model.config.model_type", "missing; it names the architecture family")
    parser = _FAMILIES.get(model_type)
    if parser is None:
        raise EstimatorError(
            "model.config.model_type",
            f"{model_type!r} is not supported; supported: {', '.join(SUPPORTED_MODEL_TYPES)}",
        )
    check_config_sizes(config)
    try:
        arch = parser(_Config(config))
    except ZeroDivisionError:
        raise EstimatorError(
            "model.config", "a size the layer shapes are divided by is zero (heads, patch size)"
        ) from None
    check_architecture_sizes(arch)
    if arch.num_layers == 0 or arch.hidden_size == 0:
        raise EstimatorError("model.config", "num_hidden_layers and hidden_size must be positive")
    for block in arch.blocks:
        if block.num_heads == 0 or block.num_kv_heads == 0 or block.num_heads % block.num_kv_heads:
            raise EstimatorError(
                "model.config.num_key_value_heads",
                f"{block.num_kv_heads} must be positive and divide num_attention_heads ({block.num_heads})",
            )
    return arch
