"""The kernels option: fused kernels change what the model saves for backward."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from services.estimator.architecture import architecture_from_config
from services.estimator.memory import block_saved_bytes_per_token, logits_bytes
from services.estimator.recipe import resolve_recipe
from tests.conftest import LLAMA_8B, make_plan

ARCH = architecture_from_config(LLAMA_8B)
BLOCK = ARCH.blocks[0]


def _saves(**fields: object) -> dict[str, float]:
    plan = make_plan(method="lora", **fields)
    return block_saved_bytes_per_token(BLOCK, ARCH, plan, resolve_recipe(plan), plan.seq_len)


def test_liger_norms_keep_their_16bit_input_and_rstd_and_swiglu_two_tensors() -> None:
    plain, liger = _saves(), _saves(kernels="liger")
    # Llama-3.1-8B, bf16: HF's RMSNorm keeps the fp32 upcast of its input, 2 norms x 4,096 x 4 bytes; Liger's
    # keeps the bf16 input and one fp32 rstd, 2 x (4,096 x 2 + 4).
    assert (plain["norms"], liger["norms"]) == (32_768, 16_392)
    # gate, silu(gate), up at 14,336 x 2 bytes each, against gate and up only.
    assert (plain["mlp_hidden"], liger["mlp_hidden"]) == (86_016, 57_344)


def test_liger_brings_its_fused_linear_cross_entropy() -> None:
    plan = make_plan(method="lora", kernels="liger", seq_len=1000)
    assert resolve_recipe(plan).loss == "fused"
    # 1,000 tokens: grad_input and the hidden states (2 x 1,000 x 4,096 x 2 bytes) and an fp32 loss per token.
    assert logits_bytes(plan, ARCH, resolve_recipe(plan))[0] == 16_388_000
    # An explicit loss wins: Liger without its fused cross-entropy.
    assert resolve_recipe(make_plan(kernels="liger", loss="standard")).loss == "standard"


def test_transformer_engine_fuses_the_norms_only() -> None:
    te = _saves(kernels="transformer-engine")
    assert (te["norms"], te["mlp_hidden"]) == (16_392, 86_016)
    assert resolve_recipe(make_plan(kernels="transformer-engine")).loss == "standard"


def test_defaults_follow_the_framework() -> None:
    assert resolve_recipe(make_plan()).kernels == "none"
    assert resolve_recipe(make_plan(loss="fused")).kernels == "liger"  # the Trainer's use_liger_kernel
    assert resolve_recipe(make_plan(framework="unsloth", method="qlora")).kernels == "unsloth"


@pytest.mark.parametrize(
    "fields",
    [
        {"framework": "unsloth", "kernels": "liger"},
        {"framework": "hf-trainer", "kernels": "unsloth"},
        {"kernels": "triton"},
        {"mode": "inference", "kernels": "liger"},
    ],
)
def test_kernels_that_do_not_apply_are_refused(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError, match="kernels"):
        make_plan(**fields)


@pytest.mark.parametrize(
    "fields",
    [
        {"framework": "unsloth", "kernels": "liger"},
        {"framework": "hf-trainer", "kernels": "unsloth"},
        {"kernels": "unsloth"},  # the default framework, hf-trainer
    ],
)
def test_kernels_that_conflict_with_the_framework_are_located_at_kernels(fields: dict[str, object]) -> None:
    # The location, not only the message, names kernels: callers that read it (the SDK's PlanError.field,
    # an export's re-plan) named nothing, or the framework they had changed.
    with pytest.raises(ValidationError) as refused:
        make_plan(**fields)
    assert [error["loc"] for error in refused.value.errors()] == [("kernels",)]
