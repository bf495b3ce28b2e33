"""Keeping the plan's effective batch when the GPU count changes.

The optimizer sees ``micro_batch_size x gradient_accumulation_steps x gpus`` samples per step; changing
it changes the training (the learning-rate schedule was tuned for it), so every candidate keeps it, or,
where the GPUs cannot split it evenly, takes the smallest larger one. The largest micro-batch of a split
that fits a card is found by bisection over its divisors (``largest_fitting_micro_batch``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from services.estimator.plan import Optimizer, Plan, Sharding
from services.planner.evaluator import Config, Evaluator


def effective_batch_size(plan: Plan) -> int:
    """Samples per optimizer step of the plan as written."""
    return plan.effective_batch_size


def samples_per_gpu(effective: int, gpus: int) -> int:
    """Samples each GPU processes per optimizer step: the effective batch split evenly, rounded up."""
    return -(-effective // gpus)


@functools.lru_cache(maxsize=4096)
def divisors(n: int) -> tuple[int, ...]:
    """All divisors of ``n`` in ascending order (the micro-batch sizes that split ``n`` exactly)."""
    small: list[int] = []
    large: list[int] = []
    i = 1
    while i * i <= n:
        if n % i == 0:
            small.append(i)
            if i != n // i:
                large.append(n // i)
        i += 1
    return (*small, *reversed(large))


@dataclass(frozen=True)
class BatchSplit:
    """How a candidate with ``gpus`` GPUs reaches the plan's effective batch."""

    gpus: int
    samples_per_gpu: int
    micro_batch_sizes: tuple[int, ...]  # ascending; each divides samples_per_gpu
    effective_batch_size: int  # samples_per_gpu x gpus: the plan's, or the smallest larger reachable one

    def accumulation_steps(self, micro_batch_size: int) -> int:
        return self.samples_per_gpu // micro_batch_size


@functools.lru_cache(maxsize=4096)
def batch_split(effective: int, gpus: int) -> BatchSplit:
    """The micro-batch sizes m (with accumulation a) such that m x a x gpus is the effective batch,
    or the smallest effective batch above it that ``gpus`` GPUs can reach."""
    per_gpu = samples_per_gpu(effective, gpus)
    return BatchSplit(gpus, per_gpu, divisors(per_gpu), per_gpu * gpus)


def config_for(
    split: BatchSplit,
    sharding: Sharding,
    micro_batch_size: int,
    checkpointing: bool,
    cpu_offload: bool = False,
    optimizer: Optimizer | None = None,
) -> Config:
    return Config(
        split.gpus,
        sharding,
        micro_batch_size,
        split.accumulation_steps(micro_batch_size),
        checkpointing,
        cpu_offload,
        optimizer,
    )


def largest_fitting_micro_batch(
    evaluator: Evaluator,
    split: BatchSplit,
    sharding: Sharding,
    checkpointing: bool,
    usable_bytes: float,
    cpu_offload: bool = False,
    optimizer: Optimizer | None = None,
) -> int | None:
    """The largest micro-batch (a divisor of the per-GPU samples) whose peak fits, or None.

    Tries the smallest first, then the largest, then bisects; each probe compares the micro-batch's sized bytes
    (``Evaluator.sized_by_micro_batch``: the same on every card) with the card's ``usable_bytes``. Memory grows with
    the micro-batch among those that accumulate; the largest, one micro-batch per step, accumulates nothing and can
    need less (services.estimator.memory's accumulation terms: under FSDP the gradients of every micro-batch but the
    last are kept whole), so it is tried even where the smallest does not fit (a 70B full fine-tune on 8 x B200
    fitted at micro-batch 2 and was planned with CPU offload at a fifteenth of the speed).
    """
    sizes = split.micro_batch_sizes
    key = (split.gpus, split.samples_per_gpu, sharding, checkpointing, cpu_offload, optimizer)
    sized = evaluator.sized_by_micro_batch(key, len(sizes))

    def fits(index: int) -> bool:
        evaluator.memory_probes += 1
        found = sized[index]
        if found is None:
            cfg = config_for(split, sharding, sizes[index], checkpointing, cpu_offload, optimizer)
            found = sized[index] = evaluator.sized_bytes(cfg)
        return found <= usable_bytes

    last = len(sizes) - 1
    if not fits(0):
        return sizes[last] if last > 0 and fits(last) else None
    if last == 0 or fits(last):
        return sizes[last]
    lo, hi = 0, last  # sizes[lo] fits, sizes[hi] does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return sizes[lo]
