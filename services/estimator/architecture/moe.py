"""Mixture-of-experts families with their own layouts (DeepSeek, gpt-oss, Llama 4, PhiMoE, GLM-4.5)."""

from __future__ import annotations

from collections.abc import Mapping

from services.estimator.architecture.config import Config, attention_dropout_of, gated_mlp, hidden_dropout_of, qkvo
from services.estimator.architecture.model import Architecture, Block, Linear


def moe_layer_count(layers: int, first_dense: int, every: int) -> int:
    """DeepSeek-V2/V3 (modeling_deepseek.py): layer i is MoE when i >= first_k_dense_replace and
    i % moe_layer_freq == 0; the others are dense. Counted arithmetically (no loop over the layers)."""
    if every <= 0 or first_dense >= layers:
        return 0
    start = -(-first_dense // every) * every  # the first multiple of ``every`` at or after first_dense
    return 0 if start >= layers else (layers - 1 - start) // every + 1


def deepseek(c: Config) -> Architecture:
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
    # Null is a full q_proj; missing, transformers' default rank (1536) applies, which is no reason to guess: required.
    q_rank = c.opt_int("q_lora_rank") if "q_lora_rank" in c.raw else c.get_int("q_lora_rank")
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

    # Missing, the routed experts were 0 (every layer dense: DeepSeek-V3 sized 37B for 671B) and V3's dense lead 0;
    # transformers' defaults are 64 and 256 routed, 2 and 1 shared, V3's first 3 layers dense (V2's 0 is ours).
    n_routed = c.get_int("n_routed_experts")
    first_dense = c.get_int("first_k_dense_replace", default=0 if mt == "deepseek_v2" else None)
    moe_layers = moe_layer_count(layers, first_dense, c.get_int("moe_layer_freq", default=1))
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
        blocks.append(block(layers - n_moe, gated_mlp(h, inter), 0, inter))
    if n_moe:
        moe_inter = c.get_int("moe_intermediate_size")
        k = c.get_int("num_experts_per_tok")
        shared_inter = moe_inter * c.get_int("n_shared_experts")
        shared = tuple(
            Linear("shared_experts." + lin.name, lin.roles, lin.in_features, lin.out_features)
            for lin in (gated_mlp(h, shared_inter) if shared_inter else ())
        )
        router = h * n_routed + (n_routed if c.get_str("topk_method", default="") == "noaux_tc" else 0)
        blocks.append(block(n_moe, gated_mlp(h, moe_inter, copies=n_routed) + shared, router, moe_inter, k, n_routed))
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
        attention_dropout=attention_dropout_of(c),
        notes=tuple(notes),
    )


# MXFP4 (OCP Microscaling Formats v1.0, section 6.3): blocks of 32 FP4 (E2M1) values share one 8-bit
# E8M0 scale, so 4 + 8 / 32 = 4.25 bits per parameter.
MXFP4_BITS_PER_PARAM = 4.0 + 8.0 / 32.0


def gpt_oss(c: Config) -> Architecture:
    """gpt_oss (modeling_gpt_oss.py; OpenAI's gpt-oss model card, arXiv:2508.10925).

    q/k/v/o with biases, one learned attention-sink logit per head, layers alternating between a
    128-token sliding window and full attention (``layer_types``), and a MoE MLP whose experts keep a
    fused gate_up projection with bias and a down projection with bias, chosen by a router with bias.
    The published checkpoints store the experts' weight matrices in MXFP4 (4.25 bits per parameter);
    transformers dequantizes them to bf16 for training.
    """
    h = c.get_int("hidden_size")
    heads = c.get_int("num_attention_heads")
    kv = c.get_int("num_key_value_heads")  # GptOssConfig's defaults are 8 and 64, not every head and hidden / heads
    hd = c.get_int("head_dim")
    inter = c.get_int("intermediate_size")
    vocab = c.get_int("vocab_size")
    n_exp = c.get_int("num_local_experts")
    k = c.get_int("num_experts_per_tok", "experts_per_token")
    bias = c.get_bool("attention_bias", default=True)
    linears = (
        *qkvo(h, heads, kv, hd, bias, bias),
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
        attention_dropout=attention_dropout_of(c),
        notes=tuple(notes),
        expert_weight_stored_bits=stored_bits,
    )


