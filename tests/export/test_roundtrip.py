"""Every format x method x setup: export, read back, and get the same memory estimate and settings."""

from __future__ import annotations

from typing import Any

import pytest

from services.estimator.plan import Plan
from services.export import FORMATS, ExportError, read_back
from services.planner.models import Recommendation
from tests.export.helpers import export, llama_plan, memory, settings

METHODS = ("full", "lora", "qlora")
# (GPUs, sharding, cpu_offload)
SETUPS = ((1, "none", False), (4, "fsdp", False), (4, "zero3", False))
# Combinations a format refuses, and the field the refusal names.
REFUSED = {
    ("deepspeed", "none"): "sharding",  # DeepSpeed without ZeRO adds an fp32 master copy
    ("deepspeed", "fsdp"): "sharding",  # FSDP is not DeepSpeed
    ("torchtune", "zero3"): "sharding",  # torchtune shards with FSDP only
}


def check_round_trip(plan: Plan, fmt: str, **kwargs: Any) -> Plan:
    bundle = export(plan, fmt, **kwargs)
    back = read_back(fmt, bundle.files, plan)
    expected = plan if kwargs.get("setup") is None else _applied(plan, kwargs["setup"])
    assert memory(back) == memory(expected)
    assert settings(back) == settings(expected)
    assert back.framework == expected.framework
    return back


def _applied(plan: Plan, setup: Recommendation) -> Plan:
    return plan.model_copy(
        update={
            "gpus": setup.gpus,
            "sharding": setup.sharding,
            "cpu_offload": setup.cpu_offload,
            "micro_batch_size": setup.micro_batch_size,
            "gradient_accumulation_steps": setup.gradient_accumulation_steps,
            "gradient_checkpointing": setup.gradient_checkpointing,
        }
    )


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(("gpus", "sharding", "offload"), SETUPS)
def test_read_back_gives_the_same_memory_and_settings(
    fmt: str, method: str, gpus: int, sharding: str, offload: bool
) -> None:
    plan = llama_plan(fmt, method, gpus=gpus, sharding=sharding, cpu_offload=offload)
    refused = REFUSED.get((fmt, sharding))
    if refused is not None:
        with pytest.raises(ExportError) as err:
            export(plan, fmt)
        assert err.value.field == refused
        return
    check_round_trip(plan, fmt)


@pytest.mark.parametrize("fmt", ["hf-trainer", "accelerate", "deepspeed", "axolotl"])
@pytest.mark.parametrize("stage", ["zero1", "zero2", "zero3"])
def test_zero_stages_with_cpu_offload(fmt: str, stage: str) -> None:
    check_round_trip(llama_plan(fmt, "lora", gpus=4, sharding=stage, cpu_offload=True), fmt)


@pytest.mark.parametrize("fmt", ["hf-trainer", "accelerate", "torchtune", "axolotl"])
def test_fsdp_with_cpu_offload(fmt: str) -> None:
    check_round_trip(llama_plan(fmt, "full", gpus=8, sharding="fsdp", cpu_offload=True), fmt)


@pytest.mark.parametrize("fmt", ["hf-trainer", "accelerate", "axolotl"])
def test_several_gpus_without_sharding_run_ddp(fmt: str) -> None:
    check_round_trip(llama_plan(fmt, "lora", gpus=2, sharding="none"), fmt)


def recommendation(**fields: Any) -> Recommendation:
    values: dict[str, Any] = {
        "provider": "acme",
        "gpu": "H100 SXM",
        "region": "eu-west",
        "gpus": 16,
        "gpus_per_node": 8,
        "nodes": 2,
        "sharding": "fsdp",
        "cpu_offload": False,
        "micro_batch_size": 2,
        "gradient_accumulation_steps": 2,
        "effective_batch_size": 64,
        "gradient_checkpointing": True,
        "peak_gib_per_gpu": 30.0,
        "gpu_memory_gib": 80.0,
        "usable_gib": 72.0,
        "headroom_gib": 50.0,
        "tokens_per_s": 64_000.0,
        "tokens_per_s_per_gpu": 4_000.0,
        "mfu": 0.4,
        "scaling_efficiency": 0.9,
        "hours": 1.0,
        "cost_usd": 40.0,
        "price_usd_per_hour": 40.0,
        "spot_price_usd_per_hour": 20.0,
        "spot_hours": 1.2,
        "spot_cost_usd": 24.0,
        "expected_preemptions": 0.5,
        "checkpoint_interval_minutes": 30.0,
        "qualifies_with": "on_demand",
        "notes": [],
    }
    values.update(fields)
    return Recommendation(**values)


@pytest.mark.parametrize("fmt", ["hf-trainer", "accelerate", "torchtune", "axolotl"])
def test_a_multi_node_recommendation_round_trips(fmt: str) -> None:
    setup = recommendation()
    back = check_round_trip(llama_plan(fmt, "lora"), fmt, setup=setup)
    assert (back.gpus, back.sharding, back.micro_batch_size, back.gradient_accumulation_steps) == (16, "fsdp", 2, 2)


