"""Activations: the tensors autograd saves for backward, per layer and token.

Sources: the transformers / torchtune / LitGPT modelling code (RMSNorm upcasts to fp32, SDPA saves
q, k, v, out and the log-sum-exp; a gated MLP saves gate, act(gate) and up); Korthikanti et al. 2022
(arXiv 2205.05198) for the per-layer method.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.estimator.architecture import Architecture, Block, Linear
from services.estimator.memo import Memo, quick_init
from services.estimator.memory.segments import segment_tail_bytes
from services.estimator.memory.states import lora_roles_of
from services.estimator.plan import Plan
from services.estimator.recipe import Recipe

# Frameworks that run soft-capped attention (Gemma 2) outside SDPA: transformers' Gemma2 model (the Trainer,
# axolotl, a hand-written loop over it) and LitGPT. torchtune's gemma2 builders keep SDPA and skip the
# attention cap ("Since `nn.SPDA` doesn't support SoftCapping, soft capping is skipped",
# torchtune/models/gemma2/_component_builders.py); Unsloth runs its own kernels.
SOFTCAP_EAGER_FRAMEWORKS = frozenset({"hf-trainer", "pytorch", "axolotl", "litgpt"})


def attention_softcapped(arch: Architecture, recipe: Recipe) -> bool:
    """Whether attention scores are soft-capped by PyTorch ops (tanh of the scores, outside any kernel)."""
    return bool(arch.attention_logit_softcap) and recipe.framework in SOFTCAP_EAGER_FRAMEWORKS


def _attention_impl(arch: Architecture, recipe: Recipe) -> str:
    # transformers' BLOOM and T5 have no SDPA path, and Falcon falls back to math attention (scores
    # kept in fp32) when a padding mask is present (measured in benchmarks/mechanisms).
    if arch.model_type in ("bloom", "t5", "mt5", "falcon"):
        return "eager"
    # SDPA has no soft-capping: transformers' Gemma2 refuses it (``_supports_sdpa = False  # sdpa does not
    # support softcapping``, modeling_gemma2.py in 5.x; 4.42-4.47 swapped a default "sdpa" for "eager" in
    # Gemma2PreTrainedModel._check_and_enable_sdpa), and LitGPT takes its own eager path when
    # attention_logit_softcapping is set (MultiHeadSelfAttention._use_eager_sdpa). flash-attn (>= 2.6) caps
    # inside its kernel, so "flash" stays flash.
    if recipe.attention == "sdpa" and attention_softcapped(arch, recipe):
        return "eager"
    return recipe.attention


def kv_heads_copied(block: Block, arch: Architecture, recipe: Recipe) -> bool:
    """Whether grouped/multi-query K and V reach attention as full-width copies that autograd keeps.

    transformers' repeat_kv (Llama family, SDPA and eager) is expand + reshape, which copies. Its
    gpt_bigcode SDPA attention instead expands the single K/V head as a view ("These expand should
    not be too expansive as they do not do memory copy", modeling_gpt_bigcode.py, GPTBigCodeSdpaAttention
    in transformers 4.36-4.47), so a multi-query StarCoder/SantaCoder layer saves one K/V head, not 48.
    """
    if not recipe.expands_kv or block.num_kv_heads == block.num_heads:
        return False
    return arch.model_type != "gpt_bigcode"


def _attention_saves(block: Block, arch: Architecture, recipe: Recipe, qkv: list[Linear], eager: bool) -> float:
    """Bytes per token SDPA keeps: q, k, v, the output and the fp32 log-sum-exp (FlashAttention-2,
    algorithm 2), where a kept *view* keeps its whole base tensor alive. Eager attention keeps q and k for
    the score matmul and v for the value matmul, but neither an output (the value matmul's output is saved
    only by a consumer that needs it, counted there) nor a log-sum-exp (its scores are counted apart).

    LitGPT computes q, k and v with one fused linear and, for multi-head attention, passes v on as a
    view of that output, so saving v keeps all of it (q and k are new tensors after RoPE). Repeating
    grouped K/V heads makes copies instead. transformers' fused models (GPT-NeoX, Phi-3) hand SDPA
    tensors of their own. Both measured with torch.autograd.graph.saved_tensors_hooks
    (benchmarks/mechanisms).
    """
    a = recipe.compute_bytes
    heads, kv_heads, hd = block.num_heads, block.num_kv_heads, block.head_dim
    kv_copied = kv_heads_copied(block, arch, recipe)
    kv_width = heads if kv_copied else kv_heads
    q, k, v = a * heads * hd, a * kv_width * hd, a * kv_width * hd
    fused = recipe.fused_qkv or arch.model_type == "gpt_bigcode"
    if fused and not kv_copied:
        fused_bytes = a * hd * (heads + 2 * kv_heads)
        if arch.rotary:
            v = fused_bytes
        else:
            q, k, v = fused_bytes, 0, 0
    if eager:
        return q + k + v
    return q + k + v + a * heads * hd + 4 * heads


UNSLOTH_FUSED_ROLES = frozenset({"q", "k", "v", "o", "gate", "up", "down"})


def unsloth_fused_block(block: Block, plan: Plan, recipe: Recipe) -> bool:
    """Whether Unsloth runs the block through its own autograd functions: a dense gated-MLP block whose
    seven projections all carry LoRA adapters without dropout (unsloth/kernels/fast_lora.py: LoRA_QKV,
    LoRA_W, LoRA_MLP; Unsloth patches a layer with them only for dropout 0 and no bias, else it keeps
    PEFT's modules)."""
    if not recipe.fused_lora_kernels or plan.method == "full" or recipe.lora_dropout > 0:
        return False
    if not block.mlp_gated or block.num_experts > 1 or block.kind != "decoder":
        return False
    adapted = {role for lin in block.linears for role in lora_roles_of(lin, recipe)}
    return adapted >= UNSLOTH_FUSED_ROLES


def unsloth_block_saved_bytes_per_token(block: Block, arch: Architecture, recipe: Recipe) -> dict[str, float]:
    """What Unsloth's kernels keep for backward in one block, per token (unsloth/kernels).

    Fast_RMS_Layernorm keeps its input and the fp32 inverse RMS per row (rms_layernorm.py); LoRA_QKV keeps
    only its input X (q, k, v are recomputed from nothing: their gradients come from the attention);
    the RoPE kernel rotates q and k in place and keeps the cos/sin tables; flash attention keeps q, k, v,
    its output and the log-sum-exp; LoRA_W (the output projection) keeps its input, which is that
    output; LoRA_MLP keeps X and the gate and up outputs e and g, and rebuilds silu(e) * g in its
    backward in place (``ctx.save_for_backward(..., X, e, g)``). The adapters' rank-wide products are
    recomputed.
    """
    a = recipe.compute_bytes
    h = arch.hidden_size
    heads, kv_heads, hd = block.num_heads, block.num_kv_heads, block.head_dim
    return {
        "norms": block.norm_count * (recipe.residual_bytes * h + 4),
        "attention_input": a * h,
        "attention_qkv_out": a * hd * (2 * heads + 2 * kv_heads) + 4 * heads,
        "mlp_input": a * h,
        "mlp_hidden": 2 * a * block.intermediate_size,
    }


def block_saved_bytes_per_token(
    block: Block, arch: Architecture, plan: Plan, recipe: Recipe, seq_len: int
) -> dict[str, float]:
    """Bytes per token that autograd keeps for backward in one block, by what holds them.

    The rules: a linear saves its input when its weight trains, when it carries a LoRA adapter, or when
    it is a bitsandbytes 4/8-bit layer (MatMul4Bit/MatMul8bitLt keep the input in ctx); inputs shared by
    several layers are kept once. Norms keep their input (RMSNorm upcasts to fp32 first).
    """
    if unsloth_fused_block(block, plan, recipe):
        return unsloth_block_saved_bytes_per_token(block, arch, recipe)
    a = recipe.compute_bytes
    res = recipe.residual_bytes
    h = arch.hidden_size
    full = plan.method == "full"
    bnb_quant = plan.quantized is not None and recipe.quant_backend == "bitsandbytes"
    heads, kv_heads, hd = block.num_heads, block.num_kv_heads, block.head_dim
    saves: dict[str, float] = {}

    def add(name: str, value: float) -> None:
        if value:
            saves[name] = saves.get(name, 0.0) + value

    # An adapter reads the base layer's input tensor itself only when it shares it: PEFT's per-module
    # cast copy or a LoRA dropout output is a separate tensor (counted under "lora" below).
    adapter_shares_input = recipe.adapter_input_bytes == 0 and recipe.lora_dropout == 0

    def needs_input(linears: list[Linear]) -> bool:
        adapted = adapter_shares_input and any(lora_roles_of(lin, recipe) for lin in linears)
        return full or bnb_quant or adapted

    # Under autocast (the -mixed precisions) every linear casts its fp32 input to 16-bit itself, and
    # a trained linear keeps its own cast copy; in pure 16-bit the consumers share one tensor.
    per_linear_casts = recipe.residual_bytes != a

    def input_copies(linears: list[Linear]) -> int:
        if not needs_input(linears):
            return 0
        if not per_linear_casts:
            return 1
        return sum(1 for lin in linears if full or bnb_quant) or 0

    def by_role(*roles: str, cross: bool = False) -> list[Linear]:
        return [
            lin
            for lin in block.linears
            if set(lin.roles) & set(roles) and lin.name.startswith("EncDecAttention.") == cross
        ]

    # Norms: the Python RMSNorm of transformers/LitGPT/torchtune upcasts its input to fp32 and keeps
    # it, plus the normalized 16-bit tensor when its weight trains. torch's native LayerNorm keeps only
    # its input (and per-token mean/rstd); two LayerNorms over the same input (GPT-NeoX's parallel
    # residual) keep it once.
    if arch.norm == "rms" and recipe.fused_norm_saves:
        add("norms", block.norm_count * compiled_rms_norm_bytes_per_token(h, res))
    elif arch.norm == "rms":
        add("norms", block.norm_count * h * (4 + (rms_norm_scaled_bytes(arch, recipe) if full else 0)))
    else:
        distinct_inputs = 1 if block.parallel_residual else block.norm_count
        add("norms", distinct_inputs * h * res)

    attn_sets = [(by_role("q", "k", "v"), by_role("o"), False)]
    if block.kind == "cross-decoder":
        attn_sets.append((by_role("q", "k", "v", cross=True), by_role("o", cross=True), True))
    impl = _attention_impl(arch, recipe)
    for qkv, out_proj, _cross in attn_sets:
        add("attention_input", input_copies(qkv) * a * h)
        add("attention_qkv_out", _attention_saves(block, arch, recipe, qkv, impl == "eager"))
        if impl == "eager":
            # Eager attention keeps the score matrix: softmax output in fp32 (HF upcasts) and its
            # 16-bit copy for the value matmul, plus the dropout mask when dropout is active.
            add("attention_scores", heads * seq_len * (4 + a))
            if attention_softcapped(arch, recipe):
                # scores / cap, tanh, * cap (eager_attention_forward with softcap): tanh keeps its output,
                # one more score matrix in the compute dtype. (LitGPT's newer eager path keeps the tanh and
                # softmax outputs in fp32 instead: 8 bytes per score either way at 16-bit.)
                add("attention_scores", heads * seq_len * a)
            if recipe.model_dropout and arch.attention_dropout > 0:
                add("attention_scores", heads * seq_len * 1)
        add("attention_output_proj_input", input_copies(out_proj) * a * heads * hd)
        if recipe.model_dropout and arch.hidden_dropout > 0:
            add("dropout_masks", h)

    # MLP
    k = block.experts_per_token
    inter = block.intermediate_size
    mlp_in_lins = by_role("gate", "up")
    down = by_role("down")
    if not (block.parallel_residual and block.norm_count == 1 and not per_linear_casts):
        add("mlp_input", input_copies(mlp_in_lins) * a * h)
    if block.num_experts > 1:
        # HF MoE layers gather each expert's tokens (a copy) and scale its output by the routing weight.
        add("moe_routing", k * a * h * (2 if needs_input(mlp_in_lins) else 1))
    if block.mlp_gated:
        # gate output, act(gate), up output; compiled or Liger's SwiGLU, act(gate) is recomputed from the gate output.
        add("mlp_hidden", k * (2 if recipe.fused_swiglu_saves else 3) * a * inter)
    else:
        # Inductor fuses HF's Python gelu_new chain into one kernel that keeps only its input.
        gelu_saves = 4 if (recipe.python_gelu and arch.activation == "gelu_new" and not recipe.compiled) else 1
        add("mlp_hidden", k * gelu_saves * a * inter)
    add("mlp_down_input", input_copies(down) * k * a * inter)
    if recipe.model_dropout and arch.hidden_dropout > 0:
        add("dropout_masks", h)

    # LoRA adapters: lora_A keeps its input and lora_B keeps lora_A's output (r values per token). PEFT
    # casts the input to the adapter's fp32 dtype per module (peft/tuners/lora/layer.py,
    # _cast_input_dtype), so each adapted module keeps its own copy (16-bit under autocast); with
    # lora_dropout > 0 the dropout output is a new tensor and its mask is kept as well.
    rank_bytes = a if recipe.adapter_input_bytes == a and recipe.adapter_bytes != a else recipe.adapter_bytes
    input_bytes = recipe.adapter_input_bytes
    if recipe.lora_dropout > 0:
        input_bytes = (input_bytes or a) + 1
    litgpt_qkv_done = False
    for lin in block.linears:
        roles = lora_roles_of(lin, recipe)
        if not roles:
            continue
        copies = k if lin.copies > 1 else 1
        add("lora", copies * recipe.lora_rank * len(roles) * rank_bytes)
        if recipe.fused_qkv and set(lin.roles) <= {"q", "k", "v"}:
            # LitGPT fuses q, k and v into one LoRA layer (LoRAQKVLinear): one input for the three,
            # and when only some are adapted, zero_pad index-copies B's output into the fused width;
            # index_copy keeps that source for backward.
            if litgpt_qkv_done:
                continue
            litgpt_qkv_done = True
            enabled = [r for r in ("q", "k", "v") if r in recipe.lora_targets]
            if len(enabled) < 3:
                add("lora", sum(heads * hd if r == "q" else kv_heads * hd for r in enabled) * recipe.adapter_bytes)
        add("lora", copies * lin.in_features * input_bytes)
    return saves


# Gemma's RMSNorm scales in fp32 and casts after: ``output * (1.0 + self.weight.float())`` then
# ``type_as(x)`` (GemmaRMSNorm / Gemma2RMSNorm / Gemma3RMSNorm, "Llama does x.to(float16) * w whilst Gemma is
# (x * w).to(float16)", transformers PR #29402).
FP32_SCALED_RMS_NORM_TYPES = frozenset({"gemma", "gemma2", "gemma3_text", "gemma3"})


def rms_norm_scaled_bytes(arch: Architecture, recipe: Recipe) -> int:
    """Bytes per element of the normalised tensor an RMSNorm keeps for its weight's gradient: Llama's
    ``weight * x.to(input_dtype)`` keeps the tensor in the residual dtype, Gemma's fp32 product keeps it in
    fp32."""
    return 4 if arch.model_type in FP32_SCALED_RMS_NORM_TYPES else recipe.residual_bytes


def compiled_rms_norm_bytes_per_token(hidden: int, input_bytes: int) -> float:
    """What one RMSNorm keeps under torch.compile: its input in the residual dtype and the fp32 rstd.

    Inductor's min-cut partitioner (torch/_functorch/partitioners.py,
    min_cut_rematerialization_partition) recomputes pointwise ops in backward instead of saving their
    outputs, so the fp32 upcast of the input and the normalized tensor are rebuilt from the input and
    the per-token reduction. Measured with saved_tensors_hooks on transformers' Llama layers, each
    compiled with inductor on the CPU (benchmarks/mechanisms, "compiled layers": 8,520 bytes per token
    per layer against 11,944 eager; this rule with the gated-MLP one predicts 8,776): the fp32 copy
    disappears, the 16-bit input and a 4-byte rstd per token stay.
    """
    return float(input_bytes * hidden + 4)


def _checkpointed_block_bytes_per_token(block: Block, arch: Architecture, plan: Plan, recipe: Recipe) -> float:
    """What a checkpointed block keeps: its input, or per-op selective saves (torchtitan's policy).

    torchtitan's selective AC saves the outputs of every other matmul and of SDPA
    (torchtitan/models/llama3/infra/parallelize.py, _save_list and the mm_count policy).
    """
    a = recipe.compute_bytes
    h = arch.hidden_size
    kept = recipe.residual_bytes * h
    if recipe.checkpoint_granularity == "selective":
        mm_outputs = [
            lin.out_features if lin.copies == 1 else lin.out_features * block.experts_per_token for lin in block.linears
        ]
        kept += a * sum(mm_outputs[::2])  # the 1st, 3rd, ... matmul of the block
        kept += a * block.num_heads * block.head_dim + 4 * block.num_heads  # SDPA output and log-sum-exp
    return kept


def backward_transient_bytes_per_token(block: Block, arch: Architecture, recipe: Recipe, plan: Plan) -> float:
    """Gradients alive while one block's backward runs: the MLP hidden gradients (gate, up and their
    product) and two residual-stream gradients, in the compute dtype. Unsloth's LoRA_MLP backward makes one
    hidden-wide gradient and turns it, e and g into the three it needs in place (swiglu_DWf_DW_dfg_kernel);
    Liger's LigerSiLUMulFunction.backward writes the gate's and up's gradients into its saved a and b
    (liger_kernel/ops/swiglu.py, ``_swiglu_backward_kernel`` stores da into a_ptr, db into b_ptr), so only the
    product's gradient is new."""
    a = recipe.compute_bytes
    in_place_swiglu = recipe.kernels == "liger" and block.mlp_gated
    hidden_grads = 1 if unsloth_fused_block(block, plan, recipe) or in_place_swiglu else 2
    return (
        block.experts_per_token * hidden_grads * a * block.intermediate_size
        + 2 * recipe.residual_bytes * arch.hidden_size
    )


@quick_init
@dataclass(frozen=True)
class Activations:
    saved: float  # bytes kept on the GPU for backward at the end of the forward pass
    recompute: float  # bytes of one block's activations rebuilt during backward (checkpointing)
    backward_transient: float  # gradients of one block's intermediates during its backward
    per_layer_per_token: dict[str, float]  # breakdown of one (the largest) block, bytes/token
    offloaded: float = 0.0  # bytes moved to host memory by activation offloading
    refetched: float = 0.0  # offloaded bytes back on the GPU while one block's backward runs
    # Segment tails of the kept activations, alive at the step's peak. Each layer's saved tensors are taken
    # one per kind (per_layer_per_token's keys, or the block input alone under checkpointing): this
    # undercounts tensors of a kind, whose tails are each under 2 MiB. LLM widths are multiples of large
    # powers of two, so the tails are often zero.
    segment_tails: float = 0.0


def offload_stash_bytes(largest_tensor: float, offloaded: float, recipe: Recipe) -> float:
    """GPU bytes still held by activation offloading at the end of the forward pass: the last few
    offloaded tensors, whose copies to the host may still be in flight."""
    return min(offloaded, recipe.offload_in_flight_tensors * largest_tensor)


def _largest_saved_tensor_bytes(block: Block, arch: Architecture, plan: Plan, recipe: Recipe) -> float:
    """The biggest single tensor a block saves: its input under checkpointing, else the widest of the
    residual stream, an MLP hidden tensor and the attention output."""
    return float(
        _largest_saved_bytes_per_token(block, arch, plan.gradient_checkpointing, recipe) * plan.tokens_per_micro_batch
    )


def _largest_saved_bytes_per_token(block: Block, arch: Architecture, checkpointing: bool, recipe: Recipe) -> int:
    residual = recipe.residual_bytes * arch.hidden_size
    if checkpointing:
        return residual
    a = recipe.compute_bytes
    return max(residual, 4 * arch.hidden_size, a * block.intermediate_size, a * block.num_heads * block.head_dim)


# Per-token activation terms memoised by value: what they read of the plan is its method, whether it is
# quantized, its checkpointing and (for eager attention's scores) its sequence length.
ACTIVATION_CACHE_SIZE = 256


@dataclass(frozen=True)
class _Terms:
    """Per token, what a plan's activations are made of (``activation_terms``)."""

    # Per block: (saved bytes by holder, their sum, bytes kept for backward, widest saved tensor, backward
    # transient).
    blocks: tuple[tuple[dict[str, float], float, float, int, float], ...]
    # Final norm and the head's input (kept when the head trains or is a bitsandbytes layer), and the
    # embedding dropout mask.
    norm_per_token: float
    head_input_width: int
    dropout_mask: bool


def activation_terms(arch: Architecture, plan: Plan, recipe: Recipe) -> _Terms:
    """The per-token terms of the plan's activations; the key holds every plan field they read."""
    key = (arch, recipe, plan.method, plan.quantized, plan.gradient_checkpointing, plan.seq_len)
    return _TERMS.get(key, lambda: _compute_terms(arch, plan, recipe))


def _compute_terms(arch: Architecture, plan: Plan, recipe: Recipe) -> _Terms:
    out = []
    for block in arch.blocks:
        per_token = block_saved_bytes_per_token(block, arch, plan, recipe, plan.seq_len)
        block_total = sum(per_token.values())
        kept = (
            _checkpointed_block_bytes_per_token(block, arch, plan, recipe)
            if plan.gradient_checkpointing
            else block_total
        )
        widest = _largest_saved_bytes_per_token(block, arch, plan.gradient_checkpointing, recipe)
        transient = backward_transient_bytes_per_token(block, arch, recipe, plan)
        out.append((per_token, block_total, kept, widest, transient))
    h = arch.hidden_size
    norm_in = 4 if arch.norm == "rms" else recipe.residual_bytes
    norm_per_token = float(h * norm_in)
    if arch.norm == "rms" and plan.method == "full" and arch.model_type in FP32_SCALED_RMS_NORM_TYPES:
        norm_per_token += 4 * h  # the final norm's fp32 product, kept for its weight's gradient
    if recipe.fused_norm_saves and arch.norm == "rms":
        norm_per_token = compiled_rms_norm_bytes_per_token(h, recipe.residual_bytes)
    head_trains = plan.method == "full" or "lm_head" in recipe.lora_targets
    head_keeps_input = head_trains or (plan.quantized is not None and recipe.quantize_lm_head)
    return _Terms(
        blocks=tuple(out),
        norm_per_token=norm_per_token,
        head_input_width=recipe.compute_bytes if head_keeps_input else 0,
        dropout_mask=bool(recipe.model_dropout and arch.hidden_dropout > 0),
    )


_TERMS: Memo[_Terms] = Memo(ACTIVATION_CACHE_SIZE)


def clear_activation_cache() -> None:
    """Forget the memoised per-token terms (tests that count the work of one estimate start from none)."""
    _TERMS.clear()


def activation_bytes(plan: Plan, arch: Architecture, recipe: Recipe) -> Activations:
    tokens = plan.tokens_per_micro_batch
    saved = 0.0
    biggest_block = 0.0
    biggest_kept = 0.0
    biggest_tensor = 0.0
    biggest_breakdown: dict[str, float] = {}
    transient = 0.0
    tails = 0.0
    terms = activation_terms(arch, plan, recipe)
    checkpointed = plan.gradient_checkpointing
    for block, (per_token, block_total, kept, widest, transient_per_token) in zip(
        arch.blocks, terms.blocks, strict=True
    ):
        if block_total > biggest_block:
            biggest_block, biggest_breakdown = block_total, dict(per_token)
        saved += block.count * kept * tokens
        if checkpointed:
            tails += block.count * segment_tail_bytes(kept * tokens)
        else:
            tails += block.count * sum(segment_tail_bytes(kind * tokens) for kind in per_token.values())
        biggest_kept = max(biggest_kept, kept * tokens)
        biggest_tensor = max(biggest_tensor, float(widest * tokens))
        transient = max(transient, transient_per_token * tokens)

    h = arch.hidden_size
    head_input = tokens * h * terms.head_input_width
    norm_and_masks = tokens * terms.norm_per_token
    if terms.dropout_mask:
        norm_and_masks += tokens * h

    recompute = biggest_block * tokens if plan.gradient_checkpointing else 0.0
    if recipe.activation_offloading:
        # Everything saved inside the model's forward goes to host memory except the output head's
        # input: torchtune wraps the head in NoOpManager because it is needed again at once
        # (get_act_offloading_ctx_manager). In backward each block's tensors come back just before
        # its backward runs ("all activations will either be recomputed later in the backward or
        # brought back from the CPU": torchtune docs, memory_optimizations.rst).
        offloaded = saved + norm_and_masks
        kept_on_gpu = offload_stash_bytes(biggest_tensor, offloaded, recipe) + head_input
        return Activations(kept_on_gpu, recompute, transient, biggest_breakdown, offloaded, biggest_kept, tails)
    return Activations(
        saved + norm_and_masks + head_input, recompute, transient, biggest_breakdown, segment_tails=tails
    )
