"""The bundled model catalog: published config.json fields of popular open models, by HF id."""

from __future__ import annotations

import difflib
import functools
import json
import math
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

from services.core.errors import UnknownModelError


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


def find_model(name: str) -> CatalogModel:
    """Look a model up by HF id or alias (case-insensitive); an unknown id lists the closest catalog ids,
    or says that none is close."""
    key = name.strip().lower()
    found = _index().get(key)
    if found is not None:
        return found
    known = sorted({m.hf_id for m in catalog_models()})
    close = closest_models(name, known)
    hint = (
        f" Closest: {', '.join(close)}."
        if close
        else " Nothing in it is close (no model of the same family and version)."
    )
    raise UnknownModelError(name, f"{name!r} is not in the bundled catalog of {len(known)} models.{hint}", tuple(close))


def alias_note(name: str, model: CatalogModel) -> str | None:
    """A note when `name` reached `model` through an alias (an -Instruct/-chat/-it checkpoint or another
    spelling of the id): the estimate then uses the catalog entry's config.json, whose architecture the
    alias shares (the catalog lists an alias only for a checkpoint with the same config fields)."""
    key = name.strip().lower()
    if key in (model.hf_id.lower(), model.hf_id.split("/")[-1].lower()):
        return None
    if bool(_VARIANT_TOKENS & set(_tokens(name))) != bool(_VARIANT_TOKENS & set(_tokens(model.hf_id))):
        why = "whose config.json it shares (a fine-tune keeps the architecture and parameter count, so the memory "
        why += "and speed are the same)"
    else:
        why = "the same model under another id"
    return f"model.name: {name.strip()!r} is estimated as {model.hf_id!r}, {why}"


# Name tokens that mark a fine-tuned or packaged variant rather than a model family.
_VARIANT_TOKENS = frozenset({"instruct", "chat", "it", "hf", "base", "pt", "deduped", "mt", "sft", "dpo", "rlhf"})
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)([bm])$")
# How alike two family tokens must be (difflib ratio) to count as one family: "lama" ~ "llama" (0.89),
# but not "mistral" ~ "mixtral" (0.86).
FAMILY_SIMILARITY = 0.88


def _tokens(name: str) -> list[str]:
    """The lower-case word and number tokens of a model id's name part: 'Llama-3.2-1B' -> llama, 3.2, 1b."""
    return re.findall(r"[a-z]+|\d+(?:\.\d+)*[a-z]*", name.split("/")[-1].lower())


def _size_params(tokens: list[str]) -> float | None:
    for token in tokens:
        match = _SIZE.match(token)
        if match:
            return float(match.group(1)) * (1e9 if match.group(2) == "b" else 1e6)
    return None


def _family(tokens: list[str]) -> set[str]:
    return {t for t in tokens if t.isalpha() and t not in _VARIANT_TOKENS and t != "v"}


def _version(tokens: list[str]) -> str | None:
    """The first number that is not a size: the generation ('3.2' in Llama-3.2-1B, '2.5' in Qwen2.5-7B)."""
    return next((t for t in tokens if t[0].isdigit() and not _SIZE.match(t)), None)


def closest_models(name: str, known: list[str], limit: int = 5) -> list[str]:
    """Catalog ids close to an unknown `name`: same family (a shared name token, typos allowed) and, when
    the name has one, the same version; nearest in size first, then by spelling (difflib's ratio).
    Spelling alone is not enough: 'Llama-4-Scout-17B-16E' looks like 'Llama-3.2-1B' but is another model."""
    query = _tokens(name)
    family, version, size = _family(query), _version(query), _size_params(query)
    scored = []
    for hf_id in known:
        tokens = _tokens(hf_id)
        if not any(
            difflib.SequenceMatcher(None, a, b).ratio() >= FAMILY_SIMILARITY for a in family for b in _family(tokens)
        ):
            continue
        if version is not None and _version(tokens) != version:
            continue
        other = _size_params(tokens)
        distance = abs(math.log(size / other)) if size and other else math.inf
        spelling = difflib.SequenceMatcher(None, name.strip().lower(), hf_id.lower()).ratio()
        scored.append((distance, -spelling, hf_id))
    return [hf_id for _, _, hf_id in sorted(scored)[:limit]]
