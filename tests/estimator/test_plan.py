from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.estimator.estimate import estimate
from services.estimator.validation import PlanError, parse_plan

CASES = Path(__file__).resolve().parents[2] / "benchmarks" / "accuracy" / "cases.jsonl"


def _problems(data: dict[str, object]) -> list[str]:
    with pytest.raises(PlanError) as err:
        parse_plan(data)
    return err.value.problems


def test_every_public_case_is_a_valid_plan() -> None:
    for line in CASES.read_text().splitlines():
        case = json.loads(line)
        parse_plan(case["plan"])


def test_bad_enum_names_field_value_and_allowed() -> None:
    (line,) = _problems({"model": {"name": "x"}, "method": "lorra"})
    assert line.startswith("method:")
    assert "'lorra'" in line and "'full'" in line and "'qlora'" in line


def test_padding_names_its_allowed_values() -> None:
    (line,) = _problems({"model": {"name": "x"}, "padding": "dynamic"})
    assert line.startswith("padding:")
    assert "'packed'" in line and "'max-length'" in line and "'longest'" in line


def test_range_and_unknown_field() -> None:
    lines = _problems({"model": {"name": "x"}, "micro_batch_size": 0, "batch": 4})
    assert any(line.startswith("micro_batch_size:") and "greater than or equal to 1" in line for line in lines)
    assert any(line.startswith("batch:") and "unknown field" in line for line in lines)


def test_model_source_required() -> None:
    (line,) = _problems({"model": {}})
    assert line.startswith("model:") and "name" in line and "config" in line


def test_inconsistent_fields_are_named() -> None:
    (line,) = _problems({"model": {"name": "x"}, "method": "full", "quantization": "nf4"})
    assert line.startswith("quantization:") and "qlora" in line
    (line,) = _problems({"model": {"name": "x"}, "cpu_offload": True})
    assert line.startswith("cpu_offload:")
    (line,) = _problems({"model": {"name": "x"}, "mode": "inference", "activation_offloading": True})
    assert line.startswith("activation_offloading:")
    lengths = {"p50_tokens_per_example": 100, "p90_tokens_per_example": 200, "p99_tokens_per_example": 300}
    data = {"examples": 10, "avg_tokens_per_example": 600, **lengths, "max_tokens_per_example": 500}
    (line,) = _problems({"model": {"name": "x"}, "data": data})  # a mean over the longest: a probe of the estimator
    assert "avg_tokens_per_example: 600 is more than max_tokens_per_example (500)" in line, line


def test_lora_target_list_errors_point_at_the_item() -> None:
    (line,) = _problems({"model": {"name": "x"}, "method": "lora", "lora": {"rank": 8, "targets": ["q", "zz"]}})
    assert line.startswith("lora.targets.1:") and "'zz'" in line and "'lm_head'" in line


def test_not_an_object() -> None:
    assert _problems([1, 2]) == ["plan: must be a JSON object"]  # type: ignore[arg-type]


def test_data_spec_needs_a_size() -> None:
    (line,) = _problems({"model": {"name": "x"}, "data": {"epochs": 2}})
    assert line.startswith("data:") and "tokens" in line


def test_generic_model_with_safety_margin() -> None:
    plan = parse_plan(
        {
            "model": {
                "generic": {
                    "parameters": 100_000_000,
                    "dtype": "fp32",
                    "activation_bytes_per_sample": 1_500_000_000,
                }
            },
            "micro_batch_size": 1,
            "optimizer": "adamw",
            "precision": "fp32",
        }
    )
    result = estimate(plan)
    # SEEDS.md section 3: 0.4 GB weights + 0.4 grads + 0.8 Adam + 1.5 GB activations, +20% margin.
    expected_gib = (0.4e9 + 0.4e9 + 0.8e9 + 1.5e9) * 1.2 / 2**30
    assert result.memory.peak_device_gib == pytest.approx(expected_gib, rel=1e-3)
    assert result.throughput is None
    assert any("generic" in w for w in result.warnings)
    with pytest.raises(PlanError):
        parse_plan({"model": {"generic": {"parameters": 10, "safety_margin": 0.5}}})


def test_data_total_tokens() -> None:
    plan = parse_plan(
        {"model": {"name": "x"}, "data": {"examples": 10_000, "avg_tokens_per_example": 512, "epochs": 3}}
    )
    assert plan.data is not None and plan.data.total_tokens() == 15_360_000


def test_a_data_set_of_less_than_one_token_is_refused() -> None:
    # 1e-300 epochs were accepted and priced as a run of its start-up alone.
    (line,) = _problems({"model": {"name": "x"}, "data": {"tokens": 1000, "epochs": 1e-300}})
    assert "epochs" in line and "a run trains at least one" in line
    plan = parse_plan({"model": {"name": "x"}, "data": {"tokens": 1000, "epochs": 0.001}})
    assert plan.data is not None and plan.data.total_tokens() == pytest.approx(1.0)


def test_a_data_set_sized_twice_is_refused() -> None:
    # tokens sized it and examples was ignored, silently (a probe of the CLI).
    (line,) = _problems({"model": {"name": "x"}, "data": {"tokens": 1000, "examples": 10, "avg_tokens_per_example": 5}})
    assert line.startswith("data.examples:") and "not both" in line
    plan = parse_plan({"model": {"name": "x"}, "data": {"tokens": 1000, "avg_tokens_per_example": 5}})
    assert plan.data is not None and plan.data.total_tokens() == 1000  # the mean length alone sizes the padding


def test_inference_plans_take_serving_fields_and_refuse_training_ones() -> None:
    """Issue 22 item 6: an inference plan serves quantized weights without a training method."""
    plan = parse_plan({"model": {"name": "x"}, "mode": "inference", "quantization": "nf4", "kv_cache_dtype": "fp8"})
    assert plan.quantized == "nf4" and plan.method == "full"
    for change, field in (
        ({"method": "qlora"}, "method"),
        ({"method": "lora"}, "method"),
        ({"precision": "fp16-mixed"}, "precision"),
        ({"optimizer": "sgd"}, "optimizer"),
        ({"gradient_checkpointing": True}, "gradient_checkpointing"),
        ({"gradient_accumulation_steps": 4}, "gradient_accumulation_steps"),
        ({"lora": {"rank": 8}}, "lora"),
        ({"quantization": "int4"}, "quantization"),
    ):
        (line,) = _problems({"model": {"name": "x"}, "mode": "inference", **change})
        assert line.startswith(f"{field}:"), (change, line)
    # Serving formats and the KV cache belong to inference.
    (line,) = _problems({"model": {"name": "x"}, "method": "qlora", "quantization": "gptq"})
    assert line.startswith("quantization:") and "inference" in line
    (line,) = _problems({"model": {"name": "x"}, "kv_cache_dtype": "fp8"})
    assert line.startswith("kv_cache_dtype:")
