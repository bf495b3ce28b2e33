from __future__ import annotations

import pytest

from services.catalog.models import catalog_models
from services.estimator.architecture import (
    SUPPORTED_MODEL_TYPES,
    architecture_from_config,
    parameter_counts,
)
from services.estimator.architecture.sizes import check_architecture_sizes
from services.estimator.errors import EstimatorError

REQUIRED_FAMILIES = {
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen3",
    "gemma",
    "gemma2",
    "gemma3_text",
    "phi",
    "phi3",
    "gpt2",
    "gpt_neox",
    "gpt_bigcode",
    "falcon",
    "stablelm",
    "olmo",
}
MODELS_WITH_COUNTS = [m for m in catalog_models() if m.published_params]


def test_every_required_family_is_supported() -> None:
    assert set(SUPPORTED_MODEL_TYPES) >= REQUIRED_FAMILIES


def _family(model_config: dict[str, object]) -> str:
    text = model_config.get("text_config")
    if model_config.get("model_type") == "gemma3" and isinstance(text, dict):
        return "gemma3_text"
    return str(model_config["model_type"])


def test_every_required_family_has_a_published_count_check() -> None:
    checked = {_family(m.config) for m in MODELS_WITH_COUNTS}
    assert checked >= REQUIRED_FAMILIES, REQUIRED_FAMILIES - checked


@pytest.mark.parametrize("model", MODELS_WITH_COUNTS, ids=lambda m: m.hf_id)
def test_parameter_count_matches_published(model) -> None:  # type: ignore[no-untyped-def]
    arch = architecture_from_config(model.config)
    counts = parameter_counts(arch)
    expected = model.published_params
    if model.published_counts_tied_head_twice:
        expected -= arch.hidden_size * arch.vocab_size
    assert abs(counts.total - expected) / expected <= 0.005, (counts.total, expected)


@pytest.mark.parametrize("model", [m for m in catalog_models() if m.published_active_params], ids=lambda m: m.hf_id)
def test_moe_active_parameters_match_published(model) -> None:  # type: ignore[no-untyped-def]
    counts = parameter_counts(architecture_from_config(model.config))
    assert counts.active < counts.total
    assert abs(counts.active - model.published_active_params) / model.published_active_params <= 0.005


def test_llama_components_add_up() -> None:
    cfg = {
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 100,
        "tie_word_embeddings": False,
    }
    counts = parameter_counts(architecture_from_config(cfg))
    head_dim = 16
    attention = 2 * (64 * 64 + 2 * 64 * 2 * head_dim + 64 * 64)
    mlp = 2 * 3 * 64 * 128
    norms = 2 * 2 * 64 + 64
    assert counts.attention == attention
    assert counts.mlp == mlp
    assert counts.norms == norms
    assert counts.embedding == counts.lm_head == 100 * 64
    assert counts.total == attention + mlp + norms + 2 * 100 * 64


def test_tied_embeddings_have_no_head_parameters() -> None:
    cfg = {
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "vocab_size": 100,
        "tie_word_embeddings": True,
    }
    assert parameter_counts(architecture_from_config(cfg)).lm_head == 0


def test_unknown_family_without_sizes_names_the_missing_keys_and_the_known_families() -> None:
    with pytest.raises(EstimatorError) as err:
        architecture_from_config({"model_type": "rwkv", "hidden_size": 8})
    assert err.value.field == "model.config"
    assert "num_hidden_layers" in err.value.message
    assert "llama" in err.value.message


def test_missing_field_is_named() -> None:
    with pytest.raises(EstimatorError) as err:
        architecture_from_config({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4})
    assert err.value.field == "model.config.num_hidden_layers"


def test_bad_value_is_named() -> None:
    with pytest.raises(EstimatorError) as err:
        architecture_from_config(
            {
                "model_type": "llama",
                "hidden_size": "big",
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "vocab_size": 10,
            }
        )
    assert err.value.field == "model.config.hidden_size"


def test_kv_heads_must_divide_heads() -> None:
    with pytest.raises(EstimatorError) as err:
        architecture_from_config(
            {
                "model_type": "llama",
                "hidden_size": 64,
                "intermediate_size": 8,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 3,
                "vocab_size": 10,
            }
        )
    assert err.value.field == "model.config.num_key_value_heads"


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"num_local_experts": 4, "num_experts_per_tok": 0}, "num_experts_per_tok"),
        ({"num_local_experts": 4, "num_experts_per_tok": 8}, "num_experts_per_tok"),
    ],
)
def test_a_moe_config_routing_to_no_expert_or_more_than_it_has_is_refused(fields: dict[str, int], field: str) -> None:
    """Routing each token to no expert was sized as a model without MLPs (a probe of the estimator): refused, naming
    the field, by the CLI as by the API."""
    config = {
        "model_type": "mixtral",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 1000,
        **fields,
    }
    with pytest.raises(EstimatorError) as caught:
        check_architecture_sizes(architecture_from_config(config))
    assert caught.value.field == f"model.config.{field}"
