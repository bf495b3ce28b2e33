"""Properties that must hold for every plan (hypothesis explores the plan space)."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from services.catalog.models import find_model
from services.estimator.architecture import architecture_from_config
from services.estimator.memory import (
    activation_bytes,
    adapter_params,
    block_saved_bytes_per_token,
    model_states,
    peak_memory,
)
from services.estimator.plan import Plan
from services.estimator.recipe import resolve_recipe

MODELS = [
    "meta-llama/Llama-3.2-1B",
    "Qwen/Qwen2.5-7B",
    "microsoft/phi-2",
    "EleutherAI/pythia-410m",
    "mistralai/Mixtral-8x7B-v0.1",
    "google/gemma-2-2b",
    "tiiuae/falcon-7b",
]

plans = st.fixed_dictionaries(
    {
        "model": st.sampled_from(MODELS).map(lambda name: {"name": name}),
        "method": st.sampled_from(["full", "lora", "qlora"]),
        "framework": st.sampled_from(
            ["hf-trainer", "torchtune", "litgpt", "torchtitan", "axolotl", "unsloth", "pytorch"]
        ),
        "precision": st.sampled_from(["bf16", "bf16-mixed", "fp32"]),
        "optimizer": st.sampled_from(["adamw", "adamw-8bit", "paged-adamw", "sgd", "adafactor"]),
        "optimizer_in_backward": st.booleans(),
        "micro_batch_size": st.integers(1, 16),
        "seq_len": st.integers(16, 8192),
        "gradient_checkpointing": st.booleans(),
        "gpus": st.sampled_from([1, 2, 4, 8]),
        "sharding": st.sampled_from(["none", "zero1", "zero2", "zero3", "fsdp"]),
        "attention": st.sampled_from(["sdpa", "flash", "eager"]),
        "lora": st.fixed_dictionaries(
            {
                "rank": st.sampled_from([1, 8, 64]),
                "targets": st.sampled_from(["all-linear", ["q", "v"], ["gate", "up", "down"], ["q", "lm_head"]]),
            }
        ),
    }
)


def _plan(data: dict[str, Any], **changes: Any) -> Plan:
    data = {**data, **changes}
    if data["method"] == "full":
        data = {**data, "lora": None}
    return Plan.model_validate(data)


def _arch(plan: Plan):  # type: ignore[no-untyped-def]
    assert plan.model.name is not None
    return architecture_from_config(find_model(plan.model.name).config)


@settings(deadline=None)
@given(plans, st.integers(1, 8))
def test_memory_never_decreases_with_batch(data: dict[str, Any], extra: int) -> None:
    small = _plan(data)
    big = _plan(data, micro_batch_size=small.micro_batch_size + extra)
    arch = _arch(small)
    a = peak_memory(small, arch, resolve_recipe(small))
    b = peak_memory(big, arch, resolve_recipe(big))
    assert b.peak_allocated >= a.peak_allocated
    assert b.peak_device >= a.peak_device


@settings(deadline=None)
@given(plans, st.integers(1, 4096))
def test_memory_never_decreases_with_sequence_length(data: dict[str, Any], extra: int) -> None:
    short = _plan(data)
    long = _plan(data, seq_len=short.seq_len + extra)
    arch = _arch(short)
    assert (
        peak_memory(long, arch, resolve_recipe(long)).peak_allocated
        >= peak_memory(short, arch, resolve_recipe(short)).peak_allocated
    )


def _model_state_bytes(plan: Plan) -> float:
    s = model_states(plan, _arch(plan), resolve_recipe(plan))
    return s.weights + s.adapters + s.master_weights + s.gradients + s.optimizer_states + s.optimizer_states_paged


@settings(deadline=None)
@given(plans, st.sampled_from(["zero1", "zero2", "zero3", "fsdp"]))
def test_more_gpus_never_increase_sharded_model_states(data: dict[str, Any], sharding: str) -> None:
    per_gpu = [_model_state_bytes(_plan(data, sharding=sharding, gpus=n)) for n in (1, 2, 4, 8, 16)]
    assert all(b <= a for a, b in itertools.pairwise(per_gpu)), per_gpu


@settings(deadline=None)
@given(plans)
def test_lora_model_states_never_exceed_full_finetuning(data: dict[str, Any]) -> None:
    full = _plan(data, method="full", lora=None)
    for method in ("lora", "qlora"):
        adapted = _plan(data, method=method)
        # The adapters' own weights, gradients and optimizer states (at most 4 + 4 + 8 bytes each,
        # unsharded) are the only thing LoRA adds.
        own = adapter_params(_arch(adapted), resolve_recipe(adapted)) * 16
        assert _model_state_bytes(adapted) <= _model_state_bytes(full) + own


def _adapter_activation_bytes(plan: Plan) -> float:
    arch = _arch(plan)
    recipe = resolve_recipe(plan)
    per_token = sum(
        block.count * block_saved_bytes_per_token(block, arch, plan, recipe, plan.seq_len).get("lora", 0.0)
        for block in arch.blocks
    )
    return per_token * plan.tokens_per_micro_batch


@settings(deadline=None)
@given(
    plans,
    st.sampled_from(["torchtune", "torchtitan", "unsloth", "litgpt"]),
    st.sampled_from(["none", "zero3", "fsdp"]),
)
def test_lora_never_exceeds_full_finetuning(data: dict[str, Any], framework: str, sharding: str) -> None:
    """LoRA never needs more than full fine-tuning beyond what the adapters themselves add.

    Where adapters share their base layer's input (PEFT instead gives every adapted module its own
    copy: test_peft_adapter_copies_can_exceed_full). With paged optimizer states, no gradient
    accumulation or sharded states the full plan may hold little more than its weights at its peak, so
    the adapters' weights, states and rank-r activations are the margin. Under ZeRO-1/2 replicated
    adapters do not shrink with the GPU count while the full plan's states do; those stages are left out.
    """
    lora = dict(data["lora"], dropout=0.0)
    full = _plan(data, framework=framework, method="full", lora=None, sharding=sharding)
    adapted = _plan(data, framework=framework, method="lora", lora=lora, sharding=sharding)
    arch = _arch(full)
    own = adapter_params(arch, resolve_recipe(adapted)) * 16
    margin = own + _adapter_activation_bytes(adapted) * 2  # kept, and replayed under checkpointing
    assert (
        peak_memory(adapted, arch, resolve_recipe(adapted)).peak_allocated
        <= peak_memory(full, arch, resolve_recipe(full)).peak_allocated + margin
    )


def test_peft_adapter_copies_can_exceed_full() -> None:
    """Documented exception: 7 fp32 input copies per layer outweigh AdamW states at 64k tokens."""
    base = {
        "model": {"name": "meta-llama/Llama-3.2-1B"},
        "framework": "pytorch",
        "micro_batch_size": 8,
        "seq_len": 8192,
    }
    full = Plan.model_validate({**base, "method": "full"})
    lora = Plan.model_validate({**base, "method": "lora", "lora": {"rank": 8, "targets": "all-linear"}})
    arch = _arch(full)
    assert (
        peak_memory(lora, arch, resolve_recipe(lora)).peak_allocated
        > peak_memory(full, arch, resolve_recipe(full)).peak_allocated
    )


@settings(deadline=None)
@given(plans)
def test_checkpointing_never_increases_saved_activations(data: dict[str, Any]) -> None:
    off = _plan(data, gradient_checkpointing=False)
    on = _plan(data, gradient_checkpointing=True)
    arch = _arch(off)
    assert (
        activation_bytes(on, arch, resolve_recipe(on)).saved <= activation_bytes(off, arch, resolve_recipe(off)).saved
    )