@pytest.mark.parametrize("fmt", ["hf-trainer", "accelerate", "deepspeed", "axolotl"])
def test_a_zero_recommendation_round_trips(fmt: str) -> None:
    setup = recommendation(sharding="zero2", gpus=4, gpus_per_node=4, nodes=1, cpu_offload=True)
    check_round_trip(llama_plan(fmt, "full"), fmt, setup=setup)


def test_explicit_target_lists_and_lm_head_round_trip() -> None:
    lora = {"rank": 8, "alpha": 16, "targets": ["q", "v", "lm_head"], "dropout": 0.05}
    for fmt in FORMATS:
        fields: dict[str, Any] = {"lora": lora}
        if fmt == "deepspeed":
            fields.update(gpus=2, sharding="zero2")
        back = check_round_trip(llama_plan(fmt, "lora", **fields), fmt)
        assert back.lora is not None and set(back.lora.targets) == {"q", "v", "lm_head"}
        assert back.lora.dropout == 0.05


@pytest.mark.parametrize(
    ("fmt", "fields"),
    [
        ("hf-trainer", {"precision": "bf16-mixed"}),
        ("hf-trainer", {"precision": "fp16-mixed"}),
        ("hf-trainer", {"precision": "fp32"}),
        ("hf-trainer", {"optimizer": "adamw-8bit"}),
        ("hf-trainer", {"optimizer": "paged-adamw"}),
        ("hf-trainer", {"optimizer": "paged-adamw-8bit"}),
        ("hf-trainer", {"optimizer": "adafactor"}),
        ("hf-trainer", {"optimizer_impl": "fused"}),
        ("hf-trainer", {"attention": "flash"}),
        ("hf-trainer", {"attention": "eager"}),
        ("hf-trainer", {"quantization": "int8"}),
        ("hf-trainer", {"gradient_accumulation_steps": None}),
        ("hf-trainer", {"lora": None}),
        ("hf-trainer", {"gradient_checkpointing": False}),
        ("axolotl", {"precision": "fp32"}),
        ("axolotl", {"precision": "fp16"}),
        ("axolotl", {"quantization": "int8"}),
        ("axolotl", {"optimizer": "paged-adamw-8bit"}),
        ("axolotl", {"attention": "sdpa"}),
        ("torchtune", {"precision": "fp32"}),
        ("torchtune", {"optimizer": "sgd"}),
        ("torchtune", {"optimizer": "adafactor"}),
        ("torchtune", {"optimizer": "paged-adamw-8bit"}),
        ("torchtune", {"optimizer_impl": "for-loop"}),
        ("torchtune", {"optimizer_impl": "foreach"}),
        ("torchtune", {"loss": "standard"}),
        ("torchtune", {"gradient_accumulation_steps": None}),
        ("torchtune", {"compile": True}),
        ("torchtune", {"compile": True, "activation_offloading": True, "gradient_checkpointing": True}),
    ],
)
def test_other_settings_round_trip(fmt: str, fields: dict[str, Any]) -> None:
    check_round_trip(llama_plan(fmt, "qlora" if "quantization" in fields else "lora", **fields), fmt)


def test_torchtune_full_with_the_optimizer_in_backward() -> None:
    plan = llama_plan("torchtune", "full", gradient_accumulation_steps=1, optimizer_in_backward=True)
    assert check_round_trip(plan, "torchtune").optimizer_in_backward


def test_a_catalog_model_given_by_config_exports_under_its_name() -> None:
    plan = llama_plan("hf-trainer", "lora")
    from services.catalog.models import find_model

    by_config = plan.model_copy(
        update={"model": plan.model.model_copy(update={"config": find_model("meta-llama/Llama-3.1-8B").config})}
    )
    check_round_trip(by_config, "hf-trainer")


def test_phi3_fused_qkv_targets_round_trip_as_one_module() -> None:
    plan = llama_plan("hf-trainer", "lora", model={"name": "microsoft/Phi-3-mini-4k-instruct"})
    plan = plan.model_copy(update={"lora": plan.lora.model_copy(update={"targets": ["q", "k", "v"]})})  # type: ignore[union-attr]
    bundle = export(plan, "hf-trainer")
    assert "'qkv_proj'" in bundle.files["train.py"]
    check_round_trip(plan, "hf-trainer")


@pytest.mark.parametrize("method", ["lora", "qlora"])
@pytest.mark.parametrize("kind", ["chat", "alpaca"])
def test_qwen25_torchtune_round_trips_with_any_data_format(method: str, kind: str) -> None:
    from services.export.dataset import data_format

    plan = llama_plan("torchtune", method, model={"name": "Qwen/Qwen2.5-7B"})
    back = check_round_trip(plan, "torchtune", data=data_format(kind, "test"))
    assert back.method == method
