"""The planner's fit rule against measured runs: it offers the card a near-limit run ran on, and refuses the card
a measured out-of-memory run failed on (benchmarks/accuracy/cases.jsonl, the sources' own measurements)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from services.catalog.gpus import find_gpu
from services.catalog.offers import Offer
from services.estimator.plan import Plan
from services.planner import Constraints, plan_setups
from services.planner.models import Recommendation

CASES = Path(__file__).resolve().parents[2] / "benchmarks" / "accuracy" / "cases.jsonl"
DATA = {"examples": 1_000, "avg_tokens_per_example": 512, "epochs": 1}


def _case(case_id: str) -> dict[str, Any]:
    for line in CASES.read_text(encoding="utf-8").splitlines():
        if line.strip():
            case = json.loads(line)
            if case["id"] == case_id:
                return dict(case)
    raise LookupError(case_id)


def _recommendations(case_id: str, **constraints: Any) -> list[Recommendation]:
    """What the planner recommends for the case's plan on a catalog of its own card only, on at most its GPU
    count, without CPU offload."""
    case = _case(case_id)
    plan = Plan.model_validate({**case["plan"], "data": DATA})
    spec = find_gpu(case["gpu"])
    offer = Offer("acme", spec.name, plan.gpus, 2.0, None, "USD", "eu-west", "DE", "NVLink", "2026-11-01", "test")
    result = plan_setups(
        plan, [offer], None, Constraints(max_gpus=plan.gpus, allow_cpu_offload=False, **constraints), top_n=50
    )
    assert all(r.gpu == spec.name for r in result.recommendations)
    return list(result.recommendations)


def _is_the_run(case_id: str, r: Recommendation) -> bool:
    """Whether a recommendation is the setup the case ran (sharding, micro-batch, checkpointing)."""
    plan = _case(case_id)["plan"]
    sharding = plan.get("sharding", "none")
    return (
        r.gpus == plan["gpus"]
        and r.sharding == sharding
        and r.micro_batch_size == plan["micro_batch_size"]
        and r.gradient_checkpointing == bool(plan.get("gradient_checkpointing"))
    )


# Runs that ran with a predicted fit of 0.86-0.94 of their card: the flat 10% margin refused three of them.
@pytest.mark.parametrize("case_id", ["litgptrt-1", "swift-20", "qwenlm-37", "litgptrt-6"])
def test_a_near_limit_run_that_ran_is_offered_its_card(case_id: str) -> None:
    assert _recommendations(case_id)


def test_the_setup_a_near_limit_run_used_is_offered_tight() -> None:
    # litgptrt-1 (LoRA 13B, one A100 40GB, micro-batch 1, no checkpointing) ran; its band reaches above the card
    # at p90, so the same setup is offered, marked tight.
    (rec,) = [r for r in _recommendations("litgptrt-1") if _is_the_run("litgptrt-1", r)]
    assert any(n.startswith("tight: predicted peak") and "(p90)" in n for n in rec.notes)


@pytest.mark.parametrize("case_id", ["litgptrt-7", "litgptrt-10"])
def test_a_measured_out_of_memory_run_is_refused_its_card(case_id: str) -> None:
    # Falcon-40B LoRA on one and on four A100 40GB: out of memory as measured, and no setup within the same
    # GPUs fits by the planner's rule either.
    assert _recommendations(case_id) == []


def test_the_setup_of_a_measured_out_of_memory_run_is_not_offered() -> None:
    # litgptrt-5: LoRA 13B on 2 x A100 40GB with FSDP, micro-batch 1 and checkpointing ran out of memory. The
    # planner may offer the card with another setup (litgptrt-1 ran the same model on one such GPU), not that one.
    recs = _recommendations("litgptrt-5")
    assert not any(_is_the_run("litgptrt-5", r) for r in recs)


def test_a_user_margin_comes_on_top_of_the_headroom() -> None:
    # litgptrt-1 ran at a predicted 94% of its card: with a 10% extra margin its own setup is no longer offered.
    assert any(_is_the_run("litgptrt-1", r) for r in _recommendations("litgptrt-1"))
    assert not any(_is_the_run("litgptrt-1", r) for r in _recommendations("litgptrt-1", safety_margin=0.10))
