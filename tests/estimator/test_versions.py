"""framework_version: the defaults that changed between releases follow the release a plan names."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from services.estimator.architecture import architecture_from_config
from services.estimator.memory import logits_bytes, peak_memory
from services.estimator.recipe import resolve_recipe
from services.plans.schemas import PlanRequest
from tests.conftest import make_plan

# Qwen2.5-0.5B's shape: a small model with a large vocabulary, where whole logits dominate the step.
QWEN_05B: dict[str, Any] = {
    "model_type": "qwen2",
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "max_position_embeddings": 32768,
    "hidden_act": "silu",
}
SMALL = {"model": {"name": "qwen-0.5b", "config": QWEN_05B}, "framework": "unsloth", "method": "qlora"}


def _plan(**fields: Any):  # type: ignore[no-untyped-def]
    return make_plan(**{**SMALL, **fields})


def test_old_unsloth_keeps_whole_16bit_logits_with_the_gradient_in_place() -> None:
    arch = architecture_from_config(QWEN_05B)
    old = _plan(framework_version="2025.3.19", seq_len=2048)
    # 2,048 tokens x 151,936 logits x 2 bytes, and two fp32 values per token (loss, log-sum-exp); backward
    # overwrites the logits with their gradient.
    assert logits_bytes(old, arch, resolve_recipe(old)) == (622_329_856 + 16_384, 622_329_856)
    # The current release never holds them: its chunked loss keeps hidden-sized tensors.
    new = _plan(seq_len=2048)
    fwd, bwd = logits_bytes(new, arch, resolve_recipe(new))
    assert fwd < 10_000_000 and bwd < 10_000_000


def test_unsloth_2025_9_kept_whole_logits_only_for_small_micro_batches() -> None:
    assert resolve_recipe(_plan(framework_version="2025.9.1", seq_len=1024)).loss == "standard"
    assert resolve_recipe(_plan(framework_version="2025.9.1", seq_len=1025)).loss == "fused"
    assert resolve_recipe(_plan(framework_version="2025.11.1", seq_len=512)).loss == "fused"
    # An explicit loss wins over the release.
    assert resolve_recipe(_plan(framework_version="2025.3.19", loss="fused")).loss == "fused"


def test_old_unsloth_peak_is_higher_by_the_logits() -> None:
    arch = architecture_from_config(QWEN_05B)
    old, new = _plan(framework_version="2024.8", seq_len=4096), _plan(seq_len=4096)
    gap = peak_memory(old, arch, resolve_recipe(old)).peak_allocated
    gap -= peak_memory(new, arch, resolve_recipe(new)).peak_allocated
    assert gap > 1.0 * 2**30  # 4,096 x 151,936 x 2 bytes = 1.16 GiB of logits


def test_torchtune_releases() -> None:
    v02 = resolve_recipe(make_plan(framework="torchtune", framework_version="0.2.1", sharding="fsdp", gpus=2))
    assert (v02.loss, v02.fsdp1, v02.nf4_whole_tensor) == ("standard", True, False)
    v01 = resolve_recipe(make_plan(framework="torchtune", method="qlora", framework_version="0.1.1"))
    assert v01.nf4_whole_tensor
    now = resolve_recipe(make_plan(framework="torchtune", sharding="fsdp", gpus=2))
    assert (now.loss, now.fsdp1) == ("chunked", False)


def test_torchtitan_compiles_the_loss_since_0_1() -> None:
    assert resolve_recipe(make_plan(framework="torchtitan", compile=True)).compiled_loss
    assert not resolve_recipe(make_plan(framework="torchtitan", compile=True, framework_version="0.0.2")).compiled_loss


@pytest.mark.parametrize(
    ("version", "message"),
    [("banana", "not a version of unsloth"), ("2022.1", "older than its first release")],
)
def test_bad_versions_name_the_field(version: str, message: str) -> None:
    with pytest.raises(ValidationError, match=rf"framework_version: .*{message}"):
        _plan(framework_version=version)
    with pytest.raises(ValidationError, match="framework_version"):
        PlanRequest.model_validate({**SMALL, "framework_version": version})


def test_a_newer_release_keeps_the_newest_defaults() -> None:
    assert resolve_recipe(_plan(framework_version="2031.1.1")) == resolve_recipe(_plan())


def test_double_quant_saves_three_eighths_of_a_bit_per_weight() -> None:
    from tests.conftest import LLAMA_8B

    arch = architecture_from_config(LLAMA_8B)
    from services.estimator.memory import weight_bytes

    plain = make_plan(method="qlora")
    nested = make_plan(method="qlora", double_quant=True)
    q = weight_bytes(plain, arch, resolve_recipe(plain))[1]
    saved = weight_bytes(plain, arch, resolve_recipe(plain))[0] - weight_bytes(nested, arch, resolve_recipe(nested))[0]
    # QLoRA paper: 0.5 - 0.127 = 0.373 bits (0.0466 bytes) per quantized weight.
    assert saved / q == pytest.approx(0.373 / 8, rel=2e-3)
    # Unsloth always loads its 4-bit bases double-quantized; torchtune's torchao NF4 as well.
    assert resolve_recipe(make_plan(framework="unsloth", method="qlora")).nf4_double_quant
    with pytest.raises(ValidationError, match="double_quant"):
        make_plan(method="lora", double_quant=True)
