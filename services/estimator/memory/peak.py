"""The peak of a step: the memory in use at each moment of it, and the largest.

The peak is the largest of the memory in use at the moments of a step (end of forward, start of,
during and end of backward, optimizer step), because activations are freed while gradients are
created, and at model load, because PyTorch's peak counters run from process start. Sizes are bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.estimator.architecture import Architecture
from services.estimator.memo import quick_init
from services.estimator.memory.activations import activation_bytes
from services.estimator.memory.allocator import (
    allocator_gap_bytes,
    varying_length_cache_bytes,
)
from services.estimator.memory.device import CUDA_CONTEXT_BYTES, fsdp1_stream_pool_bytes, nccl_buffer_bytes
from services.estimator.memory.loss import logits_bytes
from services.estimator.memory.quantization import dequantized_weight_bytes, quantization_load_bytes
from services.estimator.memory.states import (
    ModelStates,
    autocast_weight_copy_bytes,
    held_architecture,
    model_states,
    sharded_working_bytes,
)
from services.estimator.plan import Plan
from services.estimator.recipe import Recipe

GIB = 1024**3

# What each moment holds, in the order the breakdown lists it.
_STATES = ("weights", "adapters", "master_weights", "optimizer_states", "gradients", "ddp_buckets")
_PARTS: dict[str, tuple[str, ...]] = {
    "end_of_forward": (
        *_STATES,
        *("activations", "autocast_weight_copies", "logits_and_loss", "sharding_buffers", "dequantized_weights"),
    ),
    "start_of_backward": (
        *_STATES,
        *("activations", "autocast_weight_copies", "logits_and_loss", "sharding_buffers", "dequantized_weights"),
    ),
    "during_backward": (
        *_STATES,
        *("activations", "autocast_weight_copies", "temporaries", "sharding_buffers", "dequantized_weights"),
    ),
    "end_of_backward": (*_STATES, "temporaries", "sharding_buffers"),
    "tied_embedding_backward": (*_STATES, "tied_embedding_gradient", "sharding_buffers"),
    "optimizer_step": (*_STATES, "temporaries"),
    "model_load": ("weights", "adapters", "quantization_temporaries"),
    "prefill": ("weights", "adapters", "kv_cache", "activations", "logits"),
}
# Where each moment holds its kept activations (the allocator's segment tails go with them), if it does.
_ACTIVATIONS_AT = {name: parts.index("activations") for name, parts in _PARTS.items() if "activations" in parts}


@quick_init
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
    # The model states the peak was built from (the estimate reports them and prices the step with them).
    states: ModelStates
    # Cached blocks beyond the peak that the counters and nvidia-smi show when memory is plentiful but
    # that the caching allocator frees and retries with before it reports out-of-memory
    # (CUDACachingAllocator: release_cached_blocks on a failed cudaMalloc): FSDP1's stream pools and
    # the segments batches of other lengths left. Not part of the peaks.
    cached_reclaimable: float = 0.0


def peak_memory(plan: Plan, arch: Architecture, recipe: Recipe, states: ModelStates | None = None) -> MemoryBreakdown:
    """Memory per GPU at each moment of a step of ``plan`` and the peaks (``states``: its ``model_states``, where the
    caller holds them already: a search probing micro-batch sizes of one layout)."""
    arch = held_architecture(arch, recipe)
    states = states if states is not None else model_states(plan, arch, recipe)
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

    casts = autocast_weight_copy_bytes(arch, recipe, plan.gradient_checkpointing and plan.method != "full")
    # bitsandbytes: the head's matmul runs last in forward and first in backward; block linears run during
    # backward. GPTQ: the copies autograd saves (gptq_dequantized_bytes).
    dequant_head, dequant_block = dequantized_weight_bytes(plan, arch, recipe)
    static = (states.weights, states.adapters, states.master_weights, states.optimizer_states)
    ddp, all_grads = states.ddp_buckets, persistent_grads + growing_grads
    # The parts of each moment, in _PARTS's order (only the peak moment's are named: _finish).
    moments: dict[str, tuple[float, ...]] = {
        "end_of_forward": (*static, persistent_grads, ddp, acts.saved, casts, logit_fwd, shard_fwd, dequant_head),
        "start_of_backward": (*static, persistent_grads, ddp, acts.saved, casts, logit_bwd, shard_bwd, dequant_head),
        "during_backward": (
            *static,
            persistent_grads + head_grad,
            ddp,
            acts.saved,
            casts,
            acts.recompute + acts.backward_transient + acts.refetched,
            shard_bwd,
            dequant_block,
        ),
        "end_of_backward": (*static, all_grads, ddp, acts.recompute + acts.backward_transient, shard_bwd),
        # A tied embedding is one Parameter used twice: autograd holds the head's gradient in the leaf's input
        # buffer until the embedding's backward (the step's last op) makes its own vocab x hidden gradient and the
        # two are summed (torch/csrc/autograd/input_buffer.cpp InputBuffer::add; CUDA's embedding_dense_backward
        # writes into one new tensor), so one more such tensor sits beside every block's gradient then.
        "tied_embedding_backward": (
            *static,
            all_grads,
            ddp,
            tied_embedding_gradient_bytes(plan, arch, recipe),
            shard_bwd,
        ),
        "optimizer_step": (*static, all_grads, ddp, states.optimizer_temporaries),
        # The counters run from process start, so the load counts: the quantized model, its adapters and
        # the temporaries of quantizing one weight (the optimizer states do not exist yet).
        "model_load": (states.weights, states.adapters, quantization_load_bytes(plan, arch, recipe)),
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
        step_gap=allocator_gap_bytes(plan, acts, states.optimizer_states),
        stream_pools=fsdp1_stream_pool_bytes(plan, arch, recipe),
        rounding=acts.segment_tails,
        other_lengths_cache=varying_length_cache_bytes(recipe, length_dependent),
    )


def tied_embedding_gradient_bytes(plan: Plan, arch: Architecture, recipe: Recipe) -> float:
    """The embedding's own gradient of a trained tied embedding, made before it is added to the head's."""
    if plan.method != "full" or not arch.tie_word_embeddings:
        return 0.0
    return float(arch.lm_head_matmul_params * recipe.weight_bytes)


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
    moments: dict[str, tuple[float, ...]] = {"prefill": (weights, states.adapters, kv, layer, logits)}
    return _finish(plan, moments, states, {})


def _finish(
    plan: Plan,
    moments: dict[str, tuple[float, ...]],
    states: ModelStates,
    per_layer: dict[str, float],
    step_gap: tuple[float, float] = (0.0, 0.0),
    stream_pools: float = 0.0,
    rounding: float = 0.0,
    other_lengths_cache: float = 0.0,
) -> MemoryBreakdown:
    """The peaks from the moments (each moment's parts in ``_PARTS``'s order): allocated at the largest
    moment; reserved adds what the caching allocator cannot give back beyond the step's live tensors (the
    fit part of ``step_gap``, segment tails of the kept activations); device adds the CUDA context and NCCL.
    Cached blocks the allocator may give back before failing (the rest of ``step_gap``, FSDP1 stream pools,
    segments of other batch lengths) are reported apart.
    """
    counter_gap, fit_gap = step_gap
    # Per moment its total, and its live tensors plus its cache (the step's gap was measured over training steps,
    # not the load): the largest of those is the reserved peak, the largest of the step's moments' reads the
    # counters with memory to spare. One pass; maxima taken as ``max`` takes them (the first of equals).
    totals: dict[str, float] = {}
    peak_name, allocated = "", 0.0
    reserved = step_peak = None
    for name, parts in moments.items():
        total = totals[name] = sum(parts)
        if not peak_name or total > allocated:
            peak_name, allocated = name, total
        if name == "model_load":
            cached = total
        else:
            at = _ACTIVATIONS_AT.get(name)
            cached = total + fit_gap + (rounding if at is not None and parts[at] else 0.0)
            if step_peak is None or cached > step_peak:
                step_peak = cached
        if reserved is None or cached > reserved:
            reserved = cached
    assert reserved is not None  # a step has at least one moment
    components = {k: v for k, v in zip(_PARTS[peak_name], moments[peak_name], strict=True) if v}

    # The reserved peak is the largest moment's live tensors plus its cache, which may be another moment than
    # the allocated peak's (a load-time spike of temporaries beside a step with more kept tensors); what it
    # holds beyond the allocated peak is the allocator's reserve.
    # FSDP1's stream pools stay cached whole beyond the buffers live at the peak moment; they are free
    # blocks, so they show in the counters but do not make a run fail.
    pools_extra = max(0.0, stream_pools - components.get("sharding_buffers", 0.0)) if stream_pools else 0.0
    if step_peak is not None:
        # With memory to spare the counters read the whole gap and the segments of other batch lengths.
        pools_extra += max(0.0, step_peak + (counter_gap - fit_gap) + other_lengths_cache - reserved)
    context = CUDA_CONTEXT_BYTES + nccl_buffer_bytes(plan)
    components["allocator_reserve"] = reserved - allocated
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
        states=states,
    )
