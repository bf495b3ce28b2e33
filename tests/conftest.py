"""Shared test helpers. Pure-core tests need no fixtures; these only build plans."""

from __future__ import annotations

from typing import Any

from services.estimator.plan import Plan

LLAMA_8B: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
    "max_position_embeddings": 131072,
}


def make_plan(**fields: Any) -> Plan:
    data: dict[str, Any] = {"model": {"name": "llama-8b", "config": LLAMA_8B}}
    data.update(fields)
    return Plan.model_validate(data)


def require_service(name: str, available: bool, how_to_start: str) -> None:
    """Skip a test whose service is absent, or fail it under CI (GPUPLAN_REQUIRE_SERVICES=1)."""
    import os

    import pytest

    if available:
        return
    message = f"{name} is not reachable; start it with: {how_to_start}"
    if os.environ.get("GPUPLAN_REQUIRE_SERVICES") == "1":
        pytest.fail(message)
    pytest.skip(message)


def require_trace_extra() -> None:
    """Skip (or, under CI, fail) a test that needs torch, transformers and peft."""
    import importlib.util

    available = all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers", "peft"))
    require_service("the trace extra (torch, transformers, peft)", available, "bash infra/dev.sh test")


def _hypothesis_profiles() -> None:
    import os

    from hypothesis import settings

    # CI explores the same examples every run (a red build means a regression, not a new seed);
    # local runs draw new ones. GPUPLAN_HYPOTHESIS=deep explores ten times more.
    settings.register_profile("dev", max_examples=150)
    settings.register_profile("ci", max_examples=150, derandomize=True)
    settings.register_profile("deep", max_examples=1500)
    if os.environ.get("GPUPLAN_HYPOTHESIS") == "deep":
        settings.load_profile("deep")
    elif os.environ.get("CI") == "true":
        settings.load_profile("ci")
    else:
        settings.load_profile("dev")


_hypothesis_profiles()
