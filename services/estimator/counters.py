"""The memory counters an estimate predicts, and the bytes that decide whether it fits (pure).

A run's memory is read from one of three counters: ``torch.cuda.max_memory_allocated`` (tensors alive at
the peak), ``torch.cuda.max_memory_reserved`` (the caching allocator's segments) and nvidia-smi (the
reserved segments plus the CUDA context and library workspaces). When memory is plentiful, reserved and
nvidia-smi also show free cached blocks the step did not need (``reclaimable_cache_gib``); the allocator
frees those and retries before it reports out-of-memory (CUDACachingAllocator, release_cached_blocks), so
the fit is decided on the device peak without them.

A source that does not say which counter it read is compared with reserved: the counter most tools print
(the HF Trainer's and most frameworks' loggers) and the one that allocated under-states.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

# The counter a measurement is read as when its source does not name one.
UNNAMED_COUNTER = "reserved"
COUNTERS = ("allocated", "reserved", "device")


class _PeaksGib(Protocol):
    @property
    def peak_allocated_gib(self) -> float: ...
    @property
    def peak_reserved_gib(self) -> float: ...
    @property
    def peak_device_gib(self) -> float: ...
    @property
    def reclaimable_cache_gib(self) -> float: ...


@dataclass(frozen=True)
class MemoryCounters:
    """GiB per GPU each counter shows at the step's peak, and the GiB a fit is decided on."""

    allocated_gib: float  # torch.cuda.max_memory_allocated
    reserved_gib: float  # torch.cuda.max_memory_reserved, free cached blocks included
    nvidia_smi_gib: float  # whole-device usage, free cached blocks included
    fit_gib: float  # the device peak without the reclaimable cache: what the fit check and the planner use

    def counter(self, metric: str) -> float:
        """The predicted value of the counter a measurement ``metric`` names (allocated, reserved, device,
        or unknown, which reads as reserved)."""
        if metric == "unknown":
            metric = UNNAMED_COUNTER
        if metric == "allocated":
            return self.allocated_gib
        if metric == "reserved":
            return self.reserved_gib
        if metric == "device":
            return self.nvidia_smi_gib
        raise ValueError(f"metric: one of allocated, reserved, device, unknown (got {metric!r})")


def memory_counters(memory: _PeaksGib) -> MemoryCounters:
    """The counters of an estimate's memory report (``Estimate.memory``)."""
    cache = memory.reclaimable_cache_gib
    return MemoryCounters(
        allocated_gib=memory.peak_allocated_gib,
        reserved_gib=memory.peak_reserved_gib + cache,
        nvidia_smi_gib=memory.peak_device_gib + cache,
        fit_gib=memory.peak_device_gib,
    )
