"""Peak GPU memory of one training (or inference) step, per GPU, term by term.

Every function computes one quantity from one mechanism: which tensors exist, in which dtype, and
when they are alive. Sizes are bytes; the caller converts to GiB. The peak is the largest of the
memory in use at the moments of a step (end of forward, start of, during and end of backward,
optimizer step), because activations are freed while gradients are created, and at model load,
because PyTorch's peak counters run from process start.

Main sources:
- activations: the tensors autograd saves for backward in the transformers / torchtune / LitGPT
  modelling code (RMSNorm upcasts to fp32, SDPA saves q, k, v, out and the log-sum-exp; a gated MLP
  saves gate, act(gate) and up); Korthikanti et al. 2022 (arXiv 2205.05198) for the per-layer method.
- model states: DeepSpeed ZeRO paper (Rajbhandari et al. 2020, arXiv 1910.02054) and
  ``estimate_zero{2,3}_model_states_mem_needs``; bitsandbytes/torchao for quantized weights and 8-bit
  optimizer states; QLoRA paper (Dettmers et al. 2023, arXiv 2305.14314) for NF4 constants.
- allocator and context: PyTorch caching-allocator notes and measured reserved/allocated gaps (see
  shared/reference/memory_estimators.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from services.estimator.architecture import Architecture, Block, Linear, parameter_counts
from services.estimator.plan import Plan
from services.estimator.recipe import Recipe

GIB = 1024**3

# NF4 / int8 storage per quantized weight element (bytes), including the quantization constants.
# bitsandbytes NF4: 4-bit codes + one fp32 absmax per 64-element block (QLoRA paper, section 2).
NF4_BNB_BYTES = 0.5 + 4 / 64
# torchao NF4Tensor (torchtune): block 64, absmax quantized to int8 with an fp32 scaler per 256 blocks,
# the same layout as QLoRA's double quantization.
NF4_DOUBLE_QUANT_BYTES = 0.5 + 1 / 64 + 4 / (64 * 256)
# LLM.int8(): int8 weights + one fp32 scale per output row (approximated per element as negligible).
INT8_BYTES = 1.0
# GPTQ 4-bit (auto-gptq's QuantLinear): 4-bit codes in int32 words, and per group of 128 input rows an
# fp16 scale and a 4-bit zero point per output column (the group size of the common checkpoints; g_idx,
# one int32 per input row, is negligible).
GPTQ_BYTES = 0.5 + 2 / 128 + 0.5 / 128
# bitsandbytes blockwise 8-bit optimizer states: 1 byte + fp32 absmax per 2048-element block, per state.
ADAM8BIT_STATE_BYTES = 1 + 4 / 2048
# The caching allocator's extra reservation over the live tensors *within* a step of fixed shapes, as a
# share of the memory that is allocated and freed within the step (activations, gradients in backward,
# temporaries): blocks freed between kept ones leave holes that the next, differently sized request
# cannot use. Runs that log both counters show reserved 10-20% above allocated
# (shared/reference/memory_estimators.md). GMLake (Guo et al., ASPLOS 2024, arXiv 2401.08156, abstract)
# reports that its virtual-memory stitching cuts the fragmentation of PyTorch's caching allocator by 15%
# on average (up to 33%) over eight LLMs fine-tuned on A100-80GB with recomputation, LoRA and ZeRO, so
# PyTorch's own fragmentation there is at least that. We take 15% of the churning part and leave
# long-lived model states packed: a lower bound, and the public cases that log max_memory_reserved still
# read 8-11% above this estimate (docs/accuracy.md). Steps of changing shape add the cross-step cache of
# varying_length_cache_bytes.
FRAGMENTATION_OF_DYNAMIC = 0.15
# Under activation checkpointing the allocator keeps more cached: every block's backward rebuilds that
# block's activations between the gradients still alive from the block after it, so the blocks freed by
# one rebuild rarely fit the next one's requests in place. Replaying real transformers/PEFT steps through
# the allocator's rules (python -m benchmarks.mechanisms.allocator, benchmarks/results/allocator.json:
# Llama-3.2-1B-, Llama-3-8B- and Qwen2.5-7B-shaped LoRA and full fine-tuning steps) puts the cache beyond
# the allocated peak at 1.66-2.55 times one rebuilt block for LoRA (2.6-14 for full fine-tuning, where
# AdamW's first states sit in freed segments). How much of it the allocator can give back before an
# out-of-memory depends on the shapes (all but a tenth for the Llama-3-8B shape, almost none for the
# Qwen2.5-7B one), so it is shown at the replays' lower end in what the counters read, not in the fit.
REBUILT_BLOCK_CACHE = 1.6
# PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp): every request is rounded up to
# kMinBlockSize (512 bytes); requests up to kSmallSize (1 MiB) are carved from 2 MiB segments
# (kSmallBuffer); requests below kMinLargeAlloc (10 MiB) share 20 MiB segments (kLargeBuffer); larger
# ones get a segment of their own, rounded up to kRoundLarge (2 MiB) (get_allocation_size).
ALLOCATOR_MIN_BLOCK_BYTES = 512
ALLOCATOR_SMALL_SIZE_BYTES = 1 << 20
ALLOCATOR_SMALL_BUFFER_BYTES = 2 << 20
ALLOCATOR_MIN_LARGE_ALLOC_BYTES = 10 << 20
ALLOCATOR_LARGE_BUFFER_BYTES = 20 << 20
ALLOCATOR_ROUND_LARGE_BYTES = 2 << 20
# CUDA context of a PyTorch process as nvidia-smi shows it. pytorch/pytorch PR #86509 (which made
# CUDA_MODULE_LOADING=LAZY the default in PyTorch 1.13) measured 287,047,680 bytes after CUDA init with
# lazy loading and 666,632,192 bytes with every kernel module loaded eagerly. A training step loads
# the modules of the kernels it runs (PyTorch's, cuBLAS/cuBLASLt, attention), so the context lies
# between the two; we take the eager figure, the upper bound (0.62 GiB), as fits are checked on it.
CUDA_CONTEXT_BYTES = 666_632_192
# NCCL's buffers per connection, one per protocol (NVIDIA/nccl src/init.cc): Simple = NCCL_BUFFSIZE,
# default 1 << 22 (4 MiB); LL128 = 120 elements x 640 threads x 8 steps x 8 B; LL = 8 lines x 512
# threads x 8 steps x 16 B.
NCCL_SIMPLE_BUFFER_BYTES = 1 << 22
NCCL_LL128_BUFFER_BYTES = 120 * 640 * 8 * 8
NCCL_LL_BUFFER_BYTES = 8 * 512 * 8 * 16
# MAXCHANNELS in NCCL's src/include/device.h; NCCL opens up to this many channels on NVLink systems
# (fewer over PCIe), so this bounds the buffers from above.
NCCL_MAX_CHANNELS = 32
# FSDP1's rate limiter lets at most two all-gathers run ahead of the compute stream
# (torch/distributed/fsdp/_limiter_utils.py, _FreeEventQueue, limit_all_gathers=True, the accelerate
# default).
FSDP1_INFLIGHT_ALL_GATHERS = 2


@dataclass(frozen=True)
class ModelStates:
    """Long-lived bytes per GPU: weights, adapters, master copies, gradients, optimizer states."""

    weights: float
    adapters: float
    master_weights: float
    gradients: float  # all gradients of one step, per GPU
    largest_gradient: float  # with the optimizer fused into backward only one lives at a time
    optimizer_states: float
    optimizer_states_paged: float  # in CUDA unified memory: outside the PyTorch allocator
    optimizer_temporaries: float
    ddp_buckets: float
    trainable_params: int
    quantized_params: int


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per GPU of each component at the peak moment, and the three peaks."""

    components: dict[str, float]
    peak_allocated: float
    peak_reserved: float
    peak_device: float
    peak_moment: str
    moments: dict[str, float]
    trainable_params: int
    activations_per_layer_per_token: dict[str, float]
    # Cached blocks beyond the peak that the counters and nvidia-smi show when memory is plentiful but
    # that the caching allocator frees and retries with before it reports out-of-memory
    # (CUDACachingAllocator: release_cached_blocks on a failed cudaMalloc): FSDP1's stream pools and
    # the segments batches of other lengths left. Not part of the peaks.
    cached_reclaimable: float = 0.0


