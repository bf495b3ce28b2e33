"""The bundled model catalog: published config.json fields of popular open models, by HF id."""

from __future__ import annotations

import difflib
import functools
import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

from services.estimator.errors import EstimatorError


@dataclass(frozen=True)
class CatalogModel:
    hf_id: str
    aliases: tuple[str, ...]
    config: dict[str, Any]
    published_params: int | None
    published_active_params: int | None
    published_params_source: str
    source: str
    # Some published totals (HF safetensors metadata) count a tied embedding/head twice.
    published_counts_tied_head_twice: bool = False


def parse_model_file(text: str) -> CatalogModel:
    raw = json.loads(text)
    return CatalogModel(
        hf_id=raw["hf_id"],
        aliases=tuple(raw.get("aliases") or ()),
        config=dict(raw["config"]),
        published_params=raw.get("published_params"),
        published_active_params=raw.get("published_active_params"),
        published_params_source=raw.get("published_params_source") or "",
        source=raw.get("source") or "",
        published_counts_tied_head_twice=bool(raw.get("published_params_tied_head_counted_twice")),
    )


@functools.cache
def catalog_models() -> tuple[CatalogModel, ...]:
    """Every bundled model, sorted by HF id (read on first use, then cached)."""
    folder = resources.files("services.catalog").joinpath("data/models")
    models = [parse_model_file(f.read_text(encoding="utf-8")) for f in folder.iterdir() if f.name.endswith(".json")]
    return tuple(sorted(models, key=lambda m: m.hf_id.lower()))


@functools.cache
def _index() -> dict[str, CatalogModel]:
    index: dict[str, CatalogModel] = {}
    for model in catalog_models():
        for name in (model.hf_id, *model.aliases):
            index[name.lower()] = model
            # Also accept the id without its organisation ("Llama-3.1-8B").
            index.setdefault(name.split("/")[-1].lower(), model)
    return index


def closest_models(name: str) -> list[str]:
    """Up to five bundled ids closest to ``name`` (by the whole id, else by the part after the owner)."""
    key = name.strip().lower()
    known = sorted({m.hf_id for m in catalog_models()})
    close = difflib.get_close_matches(name.strip(), known, n=5, cutoff=0.5)
    if not close:
        short = {m.hf_id.split("/")[-1].lower(): m.hf_id for m in catalog_models()}
        close = [short[s] for s in difflib.get_close_matches(key.split("/")[-1], list(short), n=5, cutoff=0.5)]
    return close


def find_model(name: str) -> CatalogModel:
    """Look a model up by HF id or alias (case-insensitive); unknown ids list the closest ids."""
    key = name.strip().lower()
    found = _index().get(key)
    if found is not None:
        return found
    close = closest_models(name)
    hint = f" Closest: {', '.join(close)}." if close else ""
    raise EstimatorError(
        "model.name",
        f"{name!r:.200} is not in the bundled catalog of {len(catalog_models())} models.{hint} "
        "Give a Hugging Face id (owner/name) to fetch its config.json from the Hub, or pass the config as "
        "model.config (or --config FILE).",
    )
