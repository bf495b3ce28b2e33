"""Families that run remote code (``trust_remote_code=True``): first-generation Qwen, InternLM2, Baichuan, ChatGLM."""

from __future__ import annotations

from services.estimator.architecture.config import Config, gated_mlp
from services.estimator.architecture.model import Architecture, Block, Linear


def qwen1(c: Config) -> Architecture:
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


def _qwen1_mlp_half(c: Config, hidden: int) -> tuple[int, str]:
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


def internlm2(c: Config) -> Architecture:
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


def baichuan(c: Config) -> Architecture:
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
        *gated_mlp(h, inter),
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


def chatglm(c: Config) -> Architecture:
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