# --------------------------------------------------------------------------------------------------
# Which layers are trained, adapted, quantized


def lora_roles_of(linear: Linear, recipe: Recipe) -> tuple[str, ...]:
    return tuple(role for role in linear.roles if role in recipe.lora_targets)


def lora_adapter_params(linear: Linear, recipe: Recipe) -> int:
    """LoRA A (r x in) and B (out x r) for the targeted part of one (possibly fused) linear."""
    roles = lora_roles_of(linear, recipe)
    if not roles:
        return 0
    out = linear.out_features * len(roles) // len(linear.roles)
    return linear.copies * recipe.lora_rank * (linear.in_features + out)


def adapter_params(arch: Architecture, recipe: Recipe) -> int:
    total = sum(lora_adapter_params(lin, recipe) * b.count for b in arch.blocks for lin in b.linears)
    if "lm_head" in recipe.lora_targets:
        total += recipe.lora_rank * (arch.hidden_size + arch.vocab_size)
    return total


def quantized_params(arch: Architecture, recipe: Recipe) -> int:
    """Weights stored 4/8-bit: every block linear (not biases), plus the head where the framework does."""
    total = sum(b.count * lin.copies * lin.in_features * lin.out_features for b in arch.blocks for lin in b.linears)
    if recipe.quantize_lm_head:
        total += arch.lm_head_matmul_params if not arch.tie_word_embeddings else 0
    return total


# --------------------------------------------------------------------------------------------------
# Model states


def quantized_bytes_per_weight(plan: Plan, recipe: Recipe) -> float:
    """Bytes a quantized weight element is stored in, its quantization constants included."""
    if plan.quantized == "int8":
        return INT8_BYTES
    return {"torchao": NF4_DOUBLE_QUANT_BYTES, "auto-gptq": GPTQ_BYTES}.get(recipe.quant_backend, NF4_BNB_BYTES)


def weight_bytes(plan: Plan, arch: Architecture, recipe: Recipe) -> tuple[float, int]:
    """Frozen or trained base weights as stored (quantized linears plus 16-bit everything else)."""
    total = parameter_counts(arch).total
    quant = plan.quantized
    if quant is None:
        return float(total * recipe.weight_bytes), 0
    q = quantized_params(arch, recipe)
    per = quantized_bytes_per_weight(plan, recipe)
    # Non-quantized parts (embeddings, norms, biases, head) stay in the compute dtype, or fp32 after
    # PEFT's prepare_model_for_kbit_training (recipe.kbit_fp32_upcast).
    return q * per + (total - q) * recipe.unquantized_weight_bytes, q


def optimizer_state_bytes_per_param(plan: Plan, state_dtype_bytes: int) -> tuple[float, bool]:
    """(bytes per trainable parameter, paged?) for the plan's optimizer.

    AdamW keeps exp_avg and exp_avg_sq in the parameter's dtype (torch.optim.AdamW) or fp32 under a
    master copy; 8-bit variants store both blockwise-quantized (bitsandbytes); paged variants live in
    CUDA unified memory that the driver pages to the host under pressure; SGD keeps one momentum
    buffer; Adafactor's factored second moment is O(rows + cols) and is handled by the caller.
    """
    opt = plan.optimizer
    if opt == "adamw":
        return 2.0 * state_dtype_bytes, False
    if opt == "adamw-8bit":
        return 2 * ADAM8BIT_STATE_BYTES, False
    if opt == "paged-adamw":
        return 8.0, True  # bitsandbytes PagedAdamW keeps 32-bit states whatever the parameter dtype
    if opt == "paged-adamw-8bit":
        return 2 * ADAM8BIT_STATE_BYTES, True
    if opt == "sgd":
        return float(state_dtype_bytes), False
    return 0.0, False  # adafactor: computed from the factored shapes


def adafactor_state_elements(arch: Architecture, plan: Plan, recipe: Recipe) -> int:
    """Adafactor (Shazeer & Stern 2018): a row and a column accumulator per matrix, full for vectors."""
    if plan.method == "full":
        mats = sum(
            b.count * lin.copies * (lin.in_features + lin.out_features) for b in arch.blocks for lin in b.linears
        )
        mats += 2 * (arch.hidden_size + arch.vocab_size)
        vectors = parameter_counts(arch).norms + sum(b.count * b.other_params for b in arch.blocks)
        return mats + vectors
    # LoRA: A (r x in) and B (out x r) are each a matrix.
    elems = 0
    for b in arch.blocks:
        for lin in b.linears:
            if lora_roles_of(lin, recipe):
                elems += b.count * lin.copies * (2 * recipe.lora_rank + lin.in_features + lin.out_features)
    return elems


def held_architecture(arch: Architecture, recipe: Recipe) -> Architecture:
    """The model as the framework holds it in memory: LitGPT keeps a tied output head as its own matrix."""
    if recipe.unties_embeddings and arch.tie_word_embeddings:
        return replace(arch, tie_word_embeddings=False)
    return arch


