"""A model's own ``tokenizer.json`` from the Hub, fetched beside its config.json and cached per model.

The data set check counts tokens with it (services/datacheck/tokens.py through the tokenizers package);
where it cannot be had (no model given, no tokenizer.json in the repo, gated, the Hub unreachable) the check
falls back to characters / 4 and the report says why. A bundled catalog name is looked up under its Hub id.
The cache is one file per model in ``GPUPLAN_HUB_CACHE_DIR`` (services/hub/service.py: default_cache_dir),
for the CLI and the workers alike: a tokenizer.json is megabytes (Llama 3's is 9 MB), too large for a row.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from huggingface_hub.errors import EntryNotFoundError

from services.core.db import utcnow
from services.core.errors import Unprocessable
from services.datacheck.tokens import ESTIMATE_SOURCE, TOKENIZER_METHOD, Counter, counter_from_json, make_counter
from services.estimator.errors import EstimatorError
from services.hub.client import _download
from services.hub.models import HubSettings, check_repo_id
from services.hub.service import _key, default_cache_dir, write_cache_file

TOKENIZER_FILE = "tokenizer.json"
# Llama 3's tokenizer.json is 9.1 MB, Gemma 3's 33 MB; none of the common ones is near this.
TOKENIZER_MAX_BYTES = 64 * 2**20


@dataclass(frozen=True)
class HubTokenizer:
    repo_id: str
    revision: str
    text: str  # the tokenizer.json as stored on the Hub
    origin: str  # "hub" (fetched now) or "cache"

    @property
    def source(self) -> str:
        return f"hub:{self.repo_id}"


def hub_repo_id(name: str) -> str:
    """The Hub id of a model name: a bundled catalog name (or alias) maps to its hf_id, else a Hub id."""
    from services.catalog.models import find_model

    try:
        return find_model(name).hf_id
    except EstimatorError:
        return check_repo_id(name)


class TokenizerCache:
    """One JSON file per model (``tokenizers/owner--name.json``), written atomically."""

    def __init__(self, folder: Path | None = None) -> None:
        self.folder = (folder or default_cache_dir()) / "tokenizers"

    def _path(self, repo_id: str) -> Path:
        return self.folder / (_key(repo_id).replace("/", "--") + ".json")

    def get(self, repo_id: str) -> HubTokenizer | None:
        try:
            data = json.loads(self._path(repo_id).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict) or not isinstance(data.get("tokenizer"), str):
            return None
        return HubTokenizer(str(data.get("repo_id")), str(data.get("revision")), data["tokenizer"], "cache")

    def put(self, tokenizer: HubTokenizer, endpoint: str) -> None:
        path = self._path(tokenizer.repo_id)
        record = {
            "repo_id": tokenizer.repo_id,
            "revision": tokenizer.revision,
            "endpoint": endpoint,
            "fetched_at": utcnow().isoformat(),
            "tokenizer": tokenizer.text,
        }
        write_cache_file(path, record)


def fetch_tokenizer(repo_id: str, settings: HubSettings | None = None) -> HubTokenizer:
    """The repo's tokenizer.json from the Hub (HF_ENDPOINT, HF_TOKEN), or a Hub error naming model."""
    settings = replace(settings or HubSettings(), max_file_bytes=TOKENIZER_MAX_BYTES)
    with tempfile.TemporaryDirectory(prefix="gpuplan-hub-") as tmp:
        try:
            revision, raw = _download(repo_id, TOKENIZER_FILE, None, settings, Path(tmp))
        except EntryNotFoundError:
            raise Unprocessable(f"{repo_id} on {settings.endpoint} has no tokenizer.json", field="model") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise Unprocessable(f"{repo_id}/tokenizer.json is not UTF-8 text", field="model") from None
    return HubTokenizer(repo_id, revision, text, "hub")


def model_tokenizer(
    name: str, cache: TokenizerCache | None = None, settings: HubSettings | None = None
) -> HubTokenizer | str:
    """The tokenizer of the model ``name``: from the cache, else the Hub (then cached); or, where it
    cannot be had, one line saying why (the check then estimates)."""
    cache = cache or TokenizerCache()
    try:
        repo_id = hub_repo_id(name)
    except (Unprocessable, EstimatorError) as exc:
        return str(getattr(exc, "message", exc))
    cached = cache.get(repo_id)
    if cached is not None:
        return cached
    settings = settings or HubSettings()
    try:
        tokenizer = fetch_tokenizer(repo_id, settings)
    except Unprocessable as exc:  # not found, gated, unreachable, too large
        return exc.message
    cache.put(tokenizer, settings.endpoint)
    return tokenizer


def model_counter(
    name: str, cache: TokenizerCache | None = None, settings: HubSettings | None = None
) -> tuple[tuple[Counter, str, tuple[str, ...]], dict[str, str]]:
    """The data set check's token counter for the model ``name`` and the report's ``tokenizer`` entry:
    the model's tokenizer.json through the tokenizers package, else characters / 4 with the reason."""
    found = model_tokenizer(name, cache, settings)
    if isinstance(found, str):
        reason = f"no tokenizer for model {name!r}: {found}"
    else:
        try:
            count, method, _ = counter_from_json(found.text, f"{found.source}@{found.revision[:12]}")
        except ValueError as exc:
            reason = f"the tokenizer.json of {found.repo_id} does not load: {exc}"
        else:
            if method == TOKENIZER_METHOD:
                notes = (f"exact counts from {found.repo_id}'s tokenizer.json (revision {found.revision[:12]})",)
                return (count, method, notes), {"source": found.source, "revision": found.revision}
            reason = "the tokenizers package is not installed"
    estimate = make_counter(None)
    note = f"{reason}; {estimate[2][0]}"
    return (estimate[0], estimate[1], (note,)), {"source": ESTIMATE_SOURCE, "model": name, "reason": reason}
