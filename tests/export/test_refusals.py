"""Settings a format cannot express raise ExportError naming the plan field, instead of a config with other memory."""

from __future__ import annotations

from typing import Any

import pytest

from services.estimator.plan import Plan
from services.export import ExportError
from tests.export.helpers import export, llama_plan


def refused(plan: Plan, fmt: str, **kwargs: Any) -> ExportError:
    with pytest.raises(ExportError) as err:
        export(plan, fmt, **kwargs)
    return err.value


@pytest.mark.parametrize(
    ("fmt", "method", "fields", "field"),
    [
        # The plan must be sized for the framework the format runs.
        ("torchtune", "lora", {"framework": "hf-trainer"}, "framework"),
        ("hf-trainer", "lora", {"framework": "torchtune"}, "framework"),
        ("accelerate", "lora", {"framework": "axolotl"}, "framework"),
        ("axolotl", "lora", {"framework": "hf-trainer"}, "framework"),
        (
            "hf-trainer",
            "full",
            {"mode": "inference", "gradient_checkpointing": False, "gradient_accumulation_steps": None},
            "mode",
        ),
        # Trainer-based formats.
        ("hf-trainer", "full", {"optimizer": "sgd"}, "optimizer"),
        ("axolotl", "lora", {"optimizer": "sgd"}, "optimizer"),
        ("hf-trainer", "full", {"optimizer_impl": "for-loop"}, "optimizer_impl"),
        (
            "hf-trainer",
            "full",
            {"optimizer_in_backward": True, "gradient_accumulation_steps": 1},
            "optimizer_in_backward",
        ),
        ("hf-trainer", "full", {"precision": "fp16"}, "precision"),
        ("hf-trainer", "lora", {"loss": "chunked"}, "loss"),
        ("hf-trainer", "lora", {"logits_fp32": False}, "logits_fp32"),
        ("hf-trainer", "lora", {"adapter_dtype": "bf16"}, "adapter_dtype"),
        ("hf-trainer", "full", {"checkpoint_granularity": "selective"}, "checkpoint_granularity"),
        ("hf-trainer", "qlora", {"quantization": "int8", "gpus": 4, "sharding": "fsdp"}, "quantization"),
        ("accelerate", "qlora", {"quantization": "int8", "gpus": 4, "sharding": "zero3"}, "quantization"),
        ("hf-trainer", "full", {"precision": "bf16-mixed", "gpus": 4, "sharding": "zero2"}, "precision"),
        (
            "deepspeed",
            "full",
            {"optimizer": "adamw-8bit", "gpus": 4, "sharding": "zero2", "cpu_offload": True},
            "optimizer",
        ),
        ("hf-trainer", "lora", {"compile": True}, "compile"),
        ("axolotl", "lora", {"activation_offloading": True}, "activation_offloading"),
        ("accelerate", "qlora", {"nf4_quantization": "whole-tensor"}, "nf4_quantization"),
        ("hf-trainer", "lora", {"padding": "longest"}, "padding"),
        ("axolotl", "lora", {"precision": "bf16-mixed"}, "precision"),
        # torchtune.
        ("torchtune", "lora", {"precision": "fp16"}, "precision"),
        ("torchtune", "full", {"precision": "bf16-mixed"}, "precision"),
        ("torchtune", "qlora", {"quantization": "int8"}, "quantization"),
        ("torchtune", "lora", {"gpus": 4, "sharding": "zero2"}, "sharding"),
        ("torchtune", "lora", {"gpus": 4, "sharding": "none"}, "sharding"),
        ("torchtune", "lora", {"gpus": 1, "sharding": "fsdp"}, "sharding"),
        ("torchtune", "lora", {"gpus": 4, "sharding": "fsdp", "optimizer": "paged-adamw-8bit"}, "optimizer"),
        (
            "torchtune",
            "lora",
            {"optimizer_in_backward": True, "gradient_accumulation_steps": 1},
            "optimizer_in_backward",
        ),
        ("torchtune", "full", {"optimizer_in_backward": True}, "gradient_accumulation_steps"),
        ("torchtune", "lora", {"loss": "fused"}, "loss"),
        ("torchtune", "lora", {"attention": "flash"}, "attention"),
        ("torchtune", "lora", {"adapter_dtype": "fp32"}, "adapter_dtype"),
        ("torchtune", "qlora", {"nf4_quantization": "whole-tensor"}, "nf4_quantization"),
        ("torchtune", "lora", {"padding": "longest"}, "padding"),
        ("torchtune", "lora", {"lora": {"rank": 8, "targets": ["q", "v", "up"]}}, "lora.targets"),
        ("torchtune", "lora", {"model": {"name": "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B"}}, "model.name"),
        (
            "torchtune",
            "lora",
            {"model": {"name": "meta-llama/Llama-3.2-1B"}, "lora": {"rank": 8, "targets": ["lm_head"]}},
            "lora.targets",
        ),
    ],
)
def test_refused_settings_name_their_field(fmt: str, method: str, fields: dict[str, Any], field: str) -> None:
    assert refused(llama_plan(fmt, method, **fields), fmt).field == field


def test_a_fused_layer_cannot_be_partly_adapted() -> None:
    plan = llama_plan(
        "hf-trainer", "lora", model={"name": "microsoft/Phi-3-mini-4k-instruct"}, lora={"rank": 8, "targets": ["q"]}
    )
    err = refused(plan, "hf-trainer")
    assert err.field == "lora.targets"
    assert "qkv_proj" in str(err)


def test_a_generic_model_is_refused() -> None:
    plan = Plan.model_validate({"model": {"generic": {"parameters": 7_000_000_000}}, "method": "lora"})
    assert refused(plan, "hf-trainer").field == "model.generic"


def test_the_refusal_says_what_is_allowed() -> None:
    err = refused(llama_plan("torchtune", "lora", gpus=4, sharding="zero3"), "torchtune")
    assert "allowed: none (1 GPU), fsdp" in str(err)


def test_a_harmless_explicit_default_is_accepted() -> None:
    # The Trainer cannot set the loss, but 'standard' is what it does: same memory, so no refusal.
    export(llama_plan("hf-trainer", "lora", loss="standard", logits_fp32=True), "hf-trainer")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"peak_gib_per_gpu": 90.0}, "peak_gib_per_gpu"),
        ({"peak_gib_per_gpu": 0.0}, "peak_gib_per_gpu"),
        ({"gpu_memory_gib": -1.0}, "gpu_memory_gib"),
        ({"gpu": " "}, "gpu"),
        ({"checkpoint_interval_s": 600.0}, "step_seconds"),
        ({"checkpoint_interval_s": 0.0, "step_seconds": 2.0}, "checkpoint_interval_s"),
        ({"checkpoint_interval_s": 600.0, "step_seconds": 0.0}, "step_seconds"),
    ],
)
def test_bad_inputs_name_their_argument(kwargs: dict[str, Any], field: str) -> None:
    assert refused(llama_plan("hf-trainer", "lora"), "hf-trainer", **kwargs).field == field


def test_unknown_format() -> None:
    err = refused(llama_plan("hf-trainer", "lora"), "litgpt")
    assert err.field == "format"
    assert "hf-trainer, accelerate, deepspeed, torchtune, axolotl" in str(err)


def test_gpus_that_fill_no_whole_node_need_a_recommendation() -> None:
    assert refused(llama_plan("hf-trainer", "lora", gpus=12, sharding="fsdp"), "hf-trainer").field == "gpus"