def model_states(plan: Plan, arch: Architecture, recipe: Recipe) -> ModelStates:
    """Weights, adapters, gradients, master weights and optimizer states per GPU after sharding."""
    arch = held_architecture(arch, recipe)
    n = plan.gpus
    shard = plan.sharding
    counts = parameter_counts(arch)
    weights, n_quant = weight_bytes(plan, arch, recipe)
    training = plan.is_training

    if plan.method == "full":
        trainable = counts.total
        param_bytes = recipe.weight_bytes
        adapters = 0.0
    else:
        trainable = adapter_params(arch, recipe) if training else 0
        param_bytes = recipe.adapter_bytes
        adapters = float(trainable * param_bytes)

    if not training:
        return ModelStates(
            weights=weights,
            adapters=adapters,
            master_weights=0.0,
            gradients=0.0,
            largest_gradient=0.0,
            optimizer_states=0.0,
            optimizer_states_paged=0.0,
            optimizer_temporaries=0.0,
            ddp_buckets=0.0,
            trainable_params=0,
            quantized_params=n_quant,
        )

    master = float(trainable * 4) if recipe.master_weights else 0.0
    # ZeRO with a master copy reduces fp32 gradients into the optimizer's partition beside the 16-bit
    # ones (DeepSpeed's "2 + 4" bytes of gradient per parameter in estimate_zero2_model_states_mem_needs).
    grad_bytes = param_bytes + (4 if recipe.master_weights else 0)
    grads = float(trainable * grad_bytes)
    if shard == "zero3" and recipe.master_weights:
        # ZeRO-3 reduce-scatters the 16-bit gradients bucket by bucket and frees them; only the fp32
        # partition stays (estimate_zero3_model_states_mem_needs: 18 bytes per parameter / GPUs =
        # 16-bit param 2 + fp32 master 4 + fp32 gradient 4 + Adam 8).
        grads = float(trainable * 4)
    largest = _largest_trainable_tensor(arch, plan, recipe) * grad_bytes

    state_dtype = 4 if (recipe.master_weights or param_bytes == 4) else param_bytes
    per_param, paged = optimizer_state_bytes_per_param(plan, state_dtype)
    if plan.optimizer == "adafactor":
        states = float(adafactor_state_elements(arch, plan, recipe) * 4)
    else:
        states = trainable * per_param

    # torch AdamW's foreach path allocates sqrt(exp_avg_sq) for every parameter at once
    # (torch/optim/adamw.py _multi_tensor_adamw: torch._foreach_sqrt); the fused kernel and the
    # per-parameter loop need no whole-model temporary (torchtune PR #389 measured ~1x params).
    temps = 0.0
    if plan.optimizer in ("adamw", "sgd") and recipe.optimizer_impl == "foreach" and not plan.optimizer_in_backward:
        temps = float(trainable * state_dtype)
    elif plan.optimizer in ("adamw", "sgd"):
        temps = float(largest / grad_bytes * state_dtype) if grad_bytes else 0.0

    # Sharding divides what each stage partitions (ZeRO paper, figure 1; FSDP full shard = stage 3).
    if shard in ("zero1", "zero2", "zero3", "fsdp"):
        states /= n
        master /= n
        temps /= n
    if recipe.fsdp_flat_param_grads:
        grads += float((counts.total - n_quant) * recipe.weight_bytes)
    if shard in ("zero2", "zero3", "fsdp") and not recipe.fsdp_accumulates_unsharded:
        grads /= n
    elif recipe.fsdp_accumulates_unsharded and recipe.fsdp_compute_params_16bit:
        grads = fsdp_no_sync_gradient_bytes(trainable, n, recipe)
    if shard in ("zero3", "fsdp"):
        weights /= n
        adapters /= n

    ddp = 0.0
    if shard == "none" and n > 1:
        # DistributedDataParallel reduces through bucket buffers the size of all gradients
        # (gradient_as_bucket_view=False by default).
        ddp = float(trainable * param_bytes)

    paged_states = 0.0
    if paged:
        paged_states, states = states, 0.0

    if plan.cpu_offload:
        # FSDP CPUOffload / ZeRO-Offload keep optimizer states, master weights and sharded gradients in
        # host memory and step on the CPU; FSDP and ZeRO-3 offload the sharded parameters as well.
        states = master = temps = paged_states = 0.0
        grads = 0.0
        if shard in ("zero3", "fsdp"):
            weights = adapters = 0.0

    return ModelStates(
        weights=weights,
        adapters=adapters,
        master_weights=master,
        gradients=grads,
        largest_gradient=largest,
        optimizer_states=states,
        optimizer_states_paged=paged_states,
        optimizer_temporaries=temps,
        ddp_buckets=ddp,
        trainable_params=trainable,
        quantized_params=n_quant,
    )


def fsdp_no_sync_gradient_bytes(trainable: int, gpus: int, recipe: Recipe) -> float:
    """Gradients per GPU when FSDP accumulates micro-batches under no_sync() with 16-bit compute params.

    Skipping the reduce-scatter keeps every unit's unsharded gradient ("FSDP will accumulate the full
    model gradients (instead of gradient shards) until the eventual sync", FullyShardedDataParallel.
    no_sync docs). Autograd writes them in the dtype of the unsharded parameters it differentiated,
    FSDP's MixedPrecision param_dtype (16-bit); the synced step then reduce-scatters into the fp32
    sharded gradient the optimizer reads.
    """
    return float(trainable * recipe.compute_bytes + trainable * recipe.weight_bytes / gpus)


def _largest_trainable_tensor(arch: Architecture, plan: Plan, recipe: Recipe) -> int:
    if plan.method == "full":
        biggest_linear = max(lin.in_features * lin.out_features for b in arch.blocks for lin in b.linears)
        return max(biggest_linear, arch.embedding_params)
    sizes = [
        recipe.lora_rank * max(lin.in_features, lin.out_features)
        for b in arch.blocks
        for lin in b.linears
        if lora_roles_of(lin, recipe)
    ]
    if "lm_head" in recipe.lora_targets:
        sizes.append(recipe.lora_rank * arch.vocab_size)
    return max(sizes, default=0)


def sharded_working_bytes(plan: Plan, arch: Architecture, recipe: Recipe) -> tuple[float, float]:
    """(forward, backward) bytes of parameters gathered from shards under ZeRO-3 / FSDP.

    FSDP all-gathers one wrapped unit (a transformer block) at a time and prefetches the next, so two
    units are unsharded at once; backward also holds the unit's unsharded gradients until they are
    reduce-scattered. The root unit (embeddings, final norm, head) stays gathered in HF / torchtune
    wrapping. DeepSpeed ZeRO-3 behaves alike with its prefetch bucket.
    """
    if plan.sharding not in ("zero3", "fsdp") or (plan.gpus == 1 and not plan.cpu_offload):
        return 0.0, 0.0
    if plan.quantized is not None:
        per = quantized_bytes_per_weight(plan, recipe)
        block = max(
            sum(lin.copies * lin.in_features * lin.out_features for lin in b.linears) * per
            + (b.params - sum(lin.copies * lin.in_features * lin.out_features for lin in b.linears))
            * recipe.compute_bytes
            for b in arch.blocks
        )
    else:
        # FSDP mixed precision gathers in param_dtype (16-bit) even when the shards are fp32.
        block = arch.largest_block_params * recipe.compute_bytes
    root = (
        0.0
        if recipe.framework == "torchtitan"
        else float((arch.embedding_params + arch.lm_head_params) * recipe.compute_bytes)
    )
    fwd = 2 * block + root
    grad_block = 0.0
    if plan.method == "full" and plan.is_training:
        grad_block = arch.largest_block_params * (4 if recipe.weight_bytes == 4 else recipe.compute_bytes)
    return fwd, fwd + grad_block


