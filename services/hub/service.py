"""Resolving a model name at the edge: the bundled catalog first, then the cache, then the Hub.

The pure estimator never sees a name it must look up: ``with_model_config`` returns the plan with the
model's config.json in ``model.config`` (the name kept), which the estimator reads as it reads a pasted
config. The API caches in the database, the CLI in a folder (``GPUPLAN_HUB_CACHE_DIR``).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from services.catalog.models import CatalogModel, catalog_models, closest_models, find_model
from services.core.db import unit_of_work, utcnow
from services.estimator.errors import EstimatorError
from services.estimator.plan import ModelSpec, Plan
from services.estimator.resolved import ResolvedPlan, resolve_plan
from services.hub.errors import HubModelGated, HubModelNotFound, HubUnreachable
from services.hub.ids import is_hub_id
from services.hub.models import Checkpoint, HubModel, HubSettings, check_repo_id
from services.hub.tables import HubModelRow

Fetcher = Callable[[str], HubModel]


@dataclass(frozen=True)
class ResolvedModel:
    name: str
    config: dict[str, Any]
    origin: str  # "catalog", "cache" or "hub"
    checkpoint: Checkpoint | None = None
    catalog: CatalogModel | None = None  # the bundled entry, for origin "catalog"


class ConfigCache(Protocol):
    def get(self, repo_id: str) -> HubModel | None: ...

    def put(self, model: HubModel, endpoint: str) -> None: ...


def _key(repo_id: str) -> str:
    return repo_id.strip().lower()


def _checkpoint(data: Any) -> Checkpoint | None:
    if not isinstance(data, dict):
        return None
    size, dtype, counts, tensor_bytes = (
        data.get("stored_bytes"),
        data.get("dtype"),
        data.get("parameters_by_dtype"),
        data.get("tensor_bytes"),
    )
    return Checkpoint(
        stored_bytes=size if isinstance(size, int) else None,
        dtype=dtype if isinstance(dtype, str) else None,
        source=str(data.get("source") or ""),
        parameters_by_dtype={str(k): int(v) for k, v in counts.items() if isinstance(v, int)}
        if isinstance(counts, dict)
        else None,
        tensor_bytes=tensor_bytes if isinstance(tensor_bytes, int) else None,
    )


class DbCache:
    """The API's cache: the hub_models table, in the request's session (the request commits)."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def get(self, repo_id: str) -> HubModel | None:
        row = self.session.get(HubModelRow, _key(repo_id))
        if row is None:
            return None
        return HubModel(row.repo_id, row.revision, dict(row.config), _checkpoint(row.checkpoint))

    def put(self, model: HubModel, endpoint: str) -> None:
        row = self.session.get(HubModelRow, _key(model.repo_id))
        if row is None:
            row = HubModelRow(key=_key(model.repo_id))
            self.session.add(row)
        row.repo_id = model.repo_id
        row.revision = model.revision
        row.endpoint = endpoint[:500]
        row.config = model.config
        row.checkpoint = model.checkpoint.as_dict() if model.checkpoint else None
        row.fetched_at = utcnow()
        self.session.flush()


