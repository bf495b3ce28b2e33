"""A served AWQ or GPTQ checkpoint is sized at the bits and group_size its config.json's quantization_config
gives (2, 3, 4 or 8 bits), not only at 4 bits (where 2, 3 and 8 used to be sized as 16-bit weights).

The expected bytes are counted by hand from AutoGPTQ's QuantLinear buffers (auto_gptq/nn_modules/qlinear/
qlinear_cuda_old.py): qweight int32 (in // 32 * bits, out), qzeros int32 (ceil(in / group), out // 32 * bits),
scales fp16 (ceil(in / group), out); g_idx (one int32 per input row) is left out, as the estimator does.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from services.estimator.architecture import architecture_from_config
from services.estimator.errors import EstimatorError
from services.estimator.estimate import estimate
from services.estimator.memory import weight_bytes
from services.estimator.recipe import resolve_recipe
from tests.conftest import LLAMA_8B, make_plan

# A small Llama: hidden 512, MLP 1536, 8 heads of 64 with 2 KV heads (K and V 128 wide), 2 layers, 1,000 tokens.
SMALL: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 512,
    "intermediate_size": 1536,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
    "tie_word_embeddings": False,
}
# (in_features, out_features) of one block's linears: q, k, v, o, gate, up, down.
SMALL_LINEARS = [(512, 512), (512, 128), (512, 128), (512, 512), (512, 1536), (512, 1536), (1536, 512)]
SMALL_LAYERS = 2
# Left 16-bit: the embeddings and the head (1,000 x 512 each) and the RMSNorm weights (2 per layer + the final).
SMALL_UNQUANTIZED = 2 * 1000 * 512 + (2 * SMALL_LAYERS + 1) * 512
SMALL_QUANTIZED = SMALL_LAYERS * sum(i * o for i, o in SMALL_LINEARS)  # 6,029,312 weights
SMALL_FP16 = 2 * (SMALL_QUANTIZED + SMALL_UNQUANTIZED)  # 14,111,744 bytes


def _checkpoint(config: dict[str, Any], method: str, bits: int, **extra: Any) -> dict[str, Any]:
    return {**config, "quantization_config": {"quant_method": method, "bits": bits, **extra}}


def _packed_linear_bytes(in_features: int, out_features: int, bits: int, group: int) -> int:
    """Bytes of one QuantLinear's qweight, qzeros and scales, from their shapes."""
    groups = math.ceil(in_features / group)
    qweight = (in_features // 32 * bits) * out_features * 4
    qzeros = groups * (out_features // 32 * bits) * 4
    scales = groups * out_features * 2
    return qweight + qzeros + scales


def _small_served_bytes(bits: int, group: int = 128) -> int:
    packed = SMALL_LAYERS * sum(_packed_linear_bytes(i, o, bits, group) for i, o in SMALL_LINEARS)
    return packed + 2 * SMALL_UNQUANTIZED


# The same by the per-weight arithmetic: bits / 8 bytes of codes, and per group of 128 an fp16 scale and a
# bits-wide zero, (2 + bits / 8) / 128 bytes per weight; plus 2 bytes for each unquantized parameter.
HAND = {
    2: 6_029_312 * (0.25 + 2.25 / 128) + 2 * 1_026_560,  # 1,613,312 + 2,053,120 = 3,666,432
    3: 6_029_312 * (0.375 + 2.375 / 128) + 2 * 1_026_560,  # 2,372,864 + 2,053,120 = 4,425,984
    4: 6_029_312 * (0.5 + 2.5 / 128) + 2 * 1_026_560,  # 3,132,416 + 2,053,120 = 5,185,536
    8: 6_029_312 * (1.0 + 3.0 / 128) + 2 * 1_026_560,  # 6,170,624 + 2,053,120 = 8,223,744
}


def _served_weight_bytes(config: dict[str, Any]) -> float:
    plan = make_plan(model={"name": "m", "config": config}, mode="inference", seq_len=256)
    return weight_bytes(plan, architecture_from_config(config), resolve_recipe(plan))[0]


def test_the_hand_counts_agree() -> None:
    assert SMALL_QUANTIZED == 6_029_312 and SMALL_UNQUANTIZED == 1_026_560 and SMALL_FP16 == 14_111_744
    for bits, expected in HAND.items():
        assert _small_served_bytes(bits) == expected


@pytest.mark.parametrize("method", ["gptq", "awq"])
@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_a_served_checkpoint_is_sized_at_its_own_bits(method: str, bits: int) -> None:
    served = _served_weight_bytes(_checkpoint(SMALL, method, bits, group_size=128))
    assert served == pytest.approx(HAND[bits], rel=1e-12)
    # About bits / 16 of the 16-bit linears, plus the group constants and the 16-bit rest.
    codes = SMALL_QUANTIZED * 2 * bits / 16
    groups = SMALL_QUANTIZED * (2 + bits / 8) / 128
    assert served == pytest.approx(codes + groups + 2 * SMALL_UNQUANTIZED, rel=1e-12)
    assert served < SMALL_FP16 * (bits / 16 + 0.16)


def test_4_bits_is_sized_as_before() -> None:
    # 0.51953125 bytes per weight, GPTQ_BYTES and AWQ_BYTES, for a config with and without bits and group_size.
    for quant in ({"bits": 4, "group_size": 128}, {}):
        for method in ("gptq", "awq"):
            config = {**SMALL, "quantization_config": {"quant_method": method, **quant}}
            assert _served_weight_bytes(config) == 6_029_312 * 0.51953125 + 2 * 1_026_560 == 5_185_536


@pytest.mark.parametrize(("group", "per_weight"), [(32, 0.25 + 2.25 / 32), (64, 0.25 + 2.25 / 64), (-1, 0.25)])
def test_the_group_size_sets_the_group_overhead(group: int, per_weight: float) -> None:
    served = _served_weight_bytes(_checkpoint(SMALL, "gptq", 2, group_size=group))
    assert served == pytest.approx(SMALL_QUANTIZED * per_weight + 2 * SMALL_UNQUANTIZED, rel=1e-12)
    if group > 0:
        assert served == _small_served_bytes(2, group)
    else:
        # One scale and zero per output column over the whole row (g_idx alike) are left out: here (hidden 512)
        # under 2% of the 2-bit weights, under 0.5% for rows of 2,048 inputs or more.
        whole_row = _small_served_bytes(2, 1536)  # every row is at most 1,536 wide: one group each
        assert served < whole_row < served * 1.02


def test_an_inference_estimate_shows_the_checkpoint_bits() -> None:
    """estimate(): the weights a user sees, and what the assumptions say they are."""
    reports = {
        bits: estimate(
            make_plan(model={"name": "m", "config": _checkpoint(SMALL, "gptq", bits, group_size=128)}, mode="inference")
        )
        for bits in (2, 3, 4, 8)
    }
    plain = estimate(make_plan(model={"name": "m", "config": SMALL}, mode="inference"))
    assert plain.memory.breakdown["weights"] == pytest.approx(SMALL_FP16 / 2**30, abs=6e-4)
    for bits, report in reports.items():
        assert report.memory.breakdown["weights"] == pytest.approx(HAND[bits] / 2**30, abs=6e-4)
        assert any(f"{bits}-bit GPTQ codes" in a and "group of 128 inputs" in a for a in report.assumptions)
    peaks = [reports[b].memory.peak_allocated_gib for b in (2, 3, 4, 8)]
    assert peaks == sorted(peaks) and peaks[-1] < plain.memory.peak_allocated_gib


def test_an_awq_checkpoint_at_other_than_4_bits_says_no_loader_reads_it() -> None:
    eight = estimate(make_plan(model={"name": "m", "config": _checkpoint(SMALL, "awq", 8)}, mode="inference"))
    assert any("8-bit AWQ" in w and "only 4-bit" in w for w in eight.warnings), eight.warnings
    four = estimate(make_plan(model={"name": "m", "config": _checkpoint(SMALL, "awq", 4)}, mode="inference"))
    assert not any("AWQ" in w for w in four.warnings)


@pytest.mark.parametrize(
    ("quant", "field"),
    [
        ({"bits": 5}, "bits"),
        ({"bits": 7}, "bits"),
        ({"bits": 4, "group_size": 0}, "group_size"),
        ({"bits": 4, "group_size": -2}, "group_size"),
        ({"bits": 4, "group_size": "128"}, "group_size"),
        ({"bits": 4, "group_size": True}, "group_size"),
        ({"bits": 4, "group_size": 1.5}, "group_size"),
        ({"bits": 4, "group_size": None}, "group_size"),
    ],
    ids=repr,
)
@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_widths_and_groups_no_gptq_layout_packs_are_refused(method: str, quant: dict[str, Any], field: str) -> None:
    config = {**SMALL, "quantization_config": {"quant_method": method, **quant}}
    with pytest.raises(EstimatorError) as err:
        estimate(make_plan(model={"name": "m", "config": config}, mode="inference"))
    assert err.value.field == f"model.config.quantization_config.{field}"
    # An infinite group_size (which the plan's JSON checks refuse first) is no whole number either.
    with pytest.raises(EstimatorError) as inf:
        architecture_from_config({**SMALL, "quantization_config": {"quant_method": method, "group_size": math.inf}})
    assert inf.value.field == "model.config.quantization_config.group_size"
    # Other quantizers' 5-bit configs (AutoRound loads 2 to 8) stay accepted.
    architecture_from_config({**SMALL, "quantization_config": {"quant_method": "auto-round", "bits": 5}})


def test_training_over_an_8_bit_gptq_checkpoint_stays_refused() -> None:
    config = _checkpoint(SMALL, "gptq", 8, group_size=128)
    with pytest.raises(EstimatorError) as err:
        resolve_recipe(make_plan(model={"name": "m", "config": config}, method="qlora", lora={"rank": 8}))
    assert err.value.field == "model.config.quantization_config.bits"


# --- the user's path: POST /v1/estimate -----------------------------------------------------------------


# Llama-3.1-8B by hand: 32 blocks of 2 x 4096 x 4096 (q, o) + 2 x 4096 x 1024 (k, v) + 3 x 4096 x 14336 (MLP)
# quantized; 2 x 128,256 x 4096 (embeddings, untied head) + 65 x 4096 (norms) left 16-bit.
LLAMA_QUANTIZED = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336)  # 6,979,321,856
LLAMA_UNQUANTIZED = 2 * 128_256 * 4096 + 65 * 4096  # 1,050,939,392


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_post_estimate_shows_the_weights_at_the_checkpoint_bits(api: tuple[Any, dict[str, str]], bits: int) -> None:
    client, headers = api
    config = _checkpoint(LLAMA_8B, "gptq", bits, group_size=128, desc_act=False)
    body = {"model": {"name": "someone/Llama-3.1-8B-GPTQ", "config": config}, "mode": "inference", "seq_len": 4096}
    response = client.post("/v1/estimate", json=body, headers=headers)
    assert response.status_code == 200, response.text
    data = response.json()
    expected = LLAMA_QUANTIZED * (bits / 8 + (2 + bits / 8) / 128) + 2 * LLAMA_UNQUANTIZED
    # 2 bits: 3.697 GiB; 3 bits: 4.516; 4 bits: 5.334; 8 bits: 8.610 (16-bit: 14.958).
    assert data["memory"]["breakdown"]["weights"] == pytest.approx(expected / 2**30, abs=1e-3)
    assert any(f"{bits}-bit GPTQ codes" in a for a in data["assumptions"]), data["assumptions"]
    fp16 = client.post("/v1/estimate", json={**body, "model": {"name": "m", "config": LLAMA_8B}}, headers=headers)
    sixteen = fp16.json()["memory"]["breakdown"]["weights"]
    assert sixteen == pytest.approx(2 * (LLAMA_QUANTIZED + LLAMA_UNQUANTIZED) / 2**30, abs=1e-3)
    assert (
        data["memory"]["peak_allocated_gib"]
        < fp16.json()["memory"]["peak_allocated_gib"] - (sixteen - expected / 2**30) * 0.99
    )
