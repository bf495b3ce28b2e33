"""PyTorch's CUDA caching allocator: block rounding, segments and the cache it keeps.

Source: c10/cuda/CUDACachingAllocator.cpp; measured reserved/allocated gaps in
shared/reference/memory_estimators.md.
"""

from __future__ import annotations

from services.estimator.architecture import Architecture
from services.estimator.memory.activations import Activations, activation_bytes
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


def allocator_gap_bytes(plan: Plan, acts: Activations, optimizer_states: float) -> tuple[float, float]:
    """(counter, fit) bytes the caching allocator reserves beyond a training step's allocated peak.

    Without checkpointing, blocks freed in backward between still-kept activations leave holes in
    proportion to the kept activations. With it, each block's rebuild is allocated between the gradients
    alive from the block after it, so what stays cached scales with one rebuilt block. Offloaded activations
    come back the same way, one block just before its backward (``Activations.refetched``), so without
    checkpointing they take the rebuilt pattern too: read as kept, the small on-GPU stash made the gap vanish, and
    turning checkpointing on raised the peak by 4.6 GiB (a probe of the estimator; no measured case offloads
    without checkpointing, so the rebuilt factors are carried over, not fitted). Full fine-tuning's
    first optimizer step creates AdamW's states (lazily, torch/optim/adamw.py _init_group) in segments the
    step's activations freed (best fit), pushing the next step's activations into new ones.
    """
    if not plan.is_training:
        return 0.0, 0.0
    rebuilt = plan.gradient_checkpointing or acts.offloaded > 0
    unit = max(acts.recompute, acts.refetched) if rebuilt else acts.saved
    states = "full" if plan.method == "full" and optimizer_states > 0 else "frozen"
    counter, fit = ALLOCATOR_GAP[f"{'rebuilt' if rebuilt else 'kept'}/{states}"]
    return counter * unit, fit * unit


def activation_rounding_bytes(plan: Plan, arch: Architecture, recipe: Recipe) -> float:
    """Segment tails of the activations kept for backward (``Activations.segment_tails``); 0 off training."""
    return activation_bytes(plan, arch, recipe).segment_tails if plan.is_training else 0.0


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