def default_cache_dir() -> Path:
    """GPUPLAN_HUB_CACHE_DIR, else $XDG_CACHE_HOME/gpuplan/hub, else ~/.cache/gpuplan/hub."""
    explicit = os.environ.get("GPUPLAN_HUB_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpuplan" / "hub"


def write_cache_file(path: Path, record: dict[str, Any]) -> None:
    """One cache entry as JSON, written atomically (a temporary file renamed); an unwritable cache only
    costs a fetch next time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(record), encoding="utf-8")
        tmp.replace(path)
    except OSError:
        pass


class DiskCache:
    """The CLI's cache: one JSON file per model, written atomically (a temporary file renamed)."""

    def __init__(self, folder: Path | None = None) -> None:
        self.folder = folder or default_cache_dir()

    def _path(self, repo_id: str) -> Path:
        return self.folder / (_key(repo_id).replace("/", "--") + ".json")

    def get(self, repo_id: str) -> HubModel | None:
        path = self._path(repo_id)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict) or not isinstance(data.get("config"), dict):
            return None
        return HubModel(
            str(data.get("repo_id")), str(data.get("revision")), data["config"], _checkpoint(data.get("checkpoint"))
        )

    def put(self, model: HubModel, endpoint: str) -> None:
        path = self._path(model.repo_id)
        record = {
            "repo_id": model.repo_id,
            "revision": model.revision,
            "endpoint": endpoint,
            "fetched_at": utcnow().isoformat(),
            "config": model.config,
            "checkpoint": model.checkpoint.as_dict() if model.checkpoint else None,
        }
        write_cache_file(path, record)


# A Hub answer of "not found" or "gated" is remembered this long per (endpoint, token, id), so a client
# repeating an unknown id costs one Hub request per interval, not one per request. Network failures are not
# remembered: the next request tries again.
REFUSAL_MEMORY_S = 300.0
_REFUSALS_MAX = 10_000
_refusals: dict[tuple[str, str, str], tuple[float, HubModelNotFound | HubModelGated]] = {}
_refusals_lock = threading.Lock()


def _fetch_remembering_refusals(repo_id: str, settings: HubSettings) -> HubModel:
    token_tag = hashlib.sha256((settings.token or "").encode()).hexdigest()[:16]
    key = (settings.endpoint, token_tag, repo_id.lower())
    now = time.monotonic()
    with _refusals_lock:
        remembered = _refusals.get(key)
    if remembered is not None and remembered[0] > now:
        error = remembered[1]
        raise type(error)(error.message, field=error.field)
    from services.hub.client import fetch_model  # huggingface_hub: imported by a fetch, not by every command

    try:
        return fetch_model(repo_id, settings)
    except (HubModelNotFound, HubModelGated) as exc:
        with _refusals_lock:
            if len(_refusals) >= _REFUSALS_MAX:
                _refusals.clear()
            _refusals[key] = (now + REFUSAL_MEMORY_S, exc)
        raise


def resolve_model(name: str, cache: ConfigCache, fetcher: Fetcher | None = None) -> ResolvedModel:
    """The config of the model named ``name``: bundled catalog, then cache, then the Hub (cached after)."""
    try:
        found = find_model(name)
    except EstimatorError as not_bundled:
        try:
            repo_id = check_repo_id(name)
        except HubModelNotFound:
            raise not_bundled from None  # not a Hub id either: the catalog's closest matches help most
    else:
        return ResolvedModel(found.hf_id, dict(found.config), "catalog", catalog=found)
    cached = cache.get(repo_id)
    if cached is not None:
        return ResolvedModel(cached.repo_id, cached.config, "cache", cached.checkpoint)
    try:
        if fetcher is None:
            settings = HubSettings.from_environment()
            model = _fetch_remembering_refusals(repo_id, settings)
            endpoint = settings.endpoint
        else:
            model = fetcher(repo_id)
            endpoint = "custom"
    except (HubModelNotFound, HubUnreachable) as exc:
        close = closest_models(repo_id, sorted({m.hf_id for m in catalog_models()}))
        if not close:
            raise
        raise type(exc)(f"{exc.message}. Bundled models with close ids: {', '.join(close)}", field=exc.field) from None
    cache.put(model, endpoint)
    return ResolvedModel(model.repo_id, model.config, "hub", model.checkpoint)


P = TypeVar("P", bound=Plan)


def model_of(plan: Plan, cache: ConfigCache, fetcher: Fetcher | None = None) -> ResolvedModel | None:
    """Where the plan's named model's config.json comes from (catalog, cache or Hub); None where the plan
    gives a config or is generic."""
    spec = plan.model
    if spec.config is not None or spec.generic is not None or spec.name is None:
        return None
    return resolve_model(spec.name, cache, fetcher)


