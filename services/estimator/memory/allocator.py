"""PyTorch's CUDA caching allocator: block rounding, segments and the cache it keeps.

Source: c10/cuda/CUDACachingAllocator.cpp; measured reserved/allocated gaps in
shared/reference/memory_estimators.md.
"""

from __future__ import annotations

import math

from services.estimator.architecture import Architecture
from services.estimator.memory.activations import (
    Activations,
    _checkpointed_block_bytes_per_token,
    block_saved_bytes_per_token,
)
from services.estimator.plan import Plan
from services.estimator.recipe import Recipe

# What the caching allocator reserves beyond the allocated peak of steady training steps of fixed shapes,
# as (counter gap, fit gap) per unit, by cell (allocator_gap_bytes). Measured by replaying real
# transformers/PEFT steps through CUDACachingAllocator's rules (best fit, split and merge rules, segments
# kept; c10/cuda/CUDACachingAllocator.cpp): python -m benchmarks.mechanisms.allocator writes these medians
# (benchmarks/results/allocator.json, allocator_gap). The counter gap is what max_memory_reserved reads with
# memory to spare; the fit gap what stays when the card is just large enough (release_cached_blocks frees
# wholly free segments and retries before out-of-memory).
ALLOCATOR_GAP = {
    "kept/frozen": (0.18, 0.10),
    "kept/full": (0.74, 0.38),
    "rebuilt/frozen": (1.73, 0.20),
    "rebuilt/full": (7.09, 2.96),
}
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


def allocator_gap_bytes(plan: Plan, acts: Activations, optimizer_states: float) -> tuple[float, float]:
    """(counter, fit) bytes the caching allocator reserves beyond a training step's allocated peak.

    Without checkpointing, blocks freed in backward between still-kept activations leave holes in
    proportion to the kept activations. With it, each block's rebuild is allocated between the gradients
    alive from the block after it, so what stays cached scales with one rebuilt block. Full fine-tuning's
    first optimizer step creates AdamW's states (lazily, torch/optim/adamw.py _init_group) in segments the
    step's activations freed (best fit), pushing the next step's activations into new ones.
    """
    if not plan.is_training:
        return 0.0, 0.0
    unit = acts.recompute if plan.gradient_checkpointing else acts.saved
    states = "full" if plan.method == "full" and optimizer_states > 0 else "frozen"
    counter, fit = ALLOCATOR_GAP[f"{'rebuilt' if plan.gradient_checkpointing else 'kept'}/{states}"]
    return counter * unit, fit * unit


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
