"""The CUDA caching allocator's rounding: the block a request gets and the segment it comes from.

Source: c10/cuda/CUDACachingAllocator.cpp (round_size, get_allocation_size, should_split).
"""

from __future__ import annotations

import math

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
