"""Any other decoder-only config: the standard keys and their common aliases (confidence: low)."""

from __future__ import annotations

from services.estimator.architecture.config import (
    Config,
    attention_dropout_of,
    first_key,
    gated_mlp,
    hidden_dropout_of,
    qkvo,
)
from services.estimator.architecture.model import Architecture, Block, Linear
from services.estimator.errors import EstimatorError

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


def generic_decoder(c: Config, known: tuple[str, ...]) -> Architecture:
    """A decoder-only model of an unknown family, from the keys every HF config carries (and their
    aliases in GPT-2, Falcon, MPT, T5-style and Megatron-style configs): a pre-norm transformer with q/k/v/o
    projections and a gated MLP where the activation is a GLU-style one (SiLU/SwiGLU; a plain up/down
    MLP otherwise), RMSNorm, no biases unless the config says so. Each assumption is named in the notes
    and the estimate is marked ``confidence: low``.
    """
    found = {name: first_key(c, keys) for name, keys in _SIZE_KEYS.items()}
    missing = [f"{name} (or {', '.join(_SIZE_KEYS[name][1:])})" for name, key in found.items() if key is None]
    if missing:
        raise EstimatorError(
            "model.config",
            f"model_type {c.model_type!r} is not a known family and its config lacks the sizes needed for a generic "
            f"estimate: {'; '.join(missing)}. Known families: {', '.join(known)}",
        )
    h = c.get_int(*_SIZE_KEYS["hidden_size"])
    layers = c.get_int(*_SIZE_KEYS["num_hidden_layers"])
    heads = c.get_int(*_SIZE_KEYS["num_attention_heads"])
    vocab = c.get_int(*_SIZE_KEYS["vocab_size"])
    notes = [f"model_type {c.model_type!r} is not a known family: estimated from its standard keys (confidence: low)"]

    kv_key = first_key(c, _KV_KEYS)
    if kv_key is not None:
        kv = c.get_int(kv_key)
    elif c.get_bool("multi_query", default=False):
        kv = 1
        notes.append("assumed 1 key/value head (multi_query: true)")
    else:
        kv = heads
        notes.append("assumed one key/value head per attention head (no num_key_value_heads)")
    hd_key = first_key(c, _HEAD_DIM_KEYS)
    hd = c.get_int(hd_key) if hd_key else (h // heads if heads else 0)
    if hd_key is None:
        notes.append("assumed head_dim = hidden_size / num_attention_heads")

    act = c.get_str("hidden_act", "activation_function", "hidden_activation", "activation", default="silu")
    gated = act.lower() in _GATED_ACTIVATIONS
    if c.raw.get("hidden_act") is None and c.raw.get("activation_function") is None:
        notes.append("assumed a SiLU-gated MLP (no activation named)")
    else:
        notes.append(f"assumed a {'gated (gate/up/down)' if gated else 'plain (up/down)'} MLP for activation {act!r}")
    inter_key = first_key(c, _INTER_KEYS)
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
    experts_key = first_key(c, _EXPERT_KEYS)
    n_exp = c.get_int(experts_key) if experts_key else 1
    k = 1
    if n_exp > 1:
        k_key = first_key(c, _TOP_K_KEYS)
        k = c.get_int(k_key) if k_key else 2
        inter = c.get_int("moe_intermediate_size", default=inter)
        notes.append(
            f"mixture of experts: {n_exp} experts, {k} per token"
            + ("" if k_key else " (assumed: no experts-per-token key)")
            + "; every layer assumed sparse, no shared experts"
        )
    if gated:
        mlp = gated_mlp(h, inter, bias, copies=n_exp)
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
        qkvo(h, heads, kv, hd, bias, bias) + mlp,
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
        hidden_dropout=hidden_dropout_of(c),
        attention_dropout=attention_dropout_of(c),
        notes=tuple(notes),
        confidence="low",
    )
