"""How a config.json says its weights are stored (``torch_dtype`` / ``dtype``, ``quantization_config.bits``):
a value no loader reads is refused naming the field, by the estimator's entry points and the API (a 422;
the CLI's one line is in tests/cli/test_input_limits.py). What is accepted is checked against torch and
transformers themselves."""

from __future__ import annotations

from typing import Any

import pytest

from services.estimator.architecture import architecture_from_config
from services.estimator.errors import EstimatorError
from services.estimator.estimate import estimate
from tests.conftest import LLAMA_8B, make_plan

# Values transformers' PretrainedConfig cannot load (getattr(torch, name) fails, or a list breaks
# dict_dtype_to_str), and a number it would keep as a dtype without complaint, though it names none.
BAD_DTYPES: list[Any] = ["float8_weird", "auto", "torch.float16", "fp16", "bf16", "", 7, 16.0, True, ["float16"]]
GOOD_DTYPES: list[Any] = ["bfloat16", "float16", "float32", "half", "float", "float8_e4m3fn", "int8", None]


def _refused(config: dict[str, Any]) -> EstimatorError:
    with pytest.raises(EstimatorError) as err:
        architecture_from_config(config)
    return err.value


@pytest.mark.parametrize("key", ["torch_dtype", "dtype"])
@pytest.mark.parametrize("value", BAD_DTYPES, ids=repr)
def test_an_unknown_dtype_is_refused_naming_the_field(key: str, value: Any) -> None:
    err = _refused({**LLAMA_8B, key: value})
    assert err.field == f"model.config.{key}"
    assert "bfloat16" in err.message and "float16" in err.message  # the allowed spellings


@pytest.mark.parametrize("value", GOOD_DTYPES, ids=repr)
def test_a_torch_dtype_name_or_null_is_accepted(value: Any) -> None:
    plain = architecture_from_config(LLAMA_8B)
    assert architecture_from_config({**LLAMA_8B, "torch_dtype": value}) == plain
    assert architecture_from_config({**LLAMA_8B, "dtype": value}) == plain


def test_a_sub_configs_dtype_is_checked_and_a_dtype_per_sub_config_is_read() -> None:
    gemma3 = {
        "model_type": "gemma3",
        "text_config": {**LLAMA_8B, "model_type": "gemma3_text", "head_dim": 128, "torch_dtype": "bfloat16"},
        "vision_config": {
            "model_type": "siglip_vision_model",
            "hidden_size": 1152,
            "intermediate_size": 4304,
            "num_hidden_layers": 27,
            "num_attention_heads": 16,
            "image_size": 896,
            "patch_size": 14,
        },
        "mm_tokens_per_image": 256,
        "torch_dtype": "bfloat16",
    }
    architecture_from_config(gemma3)
    bad_text = {**gemma3, "text_config": {**gemma3["text_config"], "torch_dtype": "bfloat17"}}
    assert _refused(bad_text).field == "model.config.text_config.torch_dtype"
    # transformers writes a dtype per sub-config as a mapping (PretrainedConfig.dict_dtype_to_str).
    architecture_from_config({**gemma3, "dtype": {"text_config": "bfloat16", "vision_config": "float32"}})
    assert _refused({**gemma3, "dtype": {"text_config": "bf16"}}).field == "model.config.dtype.text_config"


def test_every_dtype_torch_has_is_accepted_and_what_transformers_refuses_is_refused() -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    names = sorted(n for n in dir(torch) if isinstance(getattr(torch, n), torch.dtype))
    plain = architecture_from_config(LLAMA_8B)
    for name in names:
        assert architecture_from_config({**LLAMA_8B, "torch_dtype": name}) == plain, name
    for value in BAD_DTYPES:
        if isinstance(value, str | list):  # a number passes PretrainedConfig unread
            with pytest.raises((AttributeError, IndexError)):
                transformers.LlamaConfig.from_dict({"torch_dtype": value})


def _awq(bits: Any) -> dict[str, Any]:
    return {**LLAMA_8B, "quantization_config": {"quant_method": "awq", "bits": bits, "group_size": 128}}


@pytest.mark.parametrize("bits", [[4], "4", True, False, None, 4.5, 0, 1, 9, 16, -4, {"w": 4}], ids=repr)
def test_quantization_bits_that_are_no_supported_integer_are_refused(bits: Any) -> None:
    err = _refused(_awq(bits))
    assert err.field == "model.config.quantization_config.bits"
    assert "2 to 8" in err.message
    # The inference estimate, where a list used to pass as "not 4-bit" (served unquantized), refuses it too.
    with pytest.raises(EstimatorError) as served:
        estimate(make_plan(model={"name": "m", "config": _awq(bits)}, mode="inference"))
    assert served.value.field == "model.config.quantization_config.bits"


@pytest.mark.parametrize("bits", [2, 3, 4, 8, 4.0])
def test_the_bit_widths_transformers_loads_are_accepted(bits: Any) -> None:
    architecture_from_config(_awq(bits))


def test_a_served_4_bit_awq_checkpoint_is_still_read_as_awq() -> None:
    report = estimate(make_plan(model={"name": "m", "config": _awq(4)}, mode="inference"))
    unquantized = estimate(make_plan(model={"name": "m", "config": LLAMA_8B}, mode="inference"))
    # 4-bit linears; the embeddings and the head stay 16-bit.
    assert report.memory.breakdown["weights"] < unquantized.memory.breakdown["weights"] / 2
    no_bits = {**LLAMA_8B, "quantization_config": {"quant_method": "awq"}}  # absent: 4, as AwqConfig defaults
    assert estimate(make_plan(model={"name": "m", "config": no_bits}, mode="inference")).memory == report.memory


def test_a_quantization_config_that_is_no_object_is_refused() -> None:
    err = _refused({**LLAMA_8B, "quantization_config": ["awq", 4]})
    assert err.field == "model.config.quantization_config"


# --- the API edge: 422 naming the field -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({**LLAMA_8B, "torch_dtype": "float8_weird"}, "model.config.torch_dtype"),
        ({**LLAMA_8B, "torch_dtype": ["bfloat16"]}, "model.config.torch_dtype"),
        (_awq([4]), "model.config.quantization_config.bits"),
        (_awq(True), "model.config.quantization_config.bits"),
    ],
    ids=["unknown-dtype", "dtype-list", "bits-list", "bits-bool"],
)
def test_the_api_answers_422_naming_the_field(api: tuple[Any, dict[str, str]], config: Any, field: str) -> None:
    client, headers = api
    body = {"model": {"name": "m", "config": config}, "mode": "inference"}
    response = client.post("/v1/estimate", json=body, headers=headers)
    assert response.status_code == 422, response.text
    assert response.json()["field"] == field and field in response.json()["message"]
    body["model"]["config"] = LLAMA_8B  # the same request with a sound config is estimated
    assert client.post("/v1/estimate", json=body, headers=headers).status_code == 200
