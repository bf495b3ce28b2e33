"""What `gpuplan plans get` prints per setup (services/cli/plans.py), against numbers worked out by hand."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from services.cli.plans import _print_plan


def test_a_spot_setup_shows_its_own_hours_and_the_cards_listed_memory(capsys: pytest.CaptureFixture[str]) -> None:
    # A quote probe of stop 52: "13.7 of 22 GiB, 2.8 h" for a spot setup whose expected_hours is 2.986 (2.778 is the
    # on-demand run's `hours`) on an A10 of 22.5 GiB.
    rec: dict[str, Any] = {
        "gpus": 1,
        "gpu": "A10",
        "provider": "spotty",
        "pricing": "spot",
        "expected_cost_usd": 0.56,
        "expected_hours": 2.986,
        "hours": 2.778,
        "cost_usd": 2.33,
        "spot_cost_usd": 0.56,
        "peak_gib_per_gpu": 13.72,
        "gpu_memory_gib": 22.5,
        "notes": [],
    }
    _print_plan(argparse.Namespace(json=False), {"id": "p1", "status": "done", "recommendations": [rec]})
    line = capsys.readouterr().out.splitlines()[1]
    assert "13.7 of 22.5 GiB, 3.0 h, $2.33 on demand, spot $0.56" in line, line
