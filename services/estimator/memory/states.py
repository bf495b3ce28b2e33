"""Model states per GPU: weights, adapters, master copies, gradients, optimizer states.

Sources: the DeepSpeed ZeRO paper (Rajbhandari et al. 2020, arXiv 1910.02054) and
``estimate_zero{2,3}_model_states_mem_needs``; bitsandbytes for 8-bit optimizer states.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from services.estimator.architecture import Architecture, Linear, parameter_counts
from services.estimator.architecture.parse import canonical_architecture
from services.estimator.memo import quick_init
from services.estimator.memory.quantization import (
    int8_row_scale_bytes,
    quantized_bytes_per_weight,
    quantized_params,
    unsharded_quant_constant_bytes,
)
from services.estimator.plan import Plan
from services.estimator.recipe import Recipe

# bitsandbytes blockwise 8-bit optimizer states: 1 byte + fp32 absmax per 2048-element block, per state.
ADAM8BIT_STATE_BYTES = 1 + 4 / 2048


@quick_init
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


def lora_roles_of(linear: Linear, recipe: Recipe) -> tuple[str, ...]:
    return tuple(role for role in linear.roles if role in recipe.lora_targets)


def lora_adapter_params(linear: Linear, recipe: Recipe) -> int:
    """LoRA A (r x in) and B (out x r) for the targeted part of one (possibly fused) linear."""
    roles = lora_roles_of(linear, recipe)
    if not roles:
        return 0
    out = linear.out_features * len(roles) // len(linear.roles)
    return linear.copies * recipe.lora_rank * (linear.in_features + out)


# Adapter sizes memoised by value (architecture, LoRA targets, rank): an estimate and the planner ask many times.
ADAPTER_CACHE_SIZE = 256


def adapter_params(arch: Architecture, recipe: Recipe) -> int:
    return _adapter_params(arch, recipe.lora_targets, recipe.lora_rank)


@lru_cache(maxsize=ADAPTER_CACHE_SIZE)
def _adapter_params(arch: Architecture, targets: tuple[str, ...], rank: int) -> int:
    total = 0
    for b in arch.blocks:
        for lin in b.linears:
            roles = sum(1 for role in lin.roles if role in targets)
            if roles:
                out = lin.out_features * roles // len(lin.roles)
                total += b.count * lin.copies * rank * (lin.in_features + out)
    if "lm_head" in targets:
        total += rank * (arch.hidden_size + arch.vocab_size)
    return total


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
    scales = int8_row_scale_bytes(plan, arch, recipe)
    return q * per + scales + (total - q) * recipe.unquantized_weight_bytes, q


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
        return canonical_architecture(replace(arch, tie_word_embeddings=False))
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
    if shard == "zero1" and recipe.master_weights and param_bytes == 2 and plan.precision.startswith("fp16"):
        # DeepSpeed's stage-1 optimizer of an fp16 model (runtime/zero/stage_1_and_2.py, partition_grads off)
        # all-reduces the whole 16-bit gradients and makes fp32 only of this rank's partition (a helper's probe of the
        # estimator found all 6 bytes kept whole). A bf16 model at stage 1 runs BF16_Optimizer instead
        # (runtime/engine.py _do_optimizer_sanity_check), whose fp32 gradient buffer is whole: the 2 + 4 above.
        grads = float(trainable * param_bytes) + float(trainable * 4) / n
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
        # An NF4 base's block constants are not partitioned: every rank holds them whole.
        replicated = unsharded_quant_constant_bytes(plan, arch, recipe)
        weights = (weights - replicated) / n + replicated
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


def clear_adapter_caches() -> None:
    """Forget the memoised adapter sizes (tests that count the work of one estimate start from none)."""
    _adapter_params.cache_clear()
    _largest_tensor.cache_clear()


def _largest_trainable_tensor(arch: Architecture, plan: Plan, recipe: Recipe) -> int:
    if plan.method == "full":
        return _largest_tensor(arch, (), 0, True)
    return _largest_tensor(arch, recipe.lora_targets, recipe.lora_rank, False)


@lru_cache(maxsize=ADAPTER_CACHE_SIZE)
def _largest_tensor(arch: Architecture, targets: tuple[str, ...], rank: int, full: bool) -> int:
    if full:
        biggest_linear = arch.largest_linear_weights
        return max(biggest_linear, arch.embedding_params)
    sizes = [
        rank * max(lin.in_features, lin.out_features)
        for b in arch.blocks
        for lin in b.linears
        if any(role in targets for role in lin.roles)
    ]
    if "lm_head" in targets:
        sizes.append(rank * arch.vocab_size)
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
        float((arch.embedding_params + arch.lm_head_params) * recipe.compute_bytes)
        if recipe.fsdp_root_gathered
        else 0.0
    )
    fwd = 2 * block + root
    grad_block = 0.0
    if plan.method == "full" and plan.is_training:
        grad_block = arch.largest_block_params * (4 if recipe.weight_bytes == 4 else recipe.compute_bytes)
    return fwd, fwd + grad_block


def autocast_weight_copy_bytes(arch: Architecture, recipe: Recipe, checkpointed_frozen_blocks: bool = False) -> float:
    """16-bit copies of the fp32 matmul weights that autocast makes and autograd keeps until backward.

    After prepare_model_for_kbit_training only the output head is an fp32 matmul weight (the block
    linears are 4/8-bit and dequantize themselves), so only its copy is kept for the input gradient.
    """
    if recipe.kbit_fp32_upcast:
        return float(arch.lm_head_matmul_params * recipe.compute_bytes)
    if not recipe.autocast_weight_copies:
        return 0.0
    if checkpointed_frozen_blocks:
        # Autocast caches a cast only for a leaf that requires grad (aten/src/ATen/autocast_mode.cpp,
        # cached_cast); a frozen weight's copy lives only as a tensor autograd saves, and a checkpointed
        # block saves none: only the head's copy (its matmul is outside the blocks) is kept.
        return float(arch.lm_head_matmul_params * recipe.compute_bytes)
    matmul = arch.block_linear_weights
    return float((matmul + arch.lm_head_matmul_params) * recipe.compute_bytes)
