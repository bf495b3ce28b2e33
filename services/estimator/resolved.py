"""A plan resolved once: its model's name, parsed architecture and resolved recipe, handed down to the
estimate, the planner, the exports and the trace instead of each resolving the plan again."""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from services.catalog.models import CatalogModel, alias_note, find_model
from services.estimator.architecture import Architecture, architecture_from_config
from services.estimator.errors import EstimatorError
from services.estimator.plan import Plan
from services.estimator.recipe import Recipe, resolve_recipe

# Parsed architectures kept by the content of their config.json, so the API request that checks a plan and
# the in-process task that estimates it (or an export planned again) parse a model once.
ARCHITECTURE_CACHE_SIZE = 64

_architectures: OrderedDict[str, Architecture] = OrderedDict()
_architectures_lock = threading.Lock()


def _content_key(config: Mapping[str, Any]) -> str | None:
    """A hash of the config's canonical JSON; None for a config that is no JSON (then it is not cached)."""
    try:
        text = json.dumps(config, sort_keys=True, separators=(",", ":"), allow_nan=True)
    except (TypeError, ValueError):
        return None
    return hashlib.sha256(text.encode()).hexdigest()


def parse_architecture(config: Mapping[str, Any]) -> Architecture:
    """``architecture_from_config``, parsed once per distinct config content (a bounded LRU)."""
    key = _content_key(config)
    if key is None:
        return architecture_from_config(config)
    with _architectures_lock:
        found = _architectures.get(key)
        if found is not None:
            _architectures.move_to_end(key)
            return found
    arch = architecture_from_config(config)  # outside the lock: a parse can take milliseconds
    with _architectures_lock:
        _architectures[key] = arch
        _architectures.move_to_end(key)
        while len(_architectures) > ARCHITECTURE_CACHE_SIZE:
            _architectures.popitem(last=False)
    return arch


def clear_architecture_cache() -> None:
    """Forget the parsed architectures (tests that count parses start from none)."""
    with _architectures_lock:
        _architectures.clear()


@dataclass(frozen=True)
class ResolvedPlan:
    """The plan (its model's config filled in where the edge fetched it), the model's name, its architecture,
    the plan's recipe, and the notes its resolution made (an alias the name went through)."""

    plan: Plan
    name: str
    architecture: Architecture
    recipe: Recipe
    notes: tuple[str, ...] = ()

    def variant(self, plan: Plan) -> ResolvedPlan:
        """Another plan of the same model (other GPUs, sharding, batch, framework): the architecture is kept,
        the recipe derived again from the new plan's fields. ``plan``'s model is replaced by this one's."""
        if plan is self.plan:
            return self
        if plan.model != self.plan.model:
            plan = plan.model_copy(update={"model": self.plan.model})
        return ResolvedPlan(plan, self.name, self.architecture, resolve_recipe(plan), self.notes)


def resolve_architecture(plan: Plan, found: CatalogModel | None = None) -> tuple[str, Architecture]:
    """The model's name and architecture, from its config.json or the bundled catalog (``found``: the
    catalog entry the caller already looked up for ``plan.model.name``)."""
    spec = plan.model
    if spec.config is not None:
        return spec.name or str(spec.config.get("_name_or_path") or "custom model"), parse_architecture(spec.config)
    if spec.name is None:
        raise EstimatorError("model", "give model.name or model.config")
    found = found if found is not None else find_model(spec.name)
    return found.hf_id, parse_architecture(found.config)


def resolve_plan(plan: Plan, found: CatalogModel | None = None) -> ResolvedPlan:
    """Resolve ``plan`` once: its model (config.json given, or ``found``/the bundled catalog by name), the
    architecture and the recipe. A generic model has no architecture: EstimatorError."""
    if plan.model.generic is not None:
        raise EstimatorError("model.generic", "a generic model has no architecture to resolve")
    notes: tuple[str, ...] = ()
    if plan.model.config is None and plan.model.name is not None:
        found = found if found is not None else find_model(plan.model.name)
        note = alias_note(plan.model.name, found)
        notes = (note,) if note is not None else ()
    name, arch = resolve_architecture(plan, found)
    return ResolvedPlan(plan, name, arch, resolve_recipe(plan), notes)


def as_resolved(plan: Plan | ResolvedPlan) -> ResolvedPlan:
    """``plan`` as a ResolvedPlan: the entry points that take either resolve a bare plan here, once."""
    return plan if isinstance(plan, ResolvedPlan) else resolve_plan(plan)