def _llama4_vision_params(v: Config, text_hidden: int) -> int:
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


def llama4(c: Config) -> Architecture:
    """llama4 / llama4_text (modeling_llama4.py; Meta's Llama 4 model cards).

    The text model sits in ``text_config``. Layers listed in ``moe_layers`` (by default every
    ``interleave_moe_layer_step``-th: all of Scout's, every second of Maverick's) have ``num_local_experts``
    routed experts (fused gate_up and down, ``intermediate_size`` wide), one shared expert of the same width
    and a bias-free router; the other layers have a dense MLP ``intermediate_size_mlp`` wide. The q/k norm
    is a weightless L2 norm; the vision tower is counted when ``vision_config`` is given.
    """
    text = c.raw.get("text_config")
    t = Config({"model_type": "llama4_text", **text}) if isinstance(text, Mapping) else c
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
    attn = qkvo(h, heads, kv, hd, t.get_bool("attention_bias", default=False), False)
    blocks: list[Block] = []
    if n_moe:
        shared = tuple(
            Linear("shared_expert." + lin.name, lin.roles, lin.in_features, lin.out_features)
            for lin in gated_mlp(h, inter)
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
                attn + gated_mlp(h, dense_inter),
                norm_params=2 * h,
                norm_count=2,
                intermediate_size=dense_inter,
            )
        )
    vision = c.raw.get("vision_config")
    vision_params = _llama4_vision_params(Config(vision), h) if isinstance(vision, Mapping) else 0
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
        attention_dropout=attention_dropout_of(t),
        vision_params=vision_params,
        notes=("Llama 4 alternates chunked-attention and global (NoPE) layers: attention memory sized as full",),
    )


def phimoe(c: Config) -> Architecture:
    """phimoe (Phi-3.5-MoE, modeling_phimoe.py): q/k/v/o with bias, LayerNorms with bias, Mixtral-style
    experts w1/w3/w2 and a bias-free router, an untied head with bias (``lm_head_bias``)."""
    h = c.get_int("hidden_size")
    heads = c.get_int("num_attention_heads")
    kv = c.get_int("num_key_value_heads")  # PhimoeConfig's default is 8, not every head: required
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
        qkvo(h, heads, kv, hd, bias, bias) + gated_mlp(h, inter, copies=n_exp),
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
        hidden_dropout=hidden_dropout_of(c),
        attention_dropout=attention_dropout_of(c),
    )


def glm4_moe(c: Config) -> Architecture:
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
    kv = c.get_int("num_key_value_heads")  # Glm4MoeConfig's default is 8, not every head: required
    hd = c.get_int("head_dim", default=h // heads if heads else 0)
    vocab = c.get_int("vocab_size")
    inter = c.get_int("intermediate_size")
    attn = qkvo(h, heads, kv, hd, c.get_bool("attention_bias", default=True), False)
    qk_norm = 2 * hd if c.get_bool("use_qk_norm", default=False) else 0
    # Missing, each was 0: every layer dense (GLM-4.5-Air sized 12.4B for 106.9B); transformers' defaults are 128, 1, 1.
    n_routed = c.get_int("n_routed_experts")
    n_moe = max(0, layers - c.get_int("first_k_dense_replace")) if n_routed else 0
    blocks: list[Block] = []
    if layers - n_moe:
        blocks.append(
            Block(
                "decoder",
                layers - n_moe,
                heads,
                kv,
                hd,
                attn + gated_mlp(h, inter),
                norm_params=2 * h,
                norm_count=2,
                other_params=qk_norm,
                intermediate_size=inter,
            )
        )
    if n_moe:
        moe_inter = c.get_int("moe_intermediate_size")
        shared_inter = moe_inter * c.get_int("n_shared_experts")
        shared = tuple(
            Linear("shared_experts." + lin.name, lin.roles, lin.in_features, lin.out_features)
            for lin in (gated_mlp(h, shared_inter) if shared_inter else ())
        )
        blocks.append(
            Block(
                "decoder",
                n_moe,
                heads,
                kv,
                hd,
                attn + gated_mlp(h, moe_inter, copies=n_routed) + shared,
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
        attention_dropout=attention_dropout_of(c),
        notes=tuple(notes),
    )