def filled_plan(plan: P, model: ResolvedModel | None) -> P:
    """``plan`` with the config.json of ``model`` (as ``model_of`` found it) where it came from the Hub."""
    if model is None or model.origin == "catalog":
        return plan  # the estimator reads the bundled catalog itself (and notes an alias it went through)
    return plan.model_copy(update={"model": ModelSpec(name=model.name, config=model.config)})


def with_model_config(plan: P, cache: ConfigCache, fetcher: Fetcher | None = None) -> tuple[P, ResolvedModel | None]:
    """The plan (or plan request) with its named model's config.json filled in; unchanged where it has a
    config or is generic, or its model is bundled (then no ResolvedModel either)."""
    model = model_of(plan, cache, fetcher)
    if model is None or model.origin == "catalog":
        return plan, None
    return filled_plan(plan, model), model


def resolved_with(plan: Plan, model: ResolvedModel | None) -> ResolvedPlan:
    """The plan resolved once (services.estimator.resolved) over the model ``model_of`` found for it: the
    Hub config filled in, or the bundled entry passed on so the catalog is not searched again."""
    found = model.catalog if model is not None and model.origin == "catalog" else None
    return resolve_plan(filled_plan(plan, model), found)


def stored_request(session: Session, request: P) -> P:
    """A stored plan request with its model's config filled in from the catalog or the Hub cache, for the
    work that reads plans back (quotes, runs, calibration, the dashboard's candidates)."""
    return with_model_config(request, DbCache(session))[0]


def request_data_with_config(session: Session, data: dict[str, Any]) -> dict[str, Any]:
    """A stored request body (JSON) with ``model.config`` added for a model known only from the Hub
    cache, so a node's agent can build the model without looking it up."""
    model = data.get("model")
    if not isinstance(model, dict) or model.get("config") is not None or not isinstance(model.get("name"), str):
        return data
    try:
        find_model(model["name"])
        return data  # bundled: the agent has the catalog too
    except EstimatorError:
        pass
    cached = DbCache(session).get(model["name"]) if is_hub_id(model["name"]) else None
    if cached is None:
        return data
    return {**data, "model": {**model, "config": cached.config}}


def checkpoint_note(resolved: ResolvedModel | None) -> list[str]:
    """One line on the Hub checkpoint (size and storage format) for the estimate's warnings."""
    if resolved is None or resolved.checkpoint is None:
        return []
    ck = resolved.checkpoint
    parts = []
    if ck.stored_bytes:
        parts.append(f"{ck.stored_bytes / 2**30:.1f} GiB stored")
    if ck.dtype:
        parts.append(f"as {ck.dtype}")
    if ck.parameters_by_dtype:
        total = sum(ck.parameters_by_dtype.values()) or 1
        shares = ", ".join(
            f"{n:,} {dtype} ({n / total:.1%})"
            for dtype, n in sorted(ck.parameters_by_dtype.items(), key=lambda kv: -kv[1])
        )
        parts.append(f"[{shares}]")
    if not parts:
        return []
    return [
        f"Hub checkpoint of {resolved.name}: {' '.join(parts)} (from {ck.source}; the download and disk to plan for)"
    ]


class FactoryCache:
    """The database cache in short transactions of its own, so a Hub fetch between ``get`` and ``put``
    holds no transaction open. Two requests fetching the same new model both store it; the second
    insert loses the race harmlessly."""

    def __init__(self, factory: sessionmaker[Session]) -> None:
        self.factory = factory

    def get(self, repo_id: str) -> HubModel | None:
        with unit_of_work(self.factory) as session:
            return DbCache(session).get(repo_id)

    def put(self, model: HubModel, endpoint: str) -> None:
        try:
            with unit_of_work(self.factory) as session:
                DbCache(session).put(model, endpoint)
        except IntegrityError:
            pass  # stored by a concurrent request
