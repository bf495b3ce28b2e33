"""The node calibration's training step (services/agent/calibrate.py) on the CPU: it runs the plan's autocast,
so what it measures is the step the estimate it calibrates describes (needs the trace extra; CI installs it)."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.device.grid import SMOKE_CONFIG
from services.estimator.plan import Plan
from services.estimator.recipe import resolve_recipe
from tests.conftest import require_trace_extra

pytestmark = [pytest.mark.filterwarnings("ignore::FutureWarning"), pytest.mark.filterwarnings("ignore::UserWarning")]

TINY = SMOKE_CONFIG  # the device grid's smoke model: a tiny Llama any CPU trains in a second


@pytest.mark.parametrize(
    ("precision", "framework", "dtype"),
    [("bf16-mixed", "pytorch", "bfloat16"), ("bf16", "hf-trainer", "bfloat16"), ("fp32", "pytorch", None)],
)
def test_the_calibration_step_runs_under_the_plans_autocast(
    precision: str, framework: str, dtype: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_trace_extra()
    import torch

    from services.agent.calibrate import run_calibration

    plan = Plan.model_validate(
        {
            "model": {"name": "tiny", "config": TINY},
            "method": "lora",
            "lora": {"rank": 4},
            "framework": framework,
            "precision": precision,
            "micro_batch_size": 2,
            "seq_len": 32,
        }
    )
    seen: list[tuple[Any, bool]] = []
    real = torch.autocast

    def recording(device_type: str, dtype: Any = None, enabled: bool = True, **kwargs: Any) -> Any:
        seen.append((dtype, enabled))
        return real(device_type, dtype=dtype, enabled=enabled, **kwargs)

    monkeypatch.setattr(torch, "autocast", recording)
    result = run_calibration(plan, TINY, warmup_steps=1, timed_steps=1)
    assert result["tokens_per_s"] > 0 and result["comparable"]
    # Every step's forward entered autocast as the recipe says: on for the -mixed precisions and the Trainer's
    # 16-bit recipe, in the plan's compute dtype; off for fp32.
    assert len(seen) == 2 and all(enabled == resolve_recipe(plan).autocast for _, enabled in seen)
    assert all(enabled == (dtype is not None) for _, enabled in seen)
    if dtype is not None:
        assert all(d == getattr(torch, dtype) for d, _ in seen)