# --------------------------------------------------------------------------------------------------
# Activations


def _attention_impl(arch: Architecture, recipe: Recipe) -> str:
    # transformers' BLOOM and T5 have no SDPA path, and Falcon falls back to math attention (scores
    # kept in fp32) when a padding mask is present (measured in benchmarks/mechanisms).
    if arch.model_type in ("bloom", "t5", "mt5", "falcon"):
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


def _attention_saves(block: Block, arch: Architecture, recipe: Recipe, qkv: list[Linear]) -> float:
    """Bytes per token SDPA keeps: q, k, v, the output and the fp32 log-sum-exp (FlashAttention-2,
    algorithm 2), where a kept *view* keeps its whole base tensor alive.

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
    fused = recipe.framework == "litgpt" or arch.model_type == "gpt_bigcode"
    if fused and not kv_copied:
        fused_bytes = a * hd * (heads + 2 * kv_heads)
        if arch.rotary:
            v = fused_bytes
        else:
            q, k, v = fused_bytes, 0, 0
    return q + k + v + a * heads * hd + 4 * heads


UNSLOTH_FUSED_ROLES = frozenset({"q", "k", "v", "o", "gate", "up", "down"})


def unsloth_fused_block(block: Block, plan: Plan, recipe: Recipe) -> bool:
    """Whether Unsloth runs the block through its own autograd functions: a dense gated-MLP block whose
    seven projections all carry LoRA adapters without dropout (unsloth/kernels/fast_lora.py: LoRA_QKV,
    LoRA_W, LoRA_MLP; Unsloth patches a layer with them only for dropout 0 and no bias, else it keeps
    PEFT's modules)."""
    if recipe.framework != "unsloth" or plan.method == "full" or recipe.lora_dropout > 0:
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
    if arch.norm == "rms" and recipe.compiled:
        add("norms", block.norm_count * compiled_rms_norm_bytes_per_token(h, res))
    elif arch.norm == "rms":
        add("norms", block.norm_count * h * (4 + (res if full else 0)))
    else:
        distinct_inputs = 1 if block.parallel_residual else block.norm_count
        add("norms", distinct_inputs * h * res)

    attn_sets = [(by_role("q", "k", "v"), by_role("o"), False)]
    if block.kind == "cross-decoder":
        attn_sets.append((by_role("q", "k", "v", cross=True), by_role("o", cross=True), True))
    impl = _attention_impl(arch, recipe)
    for qkv, out_proj, _cross in attn_sets:
        add("attention_input", input_copies(qkv) * a * h)
        add("attention_qkv_out", _attention_saves(block, arch, recipe, qkv))
        if impl == "eager":
            # Eager attention keeps the score matrix: softmax output in fp32 (HF upcasts) and its
            # 16-bit copy for the value matmul, plus the dropout mask when dropout is active.
            add("attention_scores", heads * seq_len * (4 + a))
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
        # gate output, act(gate), up output; compiled, act(gate) is recomputed from the gate output.
        add("mlp_hidden", k * (2 if recipe.compiled else 3) * a * inter)
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
        if recipe.framework == "litgpt" and set(lin.roles) <= {"q", "k", "v"}:
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
    hidden-wide gradient and turns it, e and g into the three it needs in place (swiglu_DWf_DW_dfg_kernel)."""
    a = recipe.compute_bytes
    hidden_grads = 1 if unsloth_fused_block(block, plan, recipe) else 2
    return (
        block.experts_per_token * hidden_grads * a * block.intermediate_size
        + 2 * recipe.residual_bytes * arch.hidden_size
    )


@dataclass(frozen=True)
class Activations:
    saved: float  # bytes kept on the GPU for backward at the end of the forward pass
    recompute: float  # bytes of one block's activations rebuilt during backward (checkpointing)
    backward_transient: float  # gradients of one block's intermediates during its backward
    per_layer_per_token: dict[str, float]  # breakdown of one (the largest) block, bytes/token
    offloaded: float = 0.0  # bytes moved to host memory by activation offloading
    refetched: float = 0.0  # offloaded bytes back on the GPU while one block's backward runs


# torchtune's OffloadActivations keeps up to max_fwd_stash_size (default 5) offloaded tensors alive on the
# GPU until their device-to-host copy finishes (torchtune/training/_activation_offloading.py). Unsloth's
# offloaded checkpointing copies each block's input to the host with a non-blocking copy as the block runs
# (unsloth_zoo gradient_checkpointing.py, Unsloth_Offloaded_Gradient_Checkpointer): one in flight.
OFFLOAD_FORWARD_STASH_TENSORS = 5
UNSLOTH_OFFLOAD_IN_FLIGHT_TENSORS = 1


def offload_stash_bytes(largest_tensor: float, offloaded: float, recipe: Recipe) -> float:
    """GPU bytes still held by activation offloading at the end of the forward pass: the last few
    offloaded tensors, whose copies to the host may still be in flight."""
    in_flight = UNSLOTH_OFFLOAD_IN_FLIGHT_TENSORS if recipe.framework == "unsloth" else OFFLOAD_FORWARD_STASH_TENSORS
    return min(offloaded, in_flight * largest_tensor)


def _largest_saved_tensor_bytes(block: Block, arch: Architecture, plan: Plan, recipe: Recipe) -> float:
    """The biggest single tensor a block saves: its input under checkpointing, else the widest of the
    residual stream, an MLP hidden tensor and the attention output."""
    tokens = plan.tokens_per_micro_batch
    residual = recipe.residual_bytes * arch.hidden_size
    if plan.gradient_checkpointing:
        return float(residual * tokens)
    a = recipe.compute_bytes
    widest = max(residual, 4 * arch.hidden_size, a * block.intermediate_size, a * block.num_heads * block.head_dim)
    return float(widest * tokens)


def activation_bytes(plan: Plan, arch: Architecture, recipe: Recipe) -> Activations:
    tokens = plan.tokens_per_micro_batch
    seq = plan.seq_len
    saved = 0.0
    biggest_block = 0.0
    biggest_kept = 0.0
    biggest_tensor = 0.0
    biggest_breakdown: dict[str, float] = {}
    transient = 0.0
    for block in arch.blocks:
        per_token = block_saved_bytes_per_token(block, arch, plan, recipe, seq)
        block_total = sum(per_token.values())
        if block_total > biggest_block:
            biggest_block, biggest_breakdown = block_total, per_token
        kept = (
            _checkpointed_block_bytes_per_token(block, arch, plan, recipe)
            if plan.gradient_checkpointing
            else block_total
        )
        saved += block.count * kept * tokens
        biggest_kept = max(biggest_kept, kept * tokens)
        biggest_tensor = max(biggest_tensor, _largest_saved_tensor_bytes(block, arch, plan, recipe))
        transient = max(transient, backward_transient_bytes_per_token(block, arch, recipe, plan) * tokens)

    # Final norm and the head's input (kept when the head trains or is a bitsandbytes layer), and the
    # embedding dropout mask.
    h = arch.hidden_size
    norm_in = 4 if arch.norm == "rms" else recipe.residual_bytes
    norm_per_token = float(h * norm_in)
    if recipe.compiled and arch.norm == "rms":
        norm_per_token = compiled_rms_norm_bytes_per_token(h, recipe.residual_bytes)
    head_trains = plan.method == "full" or "lm_head" in recipe.lora_targets
    head_keeps_input = head_trains or (plan.quantized is not None and recipe.quantize_lm_head)
    head_input = tokens * h * (recipe.compute_bytes if head_keeps_input else 0)
    norm_and_masks = tokens * norm_per_token
    if recipe.model_dropout and arch.hidden_dropout > 0:
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
        return Activations(kept_on_gpu, recompute, transient, biggest_breakdown, offloaded, biggest_kept)
    return Activations(saved + norm_and_masks + head_input, recompute, transient, biggest_breakdown)


# --------------------------------------------------------------------------------------------------
# Logits and loss


def logits_bytes(plan: Plan, arch: Architecture, recipe: Recipe) -> tuple[float, float]:
    """(end of forward, start of backward) bytes of logits, log-probabilities and their gradients.

    Standard loss (transformers ForCausalLMLoss, torchtitan): 16-bit logits, an fp32 upcast for
    cross-entropy whose log_softmax output is kept; its backward holds the kept output, the incoming
    gradient and the input gradient (3 fp32 tensors of tokens x vocab). Chunked loss (torchtune
    CEWithChunkedOutputLoss, LitGPT chunked_cross_entropy) keeps the same log-probabilities but
    materialises the fp32 temporaries one chunk at a time. A fused linear cross-entropy never
    materialises the logits of the whole micro-batch (``fused_linear_cross_entropy_bytes``).
    """
    tokens = plan.tokens_per_micro_batch
    v = arch.vocab_size
    a = recipe.compute_bytes
    up = 4 if recipe.logits_fp32 else a
    if recipe.loss == "fused":
        return fused_linear_cross_entropy_bytes(tokens, arch.hidden_size, a)
    if recipe.compiled_loss:
        return compiled_loss_bytes(plan, arch, recipe)
    if recipe.loss == "chunked":
        # torchtune splits the logits into 8 chunks; LitGPT's head emits 128-position chunks.
        chunk = tokens / 8 if recipe.framework == "torchtune" else plan.micro_batch_size * min(plan.seq_len, 128)
        fwd = tokens * v * (a + up) + chunk * v * up
        bwd = tokens * v * up + chunk * v * 2 * up
        if recipe.framework == "litgpt":
            bwd += tokens * v * a  # LitGPT keeps the logits chunks referenced through backward
        return float(fwd), float(bwd)
    fwd = tokens * v * (a + 2 * up)  # logits, upcast copy, kept log-probabilities
    bwd = tokens * v * 3 * up
    return float(fwd), float(bwd)


def fused_linear_cross_entropy_bytes(tokens: float, hidden: int, compute_bytes: int) -> tuple[float, float]:
    """(end of forward, start of backward) bytes of a fused linear cross-entropy: the head's matmul and the
    loss run chunk by chunk, so the logits of the whole micro-batch never exist.

    Liger's FusedLinearCrossEntropy (linkedin/Liger-Kernel ops/fused_linear_cross_entropy.py) computes
    the input gradient during the forward into ``grad_input = zeros_like(input)`` (tokens x hidden, kept
    for backward) and sizes its chunks so that one chunk's logits hold as many elements as the hidden
    states (``inc_factor = cdiv(V, H)``, ``chunk_size = next_power_of_2(cdiv(BT, inc_factor))``), plus an
    fp32 loss per token. Unsloth's ``unsloth_fused_ce_loss`` (unsloth_zoo fused_losses: the same chunked
    scheme, its chunk sized to the memory left) and Cut Cross-Entropy (Wijmans et al. 2024, arXiv
    2411.09009: logits only in on-chip memory, axolotl's CCE plugin) hold no more.
    """
    hidden_bytes = tokens * hidden * compute_bytes
    per_token_loss = 4.0 * tokens
    return 2.0 * hidden_bytes + per_token_loss, hidden_bytes + per_token_loss


def compiled_loss_bytes(plan: Plan, arch: Architecture, recipe: Recipe) -> tuple[float, float]:
    """(end of forward, start of backward) bytes of logits and loss when the cross-entropy is compiled.

    Inductor fuses the fp32 upcast, log-softmax and the target gather into one reduction kernel and its
    partitioner saves the kernel's input and the per-token log-sum-exp instead of the fp32
    log-probabilities (min_cut_rematerialization_partition recomputes the softmax in backward).
    Chunked (torchtune's CEWithChunkedOutputLoss.apply_compile_strategy compiles compute_cross_entropy
    per chunk): the 16-bit logit chunks stay, and backward writes one chunk's 16-bit gradient at a time.
    Standard: the decoder upcasts outside the compiled region (torchtune's TransformerDecoder returns
    output.float()), so the fp32 logits are the saved input and backward adds their fp32 gradient.
    """
    tokens = plan.tokens_per_micro_batch
    v = arch.vocab_size
    a = recipe.compute_bytes
    up = 4 if recipe.logits_fp32 else a
    if recipe.loss == "chunked":
        chunk = tokens / 8 if recipe.framework == "torchtune" else plan.micro_batch_size * min(plan.seq_len, 128)
        return float(tokens * v * a), float(tokens * v * a + chunk * v * a)
    return float(tokens * v * (a + up)), float(tokens * v * 2 * up)


def autocast_weight_copy_bytes(arch: Architecture, recipe: Recipe) -> float:
    """16-bit copies of the fp32 matmul weights that autocast makes and autograd keeps until backward.

    After prepare_model_for_kbit_training only the output head is an fp32 matmul weight (the block
    linears are 4/8-bit and dequantize themselves), so only its copy is kept for the input gradient.
    """
    if recipe.kbit_fp32_upcast:
        return float(arch.lm_head_matmul_params * recipe.compute_bytes)
    if not recipe.autocast_weight_copies:
        return 0.0
    matmul = sum(b.count * lin.copies * lin.in_features * lin.out_features for b in arch.blocks for lin in b.linears)
    return float((matmul + arch.lm_head_matmul_params) * recipe.compute_bytes)


# --------------------------------------------------------------------------------------------------
# The caching allocator


def _round_up(value: float, multiple: int) -> int:
    return -(-math.ceil(value) // multiple) * multiple


def allocator_block_bytes(request: float) -> int:
    """Bytes of the block the caching allocator hands out for a request: rounded up to 512 bytes
    (round_size, kMinBlockSize)."""
    return max(ALLOCATOR_MIN_BLOCK_BYTES, _round_up(request, ALLOCATOR_MIN_BLOCK_BYTES))


def allocator_segment_bytes(request: float) -> int:
    """Bytes the caching allocator obtains from cudaMalloc when no cached block fits the request
    (get_allocation_size): a 2 MiB segment for small requests (up to 1 MiB), a 20 MiB segment for
    requests below 10 MiB, otherwise the request rounded up to 2 MiB."""
    if request <= ALLOCATOR_SMALL_SIZE_BYTES:
        return ALLOCATOR_SMALL_BUFFER_BYTES
    if request < ALLOCATOR_MIN_LARGE_ALLOC_BYTES:
        return ALLOCATOR_LARGE_BUFFER_BYTES
    return _round_up(request, ALLOCATOR_ROUND_LARGE_BYTES)


def segment_tail_bytes(request: float) -> int:
    """Reserved bytes a tensor of 10 MiB or more leaves unused at the end of its own segment.

    The segment is the request rounded up to 2 MiB, the block the request rounded up to 512 bytes; the
    tail is split off as a free block only when it exceeds 1 MiB (should_split: remaining > kSmallSize
    in the large pool), and then only a 1-2 MiB request could use it, which training rarely makes.
    Smaller tensors share 2 or 20 MiB segments with others, so their rounding is amortised: 0 here.
    """
    if request < ALLOCATOR_MIN_LARGE_ALLOC_BYTES:
        return 0
    return allocator_segment_bytes(request) - allocator_block_bytes(request)


def activation_rounding_bytes(plan: Plan, arch: Architecture, recipe: Recipe) -> float:
    """Segment tails of the activations kept for backward, which are alive at the peak of a step.

    Each layer's saved tensors are taken one per kind (Activations.per_layer_per_token keys, or the block
    input alone under checkpointing): an approximation that undercounts tensors of a kind, whose tails
    are each under 2 MiB. LLM widths are multiples of large powers of two, so the tails are often zero.
    """
    if not plan.is_training:
        return 0.0
    tokens = plan.tokens_per_micro_batch
    total = 0.0
    for block in arch.blocks:
        if plan.gradient_checkpointing:
            kinds = [_checkpointed_block_bytes_per_token(block, arch, plan, recipe)]
        else:
            kinds = list(block_saved_bytes_per_token(block, arch, plan, recipe, plan.seq_len).values())
        total += block.count * sum(segment_tail_bytes(per_token * tokens) for per_token in kinds)
    return total


def varying_length_cache_bytes(recipe: Recipe, length_dependent: float) -> float:
    """Free segments that batches of other lengths leave in the cache beyond the longest batch's peak.

    Without packing, batch shapes change from step to step (Plan.padding 'longest'). The allocator
    keeps every segment it obtained and serves a request from the smallest cached block that is large
    enough, so a batch longer than any before cannot reuse the segments made for the shorter ones and
    obtains new ones; the old ones stay cached ("if it runs at size N + 1, then it will have to make new
    allocations that are slightly larger", PyTorch CUDA semantics, expandable_segments; the pattern
    repeats per layer). The bound, taken as the default, is one more step's length-dependent memory
    (activations, logits and backward temporaries) at the longest length, the memory of a batch just
    shorter than the longest: how much of it later batches reuse depends on the order of lengths, which
    the plan does not know, and the uncertainty band carries the rest. Those segments are free and
    unsplit when a cudaMalloc fails, so the allocator releases them and retries (release_cached_blocks)
    before it reports out-of-memory: they show in max_memory_reserved and nvidia-smi, not in the fit.
    Fixed shapes (packing, padding to max length) reuse their own segments every step: 0.
    """
    if recipe.padding != "longest":
        return 0.0
    return length_dependent


# --------------------------------------------------------------------------------------------------
# Putting it together


def bnb_dequantize_bytes(plan: Plan, arch: Architecture, recipe: Recipe) -> tuple[float, float]:
    """(output head, largest block linear) bytes of the full-precision copy bitsandbytes makes per matmul.

    MatMul4Bit runs F.linear(A, F.dequantize_4bit(B, quant_state).to(A.dtype).t()) in forward and the
    same dequantization for the input gradient in backward (bitsandbytes/autograd/_functions.py): the
    whole weight exists in 16-bit while the matmul runs, plus a second copy when the dequantized dtype
    (quant_state.dtype, the dtype the weight was quantized from) is not the compute dtype. The copy is a
    temporary of the one matmul, never saved for backward: forward keeps ctx.tensors = (A, B) or
    (None, B), B being the packed 4-bit weight, and backward dequantizes again. So one layer's copy
    exists at a time, in forward and in backward alike; under gradient checkpointing the recomputed
    forward's copy is freed before that block's backward makes its own. Only 4-bit bitsandbytes layers
    do this; torchao's NF4 and int8 paths are not modelled here.
    """
    if plan.quantized != "nf4" or recipe.quant_backend != "bitsandbytes" or not plan.is_training:
        return 0.0, 0.0
    per = recipe.compute_bytes + (2 if recipe.bnb_dequant_cast else 0)  # + the fp16 copy before the cast
    block = max(lin.in_features * lin.out_features for b in arch.blocks for lin in b.linears)
    head = arch.lm_head_matmul_params if recipe.quantize_lm_head and not arch.tie_word_embeddings else 0
    return float(head * per), float(block * per)


def gptq_dequantized_bytes(plan: Plan, arch: Architecture, recipe: Recipe) -> tuple[float, float]:
    """(end of forward, during backward) bytes of the 16-bit weights auto-gptq's QuantLinear dequantizes.

    For the row counts of training (at least ``kernel_switch_threshold``, 128) and with exllama off, as
    training needs, ``QuantLinear.forward`` (auto_gptq/nn_modules/qlinear/qlinear_cuda_old.py) unpacks the
    weight with PyTorch ops, shift to int32, cast to int8, mask, subtract the zeros, multiply by the scales
    into a 16-bit weight, and runs ``torch.matmul(x, weight)``. Autograd saves that weight for the input
    gradient (the matmul's other operand needs none), so it lives until the layer's backward, and the
    backward does not dequantize again. Without checkpointing every block linear's copy is saved through
    the forward; with it, a block's replay saves the copies of its own linears for its backward, and its
    largest linear's unpacking peaks 3 bytes per element above its copy (the int32 and int8 stages).
    """
    if plan.quantized is None or recipe.quant_backend != "auto-gptq" or not plan.is_training:
        return 0.0, 0.0
    copy = 2.0  # the 16-bit weight
    if not plan.gradient_checkpointing:
        saved = copy * quantized_params(arch, recipe)
        return saved, saved
    block = max(sum(lin.copies * lin.in_features * lin.out_features for lin in b.linears) for b in arch.blocks)
    largest = max(lin.in_features * lin.out_features for b in arch.blocks for lin in b.linears)
    return 0.0, copy * block + 3.0 * largest


def dequantized_weight_bytes(plan: Plan, arch: Architecture, recipe: Recipe) -> tuple[float, float]:
    """(end of forward and start of backward, during backward) bytes of dequantized weight copies."""
    if recipe.quant_backend == "auto-gptq":
        return gptq_dequantized_bytes(plan, arch, recipe)
    return bnb_dequantize_bytes(plan, arch, recipe)


# torchao's NF4 quantization before pytorch/ao PR #196 (merged 2024-05-01, first in torchao 0.2): for a
# 16-bit weight of N elements, quantize_tensor_nearest computes (value - nf4).abs() over all 16 NF4 levels
# at once, two N x 16 16-bit tensors, besides the scaled copy and the int64 indices. pytorch/ao PR #315
# measured 37.87 GB peak while quantizing a 2.10 GB bf16 weight (4096 x 128256): 72 bytes per element,
# of which 2 are the weight itself.
NF4_WHOLE_TENSOR_QUANTIZE_BYTES_PER_ELEMENT = 70.0
# Since PR #196 torchao quantizes 1024**2 elements at a time ("Note: Quantize in Chunks", nf4tensor.py).
NF4_QUANTIZE_CHUNK_ELEMENTS = 1024**2


def quantization_load_bytes(plan: Plan, arch: Architecture, recipe: Recipe) -> float:
    """Temporaries of quantizing the largest NF4 weight while the model loads: its 16-bit copy on the
    GPU plus the quantizer's working set (whole-tensor in torchao 0.1, chunked since). A GPTQ checkpoint
    is stored quantized: nothing is quantized while it loads."""
    if plan.quantized != "nf4" or recipe.quant_backend == "auto-gptq":
        return 0.0
    largest = max(lin.in_features * lin.out_features for b in arch.blocks for lin in b.linears)
    if recipe.quantize_lm_head and not arch.tie_word_embeddings:
        largest = max(largest, arch.lm_head_matmul_params)
    if recipe.nf4_whole_tensor:
        working = largest
    elif recipe.quant_backend == "torchao":
        working = min(largest, NF4_QUANTIZE_CHUNK_ELEMENTS)
    else:
        working = 0  # bitsandbytes' quantize_4bit is one CUDA kernel writing the packed output directly
    return float(largest * recipe.compute_bytes + working * NF4_WHOLE_TENSOR_QUANTIZE_BYTES_PER_ELEMENT)


def peak_memory(plan: Plan, arch: Architecture, recipe: Recipe) -> MemoryBreakdown:
    arch = held_architecture(arch, recipe)
    states = model_states(plan, arch, recipe)
    if not plan.is_training:
        return _inference_peak(plan, arch, recipe, states)

    acts = activation_bytes(plan, arch, recipe)
    logit_fwd, logit_bwd = logits_bytes(plan, arch, recipe)
    shard_fwd, shard_bwd = sharded_working_bytes(plan, arch, recipe)

    grads_all = states.gradients
    if plan.optimizer_in_backward:
        # Each parameter steps as soon as its gradient is ready and the gradient is freed
        # (torchtune optimizer_in_bwd / torch register_post_accumulate_grad_hook).
        grads_all = states.largest_gradient
    persistent_grads = grads_all if recipe.grads_persist and not plan.optimizer_in_backward else 0.0
    growing_grads = grads_all - persistent_grads
    head_grad = 0.0
    if growing_grads and plan.method == "full":
        head_grad = min(
            growing_grads,
            arch.lm_head_matmul_params
            * recipe.weight_bytes
            / (plan.gpus if plan.sharding in ("zero2", "zero3", "fsdp") else 1),
        )

    casts = autocast_weight_copy_bytes(arch, recipe)
    # bitsandbytes: the head's matmul runs last in forward and first in backward; block linears run during
    # backward. GPTQ: the copies autograd saves (gptq_dequantized_bytes).
    dequant_head, dequant_block = dequantized_weight_bytes(plan, arch, recipe)
    static = {
        "weights": states.weights,
        "adapters": states.adapters,
        "master_weights": states.master_weights,
        "optimizer_states": states.optimizer_states,
        "gradients": persistent_grads,
        "ddp_buckets": states.ddp_buckets,
    }
    moments: dict[str, dict[str, float]] = {
        "end_of_forward": {
            **static,
            "activations": acts.saved,
            "autocast_weight_copies": casts,
            "logits_and_loss": logit_fwd,
            "sharding_buffers": shard_fwd,
            "dequantized_weights": dequant_head,
        },
        "start_of_backward": {
            **static,
            "gradients": persistent_grads + head_grad,
            "activations": acts.saved,
            "autocast_weight_copies": casts,
            "logits_and_loss": logit_bwd,
            "sharding_buffers": shard_bwd,
            "dequantized_weights": dequant_head,
        },
        "during_backward": {
            **static,
            "gradients": persistent_grads + head_grad,
            "activations": acts.saved,
            "autocast_weight_copies": casts,
            "temporaries": acts.recompute + acts.backward_transient + acts.refetched,
            "sharding_buffers": shard_bwd,
            "dequantized_weights": dequant_block,
        },
        "end_of_backward": {
            **static,
            "gradients": persistent_grads + growing_grads,
            "temporaries": acts.recompute + acts.backward_transient,
            "sharding_buffers": shard_bwd,
        },
        "optimizer_step": {
            **static,
            "gradients": persistent_grads + growing_grads,
            "temporaries": states.optimizer_temporaries,
        },
        # The counters run from process start, so the load counts: the quantized model, its adapters and
        # the temporaries of quantizing one weight (the optimizer states do not exist yet).
        "model_load": {
            "weights": states.weights,
            "adapters": states.adapters,
            "quantization_temporaries": quantization_load_bytes(plan, arch, recipe),
        },
    }
    # What a batch's length scales: the activations and logits of the longest moment of the step.
    length_dependent = max(
        acts.saved + logit_fwd,
        acts.saved + logit_bwd,
        acts.saved + acts.recompute + acts.backward_transient + acts.refetched,
    )
    return _finish(
        plan,
        moments,
        states,
        acts.per_layer_per_token,
        grads_long_lived=bool(persistent_grads),
        stream_pools=fsdp1_stream_pool_bytes(plan, arch, recipe),
        rounding=activation_rounding_bytes(plan, arch, recipe),
        other_lengths_cache=varying_length_cache_bytes(recipe, length_dependent),
        rebuilt_block_cache=REBUILT_BLOCK_CACHE * acts.recompute,
    )


def _inference_peak(plan: Plan, arch: Architecture, recipe: Recipe, states: ModelStates) -> MemoryBreakdown:
    """Serving/generation: weights, the KV cache for every sequence, one layer's working set, logits."""
    kv_bytes = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1}[
        plan.kv_cache_dtype or ("fp32" if recipe.compute_bytes == 4 else "bf16")
    ]
    kv = sum(2 * b.count * b.num_kv_heads * b.head_dim for b in arch.blocks) * plan.tokens_per_micro_batch * kv_bytes
    a = recipe.compute_bytes
    layer = (
        max(
            a
            * (
                b.num_heads * b.head_dim * 2
                + 2 * b.num_kv_heads * b.head_dim
                + b.experts_per_token * 3 * b.intermediate_size
            )
            for b in arch.blocks
        )
        * plan.tokens_per_micro_batch
    )  # prefill of the whole context, one layer at a time
    logits = plan.micro_batch_size * arch.vocab_size * 4.0  # last position only, fp32
    weights = states.weights / (plan.gpus if plan.sharding in ("zero3", "fsdp") else 1)
    moments = {
        "prefill": {
            "weights": weights,
            "adapters": states.adapters,
            "kv_cache": kv,
            "activations": layer,
            "logits_and_loss": logits,
        },
    }
    return _finish(plan, moments, states, {})


