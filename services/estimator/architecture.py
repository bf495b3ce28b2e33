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
    # "low" where the family is unknown and the shapes come from the standard keys (see _generic_decoder);
    # its notes then name each assumption.
    confidence: Literal["high", "low"] = "high"
    # Bits per parameter the published checkpoint stores for the experts' weight matrices (gpt-oss: MXFP4,
    # 4 bits plus one 8-bit scale per 32 values = 4.25); None where the checkpoint is in the model dtype.
    expert_weight_stored_bits: float | None = None

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
    """llama, mistral, qwen2, qwen3, olmo, olmo2, olmoe, granite, seed_oss, stablelm, gemma(2,3), mixtral,
    qwen2_moe, qwen3_moe.

    transformers ``models/<family>/modeling_<family>.py``: q/k/v/o projections, a gated MLP (or
    experts), RMSNorm (LayerNorm for stablelm, a weightless LayerNorm for olmo). Mistral-Nemo and
    Mistral-Small-3 set ``head_dim`` (128) apart from hidden_size / heads; Granite's embedding, residual,
    attention and logit multipliers are scalars, not parameters.
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
    elif mt == "seed_oss":  # modeling_seed_oss.py: separate biases for q/k/v and for the output
        qkv_bias = c.get_bool("attention_bias", default=True)
        o_bias = c.get_bool("attention_out_bias", default=False)
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
    if mt in ("olmo2", "olmoe"):
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
    if mt in ("mixtral", "olmoe"):
        # OLMoE (modeling_olmoe.py) has Mixtral's sparse block: gate/up/down experts and a bias-free router.
        n_exp = c.get_int("num_local_experts", "num_experts")
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


def _qwen1(c: _Config) -> Architecture:
    """qwen (first-generation Qwen, remote code ``modeling_qwen.py`` in Qwen/Qwen-7B).

    ``c_attn`` is a fused q/k/v with bias, ``attn.c_proj`` has none (``no_bias``). The MLP is
    ``c_proj(w1(x) * silu(w2(x)))`` where each of w1, w2 is ``intermediate_size // 2`` wide: the config's
    ``intermediate_size`` (22016 for Qwen-7B) counts both halves. RMSNorm, untied head.
    """
    h = c.get_int("hidden_size")
    heads = c.get_int("num_attention_heads")
    hd = c.get_int("kv_channels", default=h // heads if heads else 0)
    proj = heads * hd
    half, reading = _qwen1_mlp_half(c, h)
    vocab = c.get_int("vocab_size")
    no_bias = c.get_bool("no_bias", default=True)
    linears = (
        Linear("c_attn", ("q", "k", "v"), h, 3 * proj, True),
        Linear("c_proj", ("o",), proj, h, not no_bias),
        Linear("w2", ("gate",), h, half, not no_bias),
        Linear("w1", ("up",), h, half, not no_bias),
        Linear("mlp.c_proj", ("down",), half, h, not no_bias),
    )
    block = Block(
        "decoder",
        c.get_int("num_hidden_layers"),
        heads,
        heads,
        hd,
        linears,
        norm_params=2 * h,
        norm_count=2,
        intermediate_size=half,
    )
    return Architecture(
        model_type="qwen",
        hidden_size=h,
        vocab_size=vocab,
        tie_word_embeddings=c.get_bool("tie_word_embeddings", default=False),
        blocks=(block,),
        norm="rms",
        activation="silu",
        embedding_params=vocab * h,
        extra_params=h,
        max_position_embeddings=c.opt_int("max_position_embeddings", "seq_length"),
        hidden_dropout=c.get_float("emb_dropout_prob"),
        attention_dropout=c.get_float("attn_dropout_prob"),
        notes=("first-generation Qwen runs remote code (trust_remote_code=True)", reading),
    )


def _qwen1_mlp_half(c: _Config, hidden: int) -> tuple[int, str]:
    """The width of each of first-generation Qwen's two MLP input projections (w1, w2), and how it was read.

    Qwen's own config.json gives both halves together (``intermediate_size`` 22016 for Qwen-7B: w1, w2
    are 11008 wide each). The benchmark plan schema (shared/benchmarks/README.md) stores one half as
    ``intermediate_size`` and keeps Qwen's value as ``qwen_intermediate_size``. Without that key, the
    width tells the two apart: Qwen's own value is 5.35-6x the hidden size for every published Qwen-1
    (1.8B, 7B, 14B, 72B), one gated-MLP projection 2.7-3x (8/3 in the SwiGLU paper, arXiv:2002.05202).
    """
    own = c.raw.get("qwen_intermediate_size")
    if own is not None:
        if c.raw.get("intermediate_size") is not None:
            return c.get_int(
                "intermediate_size"
            ), "Qwen MLP: intermediate_size read as one half (qwen_intermediate_size given)"
        return c.get_int("qwen_intermediate_size") // 2, "Qwen MLP: each half is qwen_intermediate_size / 2"
    value = c.get_int("intermediate_size")
    if value >= 4 * hidden:
        return value // 2, "Qwen MLP: intermediate_size is Qwen's own value (both halves): each half is half of it"
    return value, "Qwen MLP: intermediate_size under 4 x hidden_size read as one half (the plan schema's convention)"


def _moe_layer_count(layers: int, first_dense: int, every: int) -> int:
    """DeepSeek-V2/V3 (modeling_deepseek.py): layer i is MoE when i >= first_k_dense_replace and
    i % moe_layer_freq == 0; the others are dense. Counted arithmetically (no loop over the layers)."""
    if every <= 0 or first_dense >= layers:
        return 0
    start = -(-first_dense // every) * every  # the first multiple of ``every`` at or after first_dense
    return 0 if start >= layers else (layers - 1 - start) // every + 1


def _deepseek(c: _Config) -> Architecture:
    """deepseek_v2 / deepseek_v3 (modeling_deepseek_v2.py, modeling_deepseek_v3.py in transformers; the
    remote code in deepseek-ai/DeepSeek-V2 and DeepSeek-V3 has the same modules).

    Multi-head latent attention (DeepSeek-V2 paper, arXiv:2405.04434, section 2.1): the query goes through
    a low-rank ``q_a_proj`` -> RMSNorm -> ``q_b_proj`` (or one ``q_proj`` where ``q_lora_rank`` is null);
    keys and values share a compressed latent ``kv_a_proj_with_mqa`` (kv_lora_rank plus the decoupled
    RoPE key, qk_rope_head_dim) -> RMSNorm -> ``kv_b_proj`` to every head's no-RoPE key and value. The
    query/key head is qk_nope_head_dim + qk_rope_head_dim wide, the value head v_head_dim.
    DeepSeekMoE: the first ``first_k_dense_replace`` layers are dense; the rest (every ``moe_layer_freq``-th)
    have ``n_routed_experts`` routed experts, ``n_shared_experts`` always-on experts (one MLP
    n_shared x moe_intermediate_size wide) and a router, with a score-correction bias for V3's
    ``noaux_tc`` routing (arXiv:2412.19437, section 2.1.2). V3's multi-token-prediction module
    (``num_nextn_predict_layers``, 14B of the 685B checkpoint) is not built by transformers and not trained
    by default, so it is not counted.
    """
    mt = c.model_type
    h = c.get_int("hidden_size")
    layers = c.get_int("num_hidden_layers")
    heads = c.get_int("num_attention_heads")
    vocab = c.get_int("vocab_size")
    inter = c.get_int("intermediate_size")
    q_rank = c.opt_int("q_lora_rank")
    kv_rank = c.get_int("kv_lora_rank")
    rope_dim = c.get_int("qk_rope_head_dim")
    nope_dim = c.get_int("qk_nope_head_dim")
    v_dim = c.get_int("v_head_dim")
    qk_dim = nope_dim + rope_dim
    bias = c.get_bool("attention_bias", default=False)
    if q_rank:
        q: tuple[Linear, ...] = (
            Linear("q_a_proj", ("q",), h, q_rank, bias),
            Linear("q_b_proj", ("q",), q_rank, heads * qk_dim),
        )
    else:
        q = (Linear("q_proj", ("q",), h, heads * qk_dim),)
    attn = (
        *q,
        Linear("kv_a_proj_with_mqa", ("k", "v"), h, kv_rank + rope_dim, bias),
        Linear("kv_b_proj", ("k", "v"), kv_rank, heads * (nope_dim + v_dim)),
        Linear("o_proj", ("o",), heads * v_dim, h, bias),
    )
    latent_norms = (q_rank or 0) + kv_rank  # q_a_layernorm, kv_a_layernorm

    n_routed = c.get_int("n_routed_experts", default=0)
    moe_layers = _moe_layer_count(
        layers, c.get_int("first_k_dense_replace", default=0), c.get_int("moe_layer_freq", default=1)
    )
    n_moe = moe_layers if n_routed else 0

    def block(count: int, mlp: tuple[Linear, ...], other: int, width: int, k: int = 1, experts: int = 1) -> Block:
        return Block(
            "decoder",
            count,
            heads,
            heads,  # MLA expands the latent to full keys and values for every head in training
            qk_dim,
            attn + mlp,
            norm_params=2 * h,
            norm_count=2,
            other_params=latent_norms + other,
            intermediate_size=width,
            experts_per_token=k,
            num_experts=experts,
        )

    blocks: list[Block] = []
    if layers - n_moe:
        blocks.append(block(layers - n_moe, _gated_mlp(h, inter), 0, inter))
    if n_moe:
        moe_inter = c.get_int("moe_intermediate_size")
        k = c.get_int("num_experts_per_tok")
        shared_inter = moe_inter * c.get_int("n_shared_experts", default=0)
        shared = tuple(
            Linear("shared_experts." + lin.name, lin.roles, lin.in_features, lin.out_features)
            for lin in (_gated_mlp(h, shared_inter) if shared_inter else ())
        )
        router = h * n_routed + (n_routed if c.get_str("topk_method", default="") == "noaux_tc" else 0)
        blocks.append(block(n_moe, _gated_mlp(h, moe_inter, copies=n_routed) + shared, router, moe_inter, k, n_routed))
    notes = ["multi-head latent attention: keys and values are expanded per head from a compressed latent"]
    if c.get_int("num_nextn_predict_layers", default=0):
        notes.append(
            "DeepSeek-V3's multi-token-prediction layer is not loaded by transformers nor trained by default: "
            "not counted"
        )
    return Architecture(
        model_type=mt,
        hidden_size=h,
        vocab_size=vocab,
        tie_word_embeddings=c.get_bool("tie_word_embeddings", default=False),
        blocks=tuple(blocks),
        norm="rms",
        activation=c.get_str("hidden_act", default="silu"),
        embedding_params=vocab * h,
        extra_params=h,
        max_position_embeddings=c.opt_int("max_position_embeddings"),
        attention_dropout=_attention_dropout(c),
        notes=tuple(notes),
    )


# MXFP4 (OCP Microscaling Formats v1.0, section 6.3): blocks of 32 FP4 (E2M1) values share one 8-bit
# E8M0 scale, so 4 + 8 / 32 = 4.25 bits per parameter.
MXFP4_BITS_PER_PARAM = 4.0 + 8.0 / 32.0


def _gpt_oss(c: _Config) -> Architecture:
    """gpt_oss (modeling_gpt_oss.py; OpenAI's gpt-oss model card, arXiv:2508.10925).

    q/k/v/o with biases, one learned attention-sink logit per head, layers alternating between a
    128-token sliding window and full attention (``layer_types``), and a MoE MLP whose experts keep a
    fused gate_up projection with bias and a down projection with bias, chosen by a router with bias.
    The published checkpoints store the experts' weight matrices in MXFP4 (4.25 bits per parameter);
    transformers dequantizes them to bf16 for training.
    """
    h = c.get_int("hidden_size")
    heads = c.get_int("num_attention_heads")
    kv = c.get_int("num_key_value_heads", default=heads)
    hd = c.get_int("head_dim", default=h // heads if heads else 0)
    inter = c.get_int("intermediate_size")
    vocab = c.get_int("vocab_size")
    n_exp = c.get_int("num_local_experts")
    k = c.get_int("num_experts_per_tok", "experts_per_token")
    bias = c.get_bool("attention_bias", default=True)
    linears = (
        *_qkvo(h, heads, kv, hd, bias, bias),
        Linear("gate_up_proj", ("gate", "up"), h, 2 * inter, True, n_exp),
        Linear("down_proj", ("down",), inter, h, True, n_exp),
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
        other_params=heads + h * n_exp + n_exp,  # sinks; router weight and bias
        intermediate_size=inter,
        experts_per_token=k,
        num_experts=n_exp,
    )
    notes = ["attention sinks and alternating sliding-window layers: attention memory is sized as full attention"]
    quant = c.raw.get("quantization_config")
    stored_bits = None
    if isinstance(quant, Mapping) and quant.get("quant_method") == "mxfp4":
        stored_bits = MXFP4_BITS_PER_PARAM
        notes.append("MXFP4 checkpoint: experts stored at 4.25 bits/param, dequantized to bf16 for training")
    return Architecture(
        model_type="gpt_oss",
        hidden_size=h,
        vocab_size=vocab,
        tie_word_embeddings=c.get_bool("tie_word_embeddings", default=False),
        blocks=(block,),
        norm="rms",
        activation="silu",
        embedding_params=vocab * h,
        extra_params=h,
        max_position_embeddings=c.opt_int("max_position_embeddings"),
        attention_dropout=_attention_dropout(c),
        notes=tuple(notes),
        expert_weight_stored_bits=stored_bits,
    )


def _llama4_vision_params(v: _Config, text_hidden: int) -> int:
    """Llama 4's vision encoder, pixel-shuffle adapter and projector (modeling_llama4.py).

    Patch embedding (unfolded patches -> hidden, no bias), a class token, learned positions for every
    patch plus the class token, pre/post LayerNorms, ``num_hidden_layers`` layers of q/k/v/o and fc1/fc2 with
    biases and two LayerNorms, then the pixel-shuffle MLP (intermediate_size -> projector_input_dim ->
    projector_output_dim, no biases) and ``multi_modal_projector`` (vision_output_dim -> text hidden).
    """
    hv = v.get_int("hidden_size")
    iv = v.get_int("intermediate_size")
    patch = v.get_int("patch_size")
    image = v.get_int("image_size")
    channels = v.get_int("num_channels", default=3)
    proj_in = v.get_int("projector_input_dim")
    proj_out = v.get_int("projector_output_dim")
    out_dim = v.get_int("vision_output_dim")
    per_layer = 4 * (hv * hv + hv) + (hv * iv + iv) + (iv * hv + hv) + 2 * 2 * hv
    embeddings = channels * patch * patch * hv + hv + ((image // patch) ** 2 + 1) * hv + 2 * 2 * hv
    adapter = iv * proj_in + proj_out * proj_out
    return embeddings + v.get_int("num_hidden_layers") * per_layer + adapter + out_dim * text_hidden


def _llama4(c: _Config) -> Architecture:
    """llama4 / llama4_text (modeling_llama4.py; Meta's Llama 4 model cards).

    The text model sits in ``text_config``. Layers listed in ``moe_layers`` (by default every
    ``interleave_moe_layer_step``-th: all of Scout's, every second of Maverick's) have ``num_local_experts``
    routed experts (fused gate_up and down, ``intermediate_size`` wide), one shared expert of the same width
    and a bias-free router; the other layers have a dense MLP ``intermediate_size_mlp`` wide. The q/k norm
    is a weightless L2 norm; the vision tower is counted when ``vision_config`` is given.
    """
    text = c.raw.get("text_config")
    t = _Config({"model_type": "llama4_text", **text}) if isinstance(text, Mapping) else c
    h = t.get_int("hidden_size")
    layers = t.get_int("num_hidden_layers")
    heads = t.get_int("num_attention_heads")
    kv = t.get_int("num_key_value_heads", default=heads)
    hd = t.get_int("head_dim", default=h // heads if heads else 0)
    vocab = t.get_int("vocab_size")
    inter = t.get_int("intermediate_size")
    dense_inter = t.get_int("intermediate_size_mlp", default=inter)
    n_exp = t.get_int("num_local_experts")
    k = t.get_int("num_experts_per_tok", default=1)
    step = t.get_int("interleave_moe_layer_step", default=1)
    listed = t.raw.get("moe_layers")
    if isinstance(listed, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in listed):
        n_moe = len({i for i in listed if 0 <= i < layers})
    else:  # layers step-1, 2*step-1, ... (configuration_llama4.py), counted without a loop
        n_moe = (layers - step) // step + 1 if 0 < step <= layers else 0
    attn = _qkvo(h, heads, kv, hd, t.get_bool("attention_bias", default=False), False)
    blocks: list[Block] = []
    if n_moe:
        shared = tuple(
            Linear("shared_expert." + lin.name, lin.roles, lin.in_features, lin.out_features)
            for lin in _gated_mlp(h, inter)
        )
        experts = (
            Linear("experts.gate_up_proj", ("gate", "up"), h, 2 * inter, False, n_exp),
            Linear("experts.down_proj", ("down",), inter, h, False, n_exp),
        )
        blocks.append(
            Block(
                "decoder",
                n_moe,
                heads,
                kv,
                hd,
                attn + experts + shared,
                norm_params=2 * h,
                norm_count=2,
                other_params=h * n_exp,
                intermediate_size=inter,
                experts_per_token=k,
                num_experts=n_exp,
            )
        )
    if layers - n_moe:
        blocks.append(
            Block(
                "decoder",
                layers - n_moe,
                heads,
                kv,
                hd,
                attn + _gated_mlp(h, dense_inter),
                norm_params=2 * h,
                norm_count=2,
                intermediate_size=dense_inter,
            )
        )
    vision = c.raw.get("vision_config")
    vision_params = _llama4_vision_params(_Config(vision), h) if isinstance(vision, Mapping) else 0
    tie = c.get_bool("tie_word_embeddings", default=t.get_bool("tie_word_embeddings", default=False))
    return Architecture(
        model_type=c.model_type,
        hidden_size=h,
        vocab_size=vocab,
        tie_word_embeddings=tie,
        blocks=tuple(blocks),
        norm="rms",
        activation=t.get_str("hidden_act", default="silu"),
        embedding_params=vocab * h,
        extra_params=h,
        max_position_embeddings=t.opt_int("max_position_embeddings"),
        attention_dropout=_attention_dropout(t),
        vision_params=vision_params,
        notes=("Llama 4 alternates chunked-attention and global (NoPE) layers: attention memory sized as full",),
    )


def _internlm2(c: _Config) -> Architecture:
    """internlm2 (remote code ``modeling_internlm2.py`` in internlm/internlm2-7b): fused ``wqkv``, ``wo``,
    feed_forward w1 (gate) / w3 (up) / w2 (down), RMSNorm, untied ``output`` head."""
    h = c.get_int("hidden_size")
    heads = c.get_int("num_attention_heads")
    kv = c.get_int("num_key_value_heads", default=heads)
    hd = h // heads if heads else 0
    inter = c.get_int("intermediate_size")
    vocab = c.get_int("vocab_size")
    bias = c.get_bool("bias", default=False)
    linears = (
        Linear("wqkv", ("q", "k", "v"), h, (heads + 2 * kv) * hd, bias),
        Linear("wo", ("o",), heads * hd, h, bias),
        Linear("w1", ("gate",), h, inter),
        Linear("w3", ("up",), h, inter),
        Linear("w2", ("down",), inter, h),
    )
    block = Block("decoder", c.get_int("num_hidden_layers"), heads, kv, hd, linears, 2 * h, 2, intermediate_size=inter)
    return Architecture(
        model_type="internlm2",
        hidden_size=h,
        vocab_size=vocab,
        tie_word_embeddings=c.get_bool("tie_word_embeddings", default=False),
        blocks=(block,),
        norm="rms",
        activation=c.get_str("hidden_act", default="silu"),
        embedding_params=vocab * h,
        extra_params=h,
        max_position_embeddings=c.opt_int("max_position_embeddings"),
        notes=("InternLM2 runs remote code (trust_remote_code=True)",),
    )


def _baichuan(c: _Config) -> Architecture:
    """baichuan (Baichuan 2, remote code ``modeling_baichuan.py`` in baichuan-inc/Baichuan2-7B-Base and
    -13B-Base): fused ``W_pack`` q/k/v without bias, o_proj, gate/up/down, RMSNorm, an untied NormHead.

    The 7B uses RoPE and declares ``max_position_embeddings``; the 13B uses ALiBi and declares only
    ``model_max_length``.
    """
    h = c.get_int("hidden_size")
    heads = c.get_int("num_attention_heads")
    hd = h // heads if heads else 0
    inter = c.get_int("intermediate_size")
    vocab = c.get_int("vocab_size")
    linears = (
        Linear("W_pack", ("q", "k", "v"), h, 3 * h),
        Linear("o_proj", ("o",), h, h),
        *_gated_mlp(h, inter),
    )
    block = Block(
        "decoder", c.get_int("num_hidden_layers"), heads, heads, hd, linears, 2 * h, 2, intermediate_size=inter
    )
    rope = c.raw.get("max_position_embeddings") is not None
    return Architecture(
        rotary=rope,
        model_type="baichuan",
        hidden_size=h,
        vocab_size=vocab,
        tie_word_embeddings=c.get_bool("tie_word_embeddings", default=False),
        blocks=(block,),
        norm="rms",
        activation=c.get_str("hidden_act", default="silu"),
        embedding_params=vocab * h,
        extra_params=h,
        max_position_embeddings=c.opt_int("max_position_embeddings", "model_max_length"),
        notes=("Baichuan runs remote code (trust_remote_code=True)",) + (() if rope else ("ALiBi positions",)),
    )


def _chatglm(c: _Config) -> Architecture:
    """chatglm (ChatGLM2/3-6B and GLM-4-9B, remote code ``modeling_chatglm.py`` in THUDM/chatglm3-6b and
    THUDM/glm-4-9b).

    ``query_key_value`` projects to the heads' queries plus ``multi_query_group_num`` key/value groups
    (``kv_channels`` wide) with bias (``add_qkv_bias``); ``dense``, ``dense_h_to_4h`` (a fused gate and up,
    2 x ffn_hidden_size) and ``dense_4h_to_h`` carry a bias only with ``add_bias_linear``. RMSNorm (or
    LayerNorm without ``rmsnorm``), a final norm with ``post_layer_norm``, an untied ``output_layer`` over
    ``padded_vocab_size``.
    """
    h = c.get_int("hidden_size")
    heads = c.get_int("num_attention_heads")
    hd = c.get_int("kv_channels", default=h // heads if heads else 0)
    groups = (
        c.get_int("multi_query_group_num", default=heads)
        if c.get_bool("multi_query_attention", default=False)
        else heads
    )
    ffn = c.get_int("ffn_hidden_size")
    vocab = c.get_int("padded_vocab_size", "vocab_size")
    linear_bias = c.get_bool("add_bias_linear", default=False)
    qkv_bias = linear_bias or c.get_bool("add_qkv_bias", default=False)
    rms = c.get_bool("rmsnorm", default=True)
    norm_width = h if rms else 2 * h
    linears = (
        Linear("query_key_value", ("q", "k", "v"), h, (heads + 2 * groups) * hd, qkv_bias),
        Linear("dense", ("o",), heads * hd, h, linear_bias),
        Linear("dense_h_to_4h", ("gate", "up"), h, 2 * ffn, linear_bias),
        Linear("dense_4h_to_h", ("down",), ffn, h, linear_bias),
    )
    block = Block(
        "decoder",
        c.get_int("num_layers", "num_hidden_layers"),
        heads,
        groups,
        hd,
        linears,
        norm_params=2 * norm_width,
        norm_count=2,
        intermediate_size=ffn,
    )
    return Architecture(
        model_type="chatglm",
        hidden_size=h,
        vocab_size=vocab,
        tie_word_embeddings=c.get_bool("tie_word_embeddings", default=False),
        blocks=(block,),
        norm="rms" if rms else "layer",
        activation="silu",
        embedding_params=vocab * h,
        extra_params=norm_width if c.get_bool("post_layer_norm", default=True) else 0,
        max_position_embeddings=c.opt_int("seq_length", "max_position_embeddings"),
        hidden_dropout=c.get_float("hidden_dropout"),
        attention_dropout=c.get_float("attention_dropout"),
        notes=("ChatGLM runs remote code (trust_remote_code=True)",),
    )


def _glm(c: _Config) -> Architecture:
    """glm and glm4 (modeling_glm.py, modeling_glm4.py: GLM-4-9B-chat-hf, GLM-4-9B-0414, GLM-4-32B-0414).

    q/k/v with bias (``attention_bias``), o_proj without, a fused ``gate_up_proj`` and ``down_proj``;
    glm4 adds ``post_self_attn_layernorm`` and ``post_mlp_layernorm`` (four RMSNorms per layer).
    """
    mt = c.model_type
    h = c.get_int("hidden_size")
    heads = c.get_int("num_attention_heads")
    kv = c.get_int("num_key_value_heads", default=heads)
    hd = c.get_int("head_dim", default=h // heads if heads else 0)
    inter = c.get_int("intermediate_size")
    vocab = c.get_int("vocab_size")
    norms = 4 if mt == "glm4" else 2
    linears = (
        *_qkvo(h, heads, kv, hd, c.get_bool("attention_bias", default=True), False),
        *_gated_mlp(h, inter, fused=True),
    )
    block = Block(
        "decoder", c.get_int("num_hidden_layers"), heads, kv, hd, linears, norms * h, norms, intermediate_size=inter
    )
    return Architecture(
        model_type=mt,
        hidden_size=h,
        vocab_size=vocab,
        tie_word_embeddings=c.get_bool("tie_word_embeddings", default=False),
        blocks=(block,),
        norm="rms",
        activation=c.get_str("hidden_act", default="silu"),
        embedding_params=vocab * h,
        extra_params=h,
        max_position_embeddings=c.opt_int("max_position_embeddings"),
        attention_dropout=_attention_dropout(c),
    )


def _cohere(c: _Config) -> Architecture:
    """cohere and cohere2 (modeling_cohere.py, modeling_cohere2.py: Command-R, Command-R+, Command R7B, A).

    One LayerNorm (weight, no bias) feeds attention and MLP in parallel; q/k/o and gate/up/down without
    bias; ``use_qk_norm`` adds per-head LayerNorm weights over q and k (Command-R+); the head is tied to
    the embedding.
    """
    h = c.get_int("hidden_size")
    heads = c.get_int("num_attention_heads")
    kv = c.get_int("num_key_value_heads", default=heads)
    hd = c.get_int("head_dim", default=h // heads if heads else 0)
    inter = c.get_int("intermediate_size")
    vocab = c.get_int("vocab_size")
    bias = c.get_bool("attention_bias", default=False)
    other = (heads + kv) * hd if c.get_bool("use_qk_norm", default=False) else 0
    block = Block(
        "decoder",
        c.get_int("num_hidden_layers"),
        heads,
        kv,
        hd,
        _qkvo(h, heads, kv, hd, bias, bias) + _gated_mlp(h, inter),
        norm_params=h,
        norm_count=1,
        other_params=other,
        intermediate_size=inter,
        parallel_residual=True,
    )
    return Architecture(
        model_type=c.model_type,
        hidden_size=h,
        vocab_size=vocab,
        tie_word_embeddings=c.get_bool("tie_word_embeddings", default=True),
        blocks=(block,),
        norm="layer",
        activation=c.get_str("hidden_act", default="silu"),
        embedding_params=vocab * h,
        extra_params=h,
        max_position_embeddings=c.opt_int("max_position_embeddings"),
        attention_dropout=_attention_dropout(c),
    )


def _phimoe(c: _Config) -> Architecture:
    """phimoe (Phi-3.5-MoE, modeling_phimoe.py): q/k/v/o with bias, LayerNorms with bias, Mixtral-style
    experts w1/w3/w2 and a bias-free router, an untied head with bias (``lm_head_bias``)."""
    h = c.get_int("hidden_size")
    heads = c.get_int("num_attention_heads")
    kv = c.get_int("num_key_value_heads", default=heads)
    hd = c.get_int("head_dim", default=h // heads if heads else 0)
    inter = c.get_int("intermediate_size")
    vocab = c.get_int("vocab_size")
    n_exp = c.get_int("num_local_experts")
    bias = c.get_bool("attention_bias", default=True)
    block = Block(
        "decoder",
        c.get_int("num_hidden_layers"),
        heads,
        kv,
        hd,
        _qkvo(h, heads, kv, hd, bias, bias) + _gated_mlp(h, inter, copies=n_exp),
        norm_params=2 * 2 * h,
        norm_count=2,
        other_params=h * n_exp,
        intermediate_size=inter,
        experts_per_token=c.get_int("num_experts_per_tok", default=2),
        num_experts=n_exp,
    )
    return Architecture(
        model_type="phimoe",
        hidden_size=h,
        vocab_size=vocab,
        tie_word_embeddings=c.get_bool("tie_word_embeddings", default=False),
        blocks=(block,),
        norm="layer",
        activation=c.get_str("hidden_act", default="silu"),
        embedding_params=vocab * h,
        extra_params=2 * h,
        lm_head_bias=c.get_bool("lm_head_bias", default=True),
        max_position_embeddings=c.opt_int("max_position_embeddings"),
        hidden_dropout=_hidden_dropout(c),
        attention_dropout=_attention_dropout(c),
    )


def _glm4_moe(c: _Config) -> Architecture:
    """glm4_moe (GLM-4.5, GLM-4.5-Air; modeling_glm4_moe.py, arXiv:2508.06471).

    Grouped-query attention with q/k/v biases (``attention_bias``), an o_proj without, optional per-head
    q/k RMSNorms (``use_qk_norm``). The first ``first_k_dense_replace`` layers have a dense MLP
    (``intermediate_size``); the others ``n_routed_experts`` experts of ``moe_intermediate_size``, shared
    experts n_shared x moe_intermediate_size wide and a sigmoid router with a score-correction bias (as
    DeepSeek-V3). The multi-token-prediction layers (``num_nextn_predict_layers``) are not built by
    transformers nor trained by default: not counted.
    """
    h = c.get_int("hidden_size")
    layers = c.get_int("num_hidden_layers")
    heads = c.get_int("num_attention_heads")
    kv = c.get_int("num_key_value_heads", default=heads)
    hd = c.get_int("head_dim", default=h // heads if heads else 0)
    vocab = c.get_int("vocab_size")
    inter = c.get_int("intermediate_size")
    attn = _qkvo(h, heads, kv, hd, c.get_bool("attention_bias", default=True), False)
    qk_norm = 2 * hd if c.get_bool("use_qk_norm", default=False) else 0
    n_routed = c.get_int("n_routed_experts", default=0)
    n_moe = max(0, layers - c.get_int("first_k_dense_replace", default=0)) if n_routed else 0
    blocks: list[Block] = []
    if layers - n_moe:
        blocks.append(
            Block(
                "decoder",
                layers - n_moe,
                heads,
                kv,
                hd,
                attn + _gated_mlp(h, inter),
                norm_params=2 * h,
                norm_count=2,
                other_params=qk_norm,
                intermediate_size=inter,
            )
        )
    if n_moe:
        moe_inter = c.get_int("moe_intermediate_size")
        shared_inter = moe_inter * c.get_int("n_shared_experts", default=0)
        shared = tuple(
            Linear("shared_experts." + lin.name, lin.roles, lin.in_features, lin.out_features)
            for lin in (_gated_mlp(h, shared_inter) if shared_inter else ())
        )
        blocks.append(
            Block(
                "decoder",
                n_moe,
                heads,
                kv,
                hd,
                attn + _gated_mlp(h, moe_inter, copies=n_routed) + shared,
                norm_params=2 * h,
                norm_count=2,
                other_params=qk_norm + h * n_routed + n_routed,  # router weight and score-correction bias
                intermediate_size=moe_inter,
                experts_per_token=c.get_int("num_experts_per_tok"),
                num_experts=n_routed,
            )
        )
    notes = []
    if c.get_int("num_nextn_predict_layers", default=0):
        notes.append(
            "GLM-4.5's multi-token-prediction layer is not loaded by transformers nor trained by default: not counted"
        )
    return Architecture(
        model_type="glm4_moe",
        hidden_size=h,
        vocab_size=vocab,
        tie_word_embeddings=c.get_bool("tie_word_embeddings", default=False),
        blocks=tuple(blocks),
        norm="rms",
        activation=c.get_str("hidden_act", default="silu"),
        embedding_params=vocab * h,
        extra_params=h,
        max_position_embeddings=c.opt_int("max_position_embeddings"),
        attention_dropout=_attention_dropout(c),
        notes=tuple(notes),
    )


# --------------------------------------------------------------------------------------------------
# Any other decoder-only config: the standard keys and their common aliases

_SIZE_KEYS: dict[str, tuple[str, ...]] = {
    "hidden_size": ("hidden_size", "n_embd", "d_model", "n_embed", "dim", "model_dim", "embed_dim"),
    "num_hidden_layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "num_decoder_layers"),
    "num_attention_heads": ("num_attention_heads", "n_head", "num_heads", "n_heads", "decoder_attention_heads"),
    "vocab_size": ("vocab_size", "padded_vocab_size", "n_vocab"),
}
_KV_KEYS = ("num_key_value_heads", "num_kv_heads", "n_head_kv", "n_kv_heads", "multi_query_group_num")
_INTER_KEYS = (
    "intermediate_size",
    "ffn_hidden_size",
    "n_inner",
    "d_ff",
    "ffn_dim",
    "inner_hidden_size",
    "decoder_ffn_dim",
    "mlp_dim",
)
_HEAD_DIM_KEYS = ("head_dim", "kv_channels", "d_kv", "attention_head_dim")
_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
_TOP_K_KEYS = ("num_experts_per_tok", "experts_per_token", "moe_top_k", "num_selected_experts")
_BIAS_KEYS = ("attention_bias", "bias", "use_bias", "add_bias_linear")
_GATED_ACTIVATIONS = ("silu", "swiglu", "swish", "geglu", "gelu_pytorch_tanh", "gelu_tanh", "reglu")


def _first_key(c: _Config, names: tuple[str, ...]) -> str | None:
    return next((n for n in names if c.raw.get(n) is not None), None)


def _generic_decoder(c: _Config) -> Architecture:
    """A decoder-only model of an unknown family, from the keys every HF config carries (and their
    aliases in GPT-2, Falcon, MPT, T5-style and Megatron-style configs): a pre-norm transformer with q/k/v/o
    projections and a gated MLP where the activation is a GLU-style one (SiLU/SwiGLU; a plain up/down
    MLP otherwise), RMSNorm, no biases unless the config says so. Each assumption is named in the notes
    and the estimate is marked ``confidence: low``.
    """
    found = {name: _first_key(c, keys) for name, keys in _SIZE_KEYS.items()}
    missing = [f"{name} (or {', '.join(_SIZE_KEYS[name][1:])})" for name, key in found.items() if key is None]
    if missing:
        raise EstimatorError(
            "model.config",
            f"model_type {c.model_type!r} is not a known family and its config lacks the sizes needed for a generic "
            f"estimate: {'; '.join(missing)}. Known families: {', '.join(SUPPORTED_MODEL_TYPES)}",
        )
    h = c.get_int(*_SIZE_KEYS["hidden_size"])
    layers = c.get_int(*_SIZE_KEYS["num_hidden_layers"])
    heads = c.get_int(*_SIZE_KEYS["num_attention_heads"])
    vocab = c.get_int(*_SIZE_KEYS["vocab_size"])
    notes = [f"model_type {c.model_type!r} is not a known family: estimated from its standard keys (confidence: low)"]

    kv_key = _first_key(c, _KV_KEYS)
    if kv_key is not None:
        kv = c.get_int(kv_key)
    elif c.get_bool("multi_query", default=False):
        kv = 1
        notes.append("assumed 1 key/value head (multi_query: true)")
    else:
        kv = heads
        notes.append("assumed one key/value head per attention head (no num_key_value_heads)")
    hd_key = _first_key(c, _HEAD_DIM_KEYS)
    hd = c.get_int(hd_key) if hd_key else (h // heads if heads else 0)
    if hd_key is None:
        notes.append("assumed head_dim = hidden_size / num_attention_heads")

    act = c.get_str("hidden_act", "activation_function", "hidden_activation", "activation", default="silu")
    gated = act.lower() in _GATED_ACTIVATIONS
    if c.raw.get("hidden_act") is None and c.raw.get("activation_function") is None:
        notes.append("assumed a SiLU-gated MLP (no activation named)")
    else:
        notes.append(f"assumed a {'gated (gate/up/down)' if gated else 'plain (up/down)'} MLP for activation {act!r}")
    inter_key = _first_key(c, _INTER_KEYS)
    if inter_key is not None:
        inter = c.get_int(inter_key)
    else:
        inter = 4 * h
        notes.append("assumed intermediate_size = 4 x hidden_size (no intermediate size given)")

    bias_key = next((n for n in _BIAS_KEYS if isinstance(c.raw.get(n), bool)), None)
    bias = bool(c.raw[bias_key]) if bias_key else False
    notes.append(f"assumed q/k/v/o and MLP {'with' if bias else 'without'} biases, RMSNorm before attention and MLP")
    if c.raw.get("tie_word_embeddings") is None:
        notes.append("assumed an untied output head (no tie_word_embeddings): the larger of the two")
    tie = c.get_bool("tie_word_embeddings", default=False)

    mlp: tuple[Linear, ...]
    experts_key = _first_key(c, _EXPERT_KEYS)
    n_exp = c.get_int(experts_key) if experts_key else 1
    k = 1
    if n_exp > 1:
        k_key = _first_key(c, _TOP_K_KEYS)
        k = c.get_int(k_key) if k_key else 2
        inter = c.get_int("moe_intermediate_size", default=inter)
        notes.append(
            f"mixture of experts: {n_exp} experts, {k} per token"
            + ("" if k_key else " (assumed: no experts-per-token key)")
            + "; every layer assumed sparse, no shared experts"
        )
    if gated:
        mlp = _gated_mlp(h, inter, bias, copies=n_exp)
    else:
        mlp = (Linear("up_proj", ("up",), h, inter, bias, n_exp), Linear("down_proj", ("down",), inter, h, bias, n_exp))
    if c.get_bool("is_encoder_decoder", default=False):
        notes.append("encoder-decoder config: estimated as its decoder stack only")
    block = Block(
        "decoder",
        layers,
        heads,
        kv,
        hd,
        _qkvo(h, heads, kv, hd, bias, bias) + mlp,
        norm_params=2 * h,
        norm_count=2,
        other_params=h * n_exp if n_exp > 1 else 0,
        mlp_gated=gated,
        intermediate_size=inter,
        experts_per_token=k,
        num_experts=n_exp,
    )
    return Architecture(
        model_type=c.model_type,
        hidden_size=h,
        vocab_size=vocab,
        tie_word_embeddings=tie,
        blocks=(block,),
        norm="rms",
        activation=act,
        embedding_params=vocab * h,
        extra_params=h,
        max_position_embeddings=c.opt_int("max_position_embeddings", "n_positions", "seq_length"),
        hidden_dropout=_hidden_dropout(c),
        attention_dropout=_attention_dropout(c),
        notes=tuple(notes),
        confidence="low",
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
    "qwen": _qwen1,
    "deepseek_v2": _deepseek,
    "deepseek_v3": _deepseek,
    "gpt_oss": _gpt_oss,
    "llama4": _llama4,
    "llama4_text": _llama4,
    "internlm2": _internlm2,
    "baichuan": _baichuan,
    "chatglm": _chatglm,
    "glm": _glm,
    "glm4": _glm,
    "cohere": _cohere,
    "cohere2": _cohere,
    "granite": _llama_like,
    "olmoe": _llama_like,
    "phimoe": _phimoe,
    "glm4_moe": _glm4_moe,
    "seed_oss": _llama_like,
}

SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(sorted(_FAMILIES))


def architecture_from_config(config: Mapping[str, Any]) -> Architecture:
    """Parse an HF config.json into an :class:`Architecture`. An unknown family gets a generic decoder
    (``confidence: low``); only a config without the sizes raises EstimatorError."""
    if not isinstance(config, Mapping):
        raise EstimatorError("model.config", "must be a JSON object (the model's config.json)")
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise EstimatorError("model.config.model_type", "missing; it names the architecture family")
    # An unknown family is estimated from the standard keys (low confidence), never refused.
    parser = _FAMILIES.get(model_type, _generic_decoder)
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
