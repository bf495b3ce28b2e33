"""Bounded work per estimate (issue 15.3): sizes over what exists are refused naming the field, and an
estimate's work does not grow with the layer count."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import pytest

from services.catalog.models import find_model
from services.estimator.architecture import architecture_from_config
from services.estimator.architecture.config import sparse_layer_count
from services.estimator.bounds import CONFIG_FIELDS, EXPERTS, HIDDEN, LAYERS, VOCAB
from services.estimator.budget import CpuBudget, WorkBudgetExceeded
from services.estimator.errors import EstimatorError
from services.estimator.estimate import estimate
from services.estimator.resolved import clear_architecture_cache
from services.estimator.validation import PlanError, parse_plan


def _config(hf_id: str, **change: Any) -> dict[str, Any]:
    return {**find_model(hf_id).config, **change}


def _lines_executed(run: Callable[[], object]) -> int:
    """Lines of gpuplan's own code executed by ``run``: a deterministic measure of its work (from empty
    per-plan caches, so what earlier tests left in them does not change the count)."""
    from services.estimator.throughput import clear_work_caches

    clear_work_caches()
    count = 0

    def tracer(frame: FrameType, event: str, _arg: object) -> Any:
        nonlocal count
        if "/services/" not in frame.f_code.co_filename:
            return None
        if event == "line":
            count += 1
        return tracer

    sys.settrace(tracer)
    try:
        run()
    finally:
        sys.settrace(None)
    return count


@pytest.mark.parametrize(
    ("hf_id", "layers_field"),
    [
        ("meta-llama/Llama-3.1-8B", "num_hidden_layers"),
        ("Qwen/Qwen3-30B-A3B", "num_hidden_layers"),
        ("mistralai/Mixtral-8x7B-v0.1", "num_hidden_layers"),
        ("google/flan-t5-xl", "num_layers"),
        ("openai-community/gpt2", "n_layer"),
    ],
)
def test_an_estimate_for_126_layers_does_the_same_work_as_for_32(hf_id: str, layers_field: str) -> None:
    def run(layers: int) -> Callable[[], object]:
        plan = parse_plan({"model": {"config": _config(hf_id, **{layers_field: layers})}, "method": "lora"})
        # The parse is part of the work: each count starts without a parsed architecture.
        return lambda: (clear_architecture_cache(), estimate(plan, "A100 80GB"))

    run(32)()  # warm caches (catalog files) so both counts measure the estimate alone
    assert _lines_executed(run(126)) == _lines_executed(run(32))


def test_qwen_moe_sparse_layers_are_counted_without_a_loop_over_layers() -> None:
    for layers, step, dense in [(48, 1, ()), (48, 2, (1, 3, 4)), (24, 3, (2, 5, 100)), (7, 4, (3, 3)), (5, 0, ())]:
        naive = sum(1 for i in range(layers) if i not in set(dense) and step > 0 and (i + 1) % step == 0)
        assert sparse_layer_count(layers, step, dense) == naive
    started = time.perf_counter()
    assert sparse_layer_count(10**12, 1, (0,)) == 10**12 - 1
    assert time.perf_counter() - started < 0.1


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"num_hidden_layers": 200_000_000}, "model.config.num_hidden_layers"),
        ({"num_hidden_layers": 1_000_000, "hidden_size": 10_000_000}, "model.config.hidden_size"),
        ({"vocab_size": VOCAB.limit + 1}, "model.config.vocab_size"),
        ({"intermediate_size": 10**9}, "model.config.intermediate_size"),
        ({"num_attention_heads": 10**6}, "model.config.num_attention_heads"),
        ({"num_key_value_heads": 10**6}, "model.config.num_key_value_heads"),
        ({"head_dim": 10**6}, "model.config.head_dim"),
        ({"max_position_embeddings": 10**12}, "model.config.max_position_embeddings"),
        ({"num_attention_heads": 0}, "model.config.num_attention_heads"),
        # Zero sizes a fuzzing pass saw estimated as if real (stop 49).
        ({"vocab_size": 0}, "model.config.vocab_size"),
        ({"head_dim": 0}, "model.config.head_dim"),
        ({"intermediate_size": 0}, "model.config.intermediate_size"),
    ],
)
def test_sizes_over_any_real_model_are_refused_naming_the_field(change: dict[str, int], field: str) -> None:
    with pytest.raises(EstimatorError) as raised:
        architecture_from_config(_config("meta-llama/Llama-3.1-8B", **change))
    assert raised.value.field == field


def test_moe_and_nested_sizes_are_bounded() -> None:
    with pytest.raises(EstimatorError) as raised:
        architecture_from_config(_config("Qwen/Qwen3-30B-A3B", num_experts=EXPERTS.limit + 1))
    assert raised.value.field == "model.config.num_experts"
    with pytest.raises(EstimatorError) as raised:
        architecture_from_config(_config("Qwen/Qwen3-30B-A3B", num_experts_per_tok=200))
    assert raised.value.field == "model.config.num_experts_per_tok"
    gemma = _config("google/gemma-3-4b-pt")
    gemma["text_config"] = {**gemma["text_config"], "num_hidden_layers": 10**6}
    with pytest.raises(EstimatorError) as raised:
        architecture_from_config(gemma)
    assert raised.value.field == "model.config.text_config.num_hidden_layers"
    gemma = _config("google/gemma-3-4b-pt", vision_config={"patch_size": 0, "image_size": 896})
    with pytest.raises(EstimatorError) as raised:
        architecture_from_config(gemma)
    assert raised.value.field == "model.config.vision_config.patch_size"


def test_the_largest_real_models_pass_their_bounds() -> None:
    # Llama 3.1 405B's shape, the largest dense config in the catalog's families.
    big = _config(
        "meta-llama/Llama-3.1-8B",
        num_hidden_layers=126,
        hidden_size=16_384,
        intermediate_size=53_248,
        num_attention_heads=128,
        num_key_value_heads=8,
    )
    assert architecture_from_config(big).num_layers == 126
    assert LAYERS.limit >= 8 * 126 and HIDDEN.limit >= 6 * 20_480 and VOCAB.limit >= 8 * 262_208
    assert all(bound.limit > 0 and bound.largest_real for bound in CONFIG_FIELDS.values())


@pytest.mark.parametrize(
    ("value", "problem"),
    [(float("inf"), "finite"), (float("nan"), "finite"), (10**300, "too large"), ("a\ud800", "surrogate")],
)
def test_config_values_json_cannot_carry_are_plan_errors(value: object, problem: str) -> None:
    with pytest.raises(PlanError) as raised:
        parse_plan({"model": {"config": _config("meta-llama/Llama-3.1-8B", rope_theta=value)}})
    assert raised.value.problems[0].startswith("model.config.rope_theta:") and problem in raised.value.problems[0]


def test_a_config_nested_deeper_than_any_real_one_is_a_plan_error() -> None:
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(5_000):
        node["a"] = {}
        node = node["a"]
    with pytest.raises(PlanError) as raised:
        parse_plan({"model": {"config": {**_config("meta-llama/Llama-3.1-8B"), "deep": deep}}})
    assert "nested more than 32 levels" in raised.value.problems[0]


def test_the_effective_batch_is_bounded() -> None:
    with pytest.raises(PlanError) as raised:
        parse_plan({"model": {"name": "x"}, "micro_batch_size": 65_536, "gradient_accumulation_steps": 100, "gpus": 8})
    assert raised.value.problems[0].startswith("micro_batch_size:")
    assert parse_plan({"model": {"name": "x"}, "micro_batch_size": 16, "gradient_accumulation_steps": 64, "gpus": 1024})


def test_an_estimate_over_its_cpu_budget_raises_naming_what_to_narrow() -> None:
    plan = parse_plan({"model": {"name": "meta-llama/Llama-3.1-8B"}})
    with pytest.raises(WorkBudgetExceeded) as raised:
        estimate(plan, budget=CpuBudget(0.0))
    assert raised.value.field == "plan" and "CPU time" in raised.value.message
    assert estimate(plan, budget=CpuBudget(60.0)).memory.peak_device_gib > 0
