"""The memory counters an estimate names, and the fit bytes beside them."""

from __future__ import annotations

import pytest

from services.catalog.gpus import find_gpu
from services.estimator.counters import MemoryCounters, memory_counters
from services.estimator.estimate import estimate
from services.estimator.plan import Plan
from services.estimator.reports import MemoryReport

PLAN = {
    "model": {"name": "meta-llama/Llama-3.1-8B"},
    "method": "lora",
    "framework": "hf-trainer",
    "seq_len": 2048,
    "micro_batch_size": 2,
}


def _counters(gpu: str = "A100 80GB") -> tuple[MemoryReport, MemoryCounters]:
    report = estimate(Plan.model_validate(PLAN), find_gpu(gpu))
    return report.memory, memory_counters(report.memory)


def test_the_counters_order_as_the_allocator_builds_them() -> None:
    # Reserved segments hold the allocated tensors, and nvidia-smi shows the segments plus the CUDA context.
    _, c = _counters()
    assert c.allocated_gib <= c.reserved_gib <= c.nvidia_smi_gib


def test_the_fit_bytes_are_the_device_peak_without_the_cache_the_allocator_hands_back() -> None:
    mem, c = _counters()
    assert c.fit_gib == mem.peak_device_gib
    assert c.nvidia_smi_gib == pytest.approx(mem.peak_device_gib + mem.reclaimable_cache_gib)
    assert c.fit_gib <= c.nvidia_smi_gib


def test_a_measurement_that_names_no_counter_reads_as_reserved() -> None:
    _, c = _counters()
    assert c.counter("unknown") == c.counter("reserved") == c.reserved_gib
    assert c.counter("device") == c.nvidia_smi_gib
    with pytest.raises(ValueError, match="metric"):
        c.counter("peak")