def nccl_buffer_bytes(plan: Plan) -> float:
    """NCCL's device buffers per rank: channels x connection sets x (Simple + LL128 + LL buffers).

    Ring all-gather and reduce-scatter (FSDP, ZeRO) need one connection set per channel; all-reduce
    (DDP) also builds the tree, a second set. Since NCCL 2.22 connections are made when an algorithm
    is first used (NCCL_RUNTIME_CONNECT=1), so an unused algorithm costs nothing. One GPU: no NCCL.
    """
    if plan.gpus == 1:
        return 0.0
    per_connection = NCCL_SIMPLE_BUFFER_BYTES + NCCL_LL128_BUFFER_BYTES + NCCL_LL_BUFFER_BYTES
    sets = 2 if plan.sharding == "none" else 1
    return float(NCCL_MAX_CHANNELS * sets * per_connection)


def fsdp1_stream_pool_bytes(plan: Plan, arch: Architecture, recipe: Recipe) -> float:
    """Bytes FSDP1 holds in the caching allocator's pools of its own CUDA streams.

    FSDP1 all-gathers on an unshard stream and reduce-scatters on a post-backward stream and hands the
    buffers to the compute stream with Tensor.record_stream, so their blocks return only to those
    streams' pools and the compute stream cannot reuse them (the recordStream behaviour FSDP2 removed:
    torchtitan docs/fsdp.md reports 7% lower peak memory for FSDP2 on Llama-7B). The unshard pool
    holds the unit in use plus the in-flight all-gathers the rate limiter allows, and the root unit;
    the post-backward pool one unit's unsharded gradient and its reduced shard.
    """
    if not recipe.fsdp1 or plan.sharding != "fsdp" or plan.gpus == 1:
        return 0.0
    unit = float(arch.largest_block_params * recipe.compute_bytes)
    if plan.quantized is not None:
        unit = sharded_working_bytes(plan, arch, recipe)[0] / 2  # 4-bit blocks gather as stored
    root = float((arch.embedding_params + arch.lm_head_params) * recipe.compute_bytes)
    unshard = (1 + FSDP1_INFLIGHT_ALL_GATHERS) * unit + root
    grad_unit = 0.0
    if plan.is_training and plan.method == "full":
        grad_unit = arch.largest_block_params * (4 if recipe.weight_bytes == 4 else recipe.compute_bytes)
    return unshard + grad_unit * (1 + 1 / plan.gpus)


