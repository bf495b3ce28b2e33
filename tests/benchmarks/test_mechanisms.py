"""The per-layer activation rules against real transformers/PEFT code (needs the trace extra)."""

from __future__ import annotations

import importlib.util

import pytest

from tests.conftest import require_service


@pytest.mark.slow
def test_activation_rules_match_transformers_within_10_percent() -> None:
    available = all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers", "peft"))
    require_service("the trace extra (torch, transformers, peft)", available, "bash infra/dev.sh test")
    from benchmarks.mechanisms.run import SCENARIOS, measure_scenario

    for scenario in SCENARIOS:
        row = measure_scenario(*scenario)
        assert abs(row["error_pct"]) <= 10, row
