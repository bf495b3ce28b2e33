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