def _finish(
    plan: Plan,
    moments: dict[str, dict[str, float]],
    states: ModelStates,
    per_layer: dict[str, float],
    grads_long_lived: bool = False,
    stream_pools: float = 0.0,
    rounding: float = 0.0,
    other_lengths_cache: float = 0.0,
    rebuilt_block_cache: float = 0.0,
) -> MemoryBreakdown:
    """The peaks from the moments: allocated at the largest moment; reserved adds what the caching
    allocator holds beyond the live tensors then (fragmentation of the churning memory, segment tails
    of the kept activations); device adds the CUDA context and NCCL. Cached blocks the allocator may give
    back before failing (FSDP1 stream pools, segments of other batch lengths, the cache checkpointed
    rebuilds leave beyond the fragmentation) are reported apart.
    """
    totals = {name: sum(parts.values()) for name, parts in moments.items()}
    peak_name = max(totals, key=lambda name: totals[name])
    components = {k: v for k, v in moments[peak_name].items() if v}
    allocated = totals[peak_name]
    # Tensors allocated once and kept (model states, accumulated gradients) pack tightly; what is
    # allocated and freed every step fragments the cache.
    keys = ["weights", "adapters", "master_weights", "optimizer_states", "ddp_buckets", "kv_cache"]
    if grads_long_lived:
        keys.append("gradients")

    def cache_beyond(parts: dict[str, float], total: float) -> float:
        long_lived = sum(parts.get(k, 0.0) for k in keys)
        extra = FRAGMENTATION_OF_DYNAMIC * (total - long_lived)
        if parts.get("activations"):
            extra += rounding  # the kept activations' segment tails, while they are alive
        return extra

    # The reserved peak is the largest moment's live tensors plus its cache, which may be another moment than
    # the allocated peak's (a load-time spike of temporaries beside a step with more kept tensors); what it
    # holds beyond the allocated peak is the allocator's reserve.
    reserved = max(totals[name] + cache_beyond(parts, totals[name]) for name, parts in moments.items())
    fragmentation = reserved - allocated
    # FSDP1's stream pools stay cached whole beyond the buffers live at the peak moment; they are free
    # blocks, so they show in the counters but do not make a run fail.
    pools_extra = max(0.0, stream_pools - components.get("sharding_buffers", 0.0)) if stream_pools else 0.0
    if other_lengths_cache:
        # The segments of other batch lengths sit beside the training step's moments, not the model load.
        long_lived = sum(components.get(k, 0.0) for k in keys)
        step_peak = max(total for name, total in totals.items() if name != "model_load")
        step_reserved = step_peak + FRAGMENTATION_OF_DYNAMIC * max(0.0, step_peak - long_lived)
        pools_extra += max(0.0, step_reserved + other_lengths_cache - reserved)
    pools_extra += max(0.0, rebuilt_block_cache - fragmentation)
    context = CUDA_CONTEXT_BYTES + nccl_buffer_bytes(plan)
    components["allocator_reserve"] = fragmentation
    components["cuda_context"] = float(context)
    return MemoryBreakdown(
        components=components,
        peak_allocated=allocated,
        peak_reserved=reserved,
        peak_device=reserved + context,
        peak_moment=peak_name,
        moments=totals,
        trainable_params=states.trainable_params,
        activations_per_layer_per_token=per_layer,
        cached_reclaimable=pools_extra,
    )
