"""Families with fused projections, learned or ALiBi positions, or an encoder (GPT-2, GPT-NeoX, Falcon, BLOOM, T5)."""

from __future__ import annotations

from services.estimator.architecture.config import Config, attention_dropout_of, hidden_dropout_of
from services.estimator.architecture.model import Architecture, Block, Linear


def gpt2(c: Config) -> Architecture:
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


def gpt_neox(c: Config) -> Architecture:
    """gpt_neox (Pythia, StableLM-alpha): fused query_key_value, two LayerNorms (modeling_gpt_neox.py)."""
    h = c.get_int("hidden_size")
    heads = c.get_int("num_attention_heads")
    hd = h // heads
    inter = c.get_int("intermediate_size")  # GPTNeoXConfig's default is 24576, not 4 x hidden: required
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
        hidden_dropout=hidden_dropout_of(c),
        attention_dropout=attention_dropout_of(c),
    )


def falcon(c: Config) -> Architecture:
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
        hidden_dropout=hidden_dropout_of(c),
        attention_dropout=attention_dropout_of(c),
    )


def bloom(c: Config) -> Architecture:
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


def t5(c: Config) -> Architecture:
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
