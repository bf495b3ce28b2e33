"""The per-layer activation rules against real transformers/PEFT code (needs the trace extra)."""

from __future__ import annotations

import pytest

from tests.conftest import require_trace_extra


@pytest.mark.slow
def test_activation_rules_match_transformers_within_10_percent() -> None:
    require_trace_extra()
    from benchmarks.mechanisms.run import SCENARIOS, measure_scenario

    for scenario in SCENARIOS:
        row = measure_scenario(*scenario)
        assert abs(row["error_pct"]) <= 10, row


def test_kernels_per_block_match_a_transformers_llama_layer() -> None:
    """The kernel counts behind the dispatch floor, counted on the real LlamaDecoderLayer (no timing here:
    the host time per kernel is a benchmark, python -m benchmarks.mechanisms.dispatch)."""
    require_trace_extra()
    from benchmarks.mechanisms.dispatch import kernels_per_layer
    from services.estimator.throughput import BACKWARD_KERNELS_PER_FORWARD, KERNELS_PER_BLOCK_FORWARD

    for dtype in ("float32", "bfloat16"):
        forward, backward = kernels_per_layer(dtype)
        assert forward == pytest.approx(KERNELS_PER_BLOCK_FORWARD, rel=0.1), (dtype, forward)
        assert backward / forward == pytest.approx(BACKWARD_KERNELS_PER_FORWARD, rel=0.1), (dtype, backward)
