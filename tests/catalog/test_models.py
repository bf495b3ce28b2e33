from __future__ import annotations

import pytest

from services.catalog.models import alias_note, catalog_models, find_model
from services.estimator.architecture import architecture_from_config
from services.estimator.errors import EstimatorError, UnknownModelError

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
    # Neutral wording: each edge (CLI, API, dashboard) adds its own way to pass a config.json.
    assert "--config" not in err.value.message and "model.config" not in err.value.message


@pytest.mark.parametrize(
    ("name", "closest"),
    [
        # Nearest size of the same family and version first.
        (
            "meta-llama/Llama-3.1-7B",
            ["meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-70B", "meta-llama/Llama-3.1-405B"],
        ),
        ("lama-3.1-8b", ["meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-70B", "meta-llama/Llama-3.1-405B"]),
        ("Llama-2-7b", ["meta-llama/Llama-2-7b-hf", "meta-llama/Llama-2-13b-hf", "meta-llama/Llama-2-70b-hf"]),
        (
            "gemma-3-4b",
            ["google/gemma-3-4b-pt", "google/gemma-3-12b-pt", "google/gemma-3-1b-pt", "google/gemma-3-27b-pt"],
        ),
        # Mixtral is not Mistral, although the names differ by one letter.
        (
            "mistral-7b",
            ["mistralai/Mistral-7B-v0.1", "mistralai/Mistral-7B-Instruct-v0.3", "mistralai/Mistral-Nemo-Base-2407"],
        ),
        # Llama 4 Scout (a 109B mixture of experts) is not close to any Llama 3 model; nothing is listed.
        ("meta-llama/Llama-4-Scout-17B-16E", []),
        ("deepseek-ai/DeepSeek-V3", []),
    ],
)
def test_closest_names_share_family_and_version(name: str, closest: list[str]) -> None:
    with pytest.raises(UnknownModelError) as err:
        find_model(name)
    assert list(err.value.closest) == closest
    if closest:
        assert f"Closest: {', '.join(closest)}." in err.value.message
    else:
        assert "Nothing in it is close" in err.value.message


@pytest.mark.parametrize(
    ("name", "note"),
    [
        ("meta-llama/Llama-3.1-8B", None),
        ("Llama-3.1-8B", None),
        ("meta-llama/Llama-3.1-8B-Instruct", "is estimated as 'meta-llama/Llama-3.1-8B', whose config.json it shares"),
        ("google/gemma-2-9b-it", "is estimated as 'google/gemma-2-9b', whose config.json it shares"),
        ("t5-small", None),
        ("bigcode/santacoder", "is estimated as 'bigcode/gpt_bigcode-santacoder', the same model under another id"),
    ],
)
def test_an_alias_says_which_entry_it_is_estimated_as(name: str, note: str | None) -> None:
    found = alias_note(name, find_model(name))
    assert (found is None) == (note is None)
    if note is not None:
        assert found is not None and note in found and found.startswith(f"model.name: {name!r}")
