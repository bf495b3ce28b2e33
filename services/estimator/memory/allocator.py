"""PyTorch's CUDA caching allocator: block rounding, segments and the cache it keeps.

Source: c10/cuda/CUDACachingAllocator.cpp; measured reserved/allocated gaps in
shared/reference/memory_estimators.md.
"""

from __future__ import annotations

import math

from services.estimator.architecture import Architecture
from services.estimator.memory.activations import _checkpointed_block_bytes_per_token, block_saved_bytes_per_token
from services.estimator.plan import Plan
from services.estimator.recipe import Recipe

# The caching allocator's extra reservation over the live tensors *within* a step of fixed shapes, as a
# share of the memory that is allocated and freed within the step (activations, gradients in backward,
# temporaries): blocks freed between kept ones leave holes that the next, differently sized request
# cannot use. Runs that log both counters show reserved 10-20% above allocated
# (shared/reference/memory_estimators.md). GMLake (Guo et al., ASPLOS 2024, arXiv 2401.08156, abstract)
# states that its virtual-memory stitching reduces GPU memory use by 9.2 GB on average (up to 25 GB) and
# fragmentation by 15% (up to 33%) against PyTorch's caching allocator, over eight LLMs on A100-80GB: a
# reduction of the whole reserved pool's fragmentation, not a share of the memory freed within a step.
# 0.15 of the churning part reuses that number for a different quantity and is a hand choice (kind
# "tuned" in services/estimator/constants.toml: kept where the in-sample benchmark scored best, issue 26);
# long-lived model states stay packed. The public cases that log max_memory_reserved still read 8-11%
# above this estimate (docs/accuracy.md). Steps of changing shape add varying_length_cache_bytes.
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
