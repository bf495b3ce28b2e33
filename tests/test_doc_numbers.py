"""Counts the docs quote (catalog models, cards) are the ones the code has: a number
that drifts from what gpuplan prints fails here, not in a reader's hands."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _models() -> int:
    from services.catalog.models import catalog_models

    return len(catalog_models())


def _cards() -> int:
    from services.catalog.gpus import gpu_specs

    return len(gpu_specs())


# Each phrasing the docs use for a count, and the code's count.
COUNTS: list[tuple[str, Callable[[], int]]] = [
    (r"bundled catalog \((\d+) models", _models),
    (r"models/\*\.json`, (\d+) models", _models),
    (r"the fit on (\d+) cards", _cards),
]


def _documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("pattern,count", COUNTS, ids=[p for p, _ in COUNTS])
def test_every_count_the_docs_quote_is_the_codes(pattern: str, count: Callable[[], int]) -> None:
    expected = count()
    found = []
    for path in _documents():
        for number in re.findall(pattern, path.read_text(encoding="utf-8")):
            found.append((path.name, int(number)))
    assert found, f"no document quotes {pattern!r} any more: drop the pattern"
    wrong = [(name, n) for name, n in found if n != expected]
    assert not wrong, f"the docs say {wrong}; the code has {expected}"


def test_the_catalogs_own_message_counts_its_models() -> None:
    from services.catalog.models import find_model
    from services.estimator.errors import EstimatorError

    with pytest.raises(EstimatorError) as missing:
        find_model("meta-llama/Llama-3.1-7B")
    assert f"bundled catalog of {_models()} models" in missing.value.message
