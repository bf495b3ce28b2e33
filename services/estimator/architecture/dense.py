"""Dense decoder families whose layout follows Llama's (transformers ``models/<family>/modeling_<family>.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from services.estimator.architecture.config import (
    Config,
    attention_dropout_of,
    gated_mlp,
    hidden_dropout_of,
    int_list,
    qkvo,
    sparse_layer_count,
)
from services.estimator.architecture.model import Architecture, Block, Linear, NormKind
from services.estimator.errors import EstimatorError


def _softcap(c: Config, key: str, gemma2_default: float) -> float:
    """A logit soft-cap from the config, 0 for none. Gemma2Config defaults both caps when the key is absent
    (attn_logit_softcapping=50.0, final_logit_softcapping=30.0, transformers configuration_gemma2.py); an
    explicit null turns the cap off, as Gemma 3 configs do."""
    if key not in c.raw:
        return gemma2_default if c.model_type == "gemma2" else 0.0
    return c.get_float(key, default=0.0)


# Families whose transformers config defaults num_key_value_heads to None (every head: LlamaConfig, OlmoConfig,
# Olmo2Config, GraniteConfig), and those whose head_dim default is a number of its own (Qwen3Config and
# Qwen3MoeConfig 128, GemmaConfig, Gemma2Config and Gemma3TextConfig 256, SeedOssConfig 128).
_KV_HEADS_DEFAULT_ALL = frozenset({"llama", "olmo", "olmo2", "granite"})
_OWN_HEAD_DIM = frozenset({"qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3_text", "seed_oss"})


def llama_like(c: Config) -> Architecture:
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
    # Missing, these take transformers' default only where it is ours (the class's None: all heads, hidden / heads);
    # elsewhere its default is a number of its own (Mistral 8 KV heads, Qwen3 head_dim 128, Gemma 256: a probe found
    # Qwen3-32B sized 30.5B for 32.8B), so the key is required.
    kv_heads = c.get_int("num_key_value_heads", default=heads if mt in _KV_HEADS_DEFAULT_ALL else None)
    head_dim = c.get_int("head_dim", default=h // heads if heads and mt not in _OWN_HEAD_DIM else None)
    vocab = c.get_int("vocab_size")
    # Every MLP reads it but a Qwen MoE's with no dense layer (missing, it was taken as 0: an 8B model of 2.4B).
    inter = c.get_int("intermediate_size", default=0 if mt in ("qwen2_moe", "qwen3_moe") else None)
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

    attn = qkvo(h, heads, kv_heads, head_dim, qkv_bias, o_bias)
    act = c.get_str("hidden_act", "hidden_activation", default="silu")

    def dense_block(count: int) -> Block:
        return Block(
            "decoder",
            count,
            heads,
            kv_heads,
            head_dim,
            attn + gated_mlp(h, inter, mlp_bias),
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
                attn + gated_mlp(h, inter, copies=n_exp),
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
        sparse_count = sparse_layer_count(layers, step, int_list(c, "mlp_only_layers"))
        experts = gated_mlp(h, moe_inter, copies=n_exp)
        shared: tuple[Linear, ...] = ()
        router = h * n_exp
        shared_inter = c.get_int("shared_expert_intermediate_size", default=0)
        if shared_inter:
            shared = tuple(
                Linear("shared_" + lin.name, lin.roles, lin.in_features, lin.out_features)
                for lin in gated_mlp(h, shared_inter)
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
        if layers > sparse_count and not inter:
            c.get_int("intermediate_size")  # its dense layers need it: missing, an error naming it
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
        hidden_dropout=hidden_dropout_of(c),
        attention_dropout=attention_dropout_of(c),
        attention_logit_softcap=_softcap(c, "attn_logit_softcapping", 50.0),
        final_logit_softcap=_softcap(c, "final_logit_softcapping", 30.0),
    )


def phi3(c: Config) -> Architecture:
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
        *gated_mlp(h, inter, fused=True),
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
        hidden_dropout=hidden_dropout_of(c),
        attention_dropout=attention_dropout_of(c),
    )


def phi(c: Config) -> Architecture:
    """phi (phi-1, phi-1.5, phi-2): parallel attention + plain MLP, one LayerNorm (modeling_phi.py)."""
    h = c.get_int("hidden_size")
    heads = c.get_int("num_attention_heads")
    kv = c.get_int("num_key_value_heads", default=heads)
    hd = h // heads
    inter = c.get_int("intermediate_size")  # PhiConfig's default is 8192, not 4 x hidden: required
    vocab = c.get_int("vocab_size")
    linears = (
        *qkvo(h, heads, kv, hd, qkv_bias=True, o_bias=True),
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
        hidden_dropout=hidden_dropout_of(c),
        attention_dropout=attention_dropout_of(c),
    )


def _siglip_params(v: Config, text_hidden: int) -> int:
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


def gemma3_multimodal(c: Config) -> Architecture:
    raw_text = c.raw.get("text_config") or {}
    if not isinstance(raw_text, Mapping):
        raise EstimatorError(
            "model.config.text_config", f"must be a JSON object (the language model's config), got {raw_text!r:.100}"
        )
    text = dict(raw_text)
    text.setdefault("model_type", "gemma3_text")
    if "vocab_size" not in text:
        text["vocab_size"] = 262208
    arch = llama_like(Config(text))
    vision = c.raw.get("vision_config")
    vision_params = _siglip_params(Config(vision), arch.hidden_size) if isinstance(vision, dict) else 0
    return replace(
        arch,
        model_type="gemma3",
        vision_params=vision_params,
        notes=(*arch.notes, "the vision tower is counted in the weights; activations are text only"),
    )


def glm(c: Config) -> Architecture:
    """glm and glm4 (modeling_glm.py, modeling_glm4.py: GLM-4-9B-chat-hf, GLM-4-9B-0414, GLM-4-32B-0414).

    q/k/v with bias (``attention_bias``), o_proj without, a fused ``gate_up_proj`` and ``down_proj``;
    glm4 adds ``post_self_attn_layernorm`` and ``post_mlp_layernorm`` (four RMSNorms per layer).
    """
    mt = c.model_type
    h = c.get_int("hidden_size")
    heads = c.get_int("num_attention_heads")
    kv = c.get_int("num_key_value_heads")  # GlmConfig's default is 2, not every head: required
    hd = c.get_int("head_dim", default=h // heads if heads else 0)
    inter = c.get_int("intermediate_size")
    vocab = c.get_int("vocab_size")
    norms = 4 if mt == "glm4" else 2
    linears = (
        *qkvo(h, heads, kv, hd, c.get_bool("attention_bias", default=True), False),
        *gated_mlp(h, inter, fused=True),
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
        attention_dropout=attention_dropout_of(c),
    )


def cohere(c: Config) -> Architecture:
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
        qkvo(h, heads, kv, hd, bias, bias) + gated_mlp(h, inter),
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
        attention_dropout=attention_dropout_of(c),
    )
