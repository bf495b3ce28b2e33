from __future__ import annotations

import pytest

from services.catalog.models import catalog_models, find_model
from services.estimator.architecture import architecture_from_config
from services.estimator.errors import EstimatorError

FAMILIES_WANTED = [
    "Llama-2",
    "Llama-3",
    "Llama-3.1",
    "Llama-3.2",
    "Llama-3.3",
    "Mistral",
    "Mixtral",
    "Qwen2.5",
    "Qwen3",
    "gemma-2",
    "gemma-3",
    "Phi-3",
    "phi-4",
    "falcon",
    "SmolLM",
    "TinyLlama",
    "gpt2",
    "pythia",
    "DeepSeek-R1-Distill",
]


def test_catalog_has_at_least_forty_models_covering_the_families() -> None:
    models = catalog_models()
    assert len(models) >= 40
    ids = " ".join(m.hf_id for m in models).lower()
    for family in FAMILIES_WANTED:
        assert family.lower() in ids, family


@pytest.mark.parametrize("model", catalog_models(), ids=lambda m: m.hf_id)
def test_every_bundled_config_parses(model) -> None:  # type: ignore[no-untyped-def]
    architecture_from_config(model.config)
    assert model.source


def test_lookup_by_id_alias_and_short_name() -> None:
    assert find_model("meta-llama/Llama-3.1-8B").hf_id == "meta-llama/Llama-3.1-8B"
    assert find_model("META-LLAMA/llama-3.1-8b").hf_id == "meta-llama/Llama-3.1-8B"
    assert find_model("meta-llama/Llama-3.1-8B-Instruct").hf_id == "meta-llama/Llama-3.1-8B"
    assert find_model("Llama-3.1-8B").hf_id == "meta-llama/Llama-3.1-8B"


def test_unknown_id_lists_close_matches() -> None:
    with pytest.raises(EstimatorError) as err:
        find_model("meta-llama/Llama-3.1-9B")
    assert err.value.field == "model.name"
    assert "meta-llama/Llama-3.1-8B" in err.value.message
    assert "config.json" in err.value.message
