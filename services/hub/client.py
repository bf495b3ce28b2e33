"""The one place gpuplan talks to the Hugging Face Hub (huggingface_hub over HTTP).

``fetch_model`` reads a repository's ``config.json`` and, where it exists, ``model.safetensors.index.json``
(its ``metadata.total_size`` is the stored checkpoint size; its weight names tell a quantized checkpoint);
without an index, one ``HEAD`` of ``model.safetensors`` gives the size. ``HF_TOKEN`` and ``HF_ENDPOINT`` are
read when a fetch starts, so a token or a mirror set after start-up is honoured. Every request has a timeout
and every file a size limit checked before it is downloaded.
"""

from __future__ import annotations

import importlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from services.hub.errors import HubFileInvalid, HubModelGated, HubModelNotFound, HubUnreachable
from services.hub.ids import is_hub_id

DEFAULT_ENDPOINT = "https://huggingface.co"
CONFIG_FILE = "config.json"
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
FIELD = "model.name"


@dataclass(frozen=True)
class Checkpoint:
    """What the Hub stores for the weights: bytes and the storage format read from the weight names."""

    stored_bytes: int | None
    dtype: str | None  # "bf16", "fp8", "mxfp4", "nf4/int8 (bitsandbytes)", "int4 (GPTQ/AWQ)", ...
    source: str  # which file told

    def as_dict(self) -> dict[str, Any]:
        return {"stored_bytes": self.stored_bytes, "dtype": self.dtype, "source": self.source}


@dataclass(frozen=True)
class HubModel:
    repo_id: str
    revision: str
    config: dict[str, Any]
    checkpoint: Checkpoint | None


@dataclass(frozen=True)
class HubSettings:
    timeout_s: float = 10.0
    max_file_bytes: int = 32 * 2**20  # DeepSeek-V3's index of 91,991 tensors is about 9 MB

    @classmethod
    def from_environment(cls) -> HubSettings:
        """GPUPLAN_HUB_TIMEOUT_S and GPUPLAN_HUB_MAX_FILE_BYTES (services/core/settings.py)."""
        from services.core.settings import Settings

        settings = Settings()
        return cls(timeout_s=settings.hub_timeout_s, max_file_bytes=settings.hub_max_file_bytes)

    @property
    def endpoint(self) -> str:
        return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")

    @property
    def token(self) -> str | None:
        return os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN") or None


def _transport_errors() -> tuple[type[BaseException], ...]:
    """Connection and timeout errors of the HTTP library huggingface_hub uses (httpx or its successor)."""
    found: list[type[BaseException]] = [OSError, TimeoutError]
    for module_name, attr in (
        ("httpx2", "TransportError"),
        ("httpx", "TransportError"),
        ("requests", "RequestException"),
    ):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        error = getattr(module, attr, None)
        if isinstance(error, type) and issubclass(error, BaseException):
            found.append(error)
    return tuple(found)


_TRANSPORT_ERRORS = _transport_errors()


def check_repo_id(name: str) -> str:
    """The name as a Hub repo id, or a 422 naming model.name."""
    repo_id = name.strip()
    if not is_hub_id(repo_id):
        raise HubModelNotFound(f"{name!r:.120} is not a Hugging Face model id (owner/name)", field=FIELD)
    return repo_id


def fetch_model(name: str, settings: HubSettings | None = None) -> HubModel:
    """config.json (required) and the checkpoint's stored size and format (best effort) of a Hub model."""
    settings = settings or HubSettings()
    repo_id = check_repo_id(name)
    with tempfile.TemporaryDirectory(prefix="gpuplan-hub-") as tmp:
        try:
            revision, raw = _download(repo_id, CONFIG_FILE, None, settings, Path(tmp))
        except EntryNotFoundError:
            raise HubModelNotFound(
                f"{repo_id} on {settings.endpoint} has no config.json (not a transformers model?); pass the config "
                "as model.config (or --config FILE)",
                field=FIELD,
            ) from None
        config = _json_object(raw, repo_id, CONFIG_FILE)
        checkpoint = _checkpoint(repo_id, revision, config, settings, Path(tmp))
    return HubModel(repo_id=repo_id, revision=revision, config=config, checkpoint=checkpoint)


def _download(repo_id: str, filename: str, revision: str | None, settings: HubSettings, tmp: Path) -> tuple[str, bytes]:
    """(commit, bytes) of one file; the size is checked on the HEAD answer before anything is downloaded."""
    endpoint, token = settings.endpoint, settings.token
    try:
        meta = get_hf_file_metadata(
            hf_hub_url(repo_id, filename, revision=revision, endpoint=endpoint),
            token=token or False,
            timeout=settings.timeout_s,
            endpoint=endpoint,
        )
        if meta.size is not None and meta.size > settings.max_file_bytes:
            raise HubFileInvalid(
                f"{repo_id}/{filename} is {meta.size:,} bytes, over the {settings.max_file_bytes:,}-byte limit",
                field=FIELD,
            )
        commit = meta.commit_hash or revision or "main"
        path = hf_hub_download(
            repo_id,
            filename,
            revision=commit,
            endpoint=endpoint,
            token=token or False,
            cache_dir=tmp,
            etag_timeout=settings.timeout_s,
        )
    except (HubFileInvalid, EntryNotFoundError):
        raise
    except GatedRepoError:
        raise HubModelGated(
            f"{repo_id} is gated on {endpoint}: "
            + (
                "the token in HF_TOKEN has not been granted access; accept the model's licence on its Hub page"
                if token
                else "set HF_TOKEN to a token of an account that accepted the model's licence"
            ),
            field=FIELD,
        ) from None
    except (RepositoryNotFoundError, RevisionNotFoundError):
        raise HubModelNotFound(
            f"{repo_id} was not found on {endpoint} (or is private: set HF_TOKEN); "
            "check the id, e.g. with `gpuplan models` for the bundled ones",
            field=FIELD,
        ) from None
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "?"
        raise HubUnreachable(
            f"the Hub at {endpoint} answered HTTP {status} for {repo_id}/{filename}; try again later", field=FIELD
        ) from None
    except _TRANSPORT_ERRORS as exc:
        raise HubUnreachable(
            f"could not reach the Hub at {endpoint} ({type(exc).__name__}, timeout {settings.timeout_s:g} s); "
            "check the network or HF_ENDPOINT, or pass the config as model.config (--config FILE)",
            field=FIELD,
        ) from None
    with open(path, "rb") as fh:
        data = fh.read(settings.max_file_bytes + 1)
    if len(data) > settings.max_file_bytes:
        raise HubFileInvalid(f"{repo_id}/{filename} is over the {settings.max_file_bytes:,}-byte limit", field=FIELD)
    return commit, data


MAX_JSON_DEPTH = 32  # real configs nest 3 deep (text_config.rope_scaling); anything deeper is not a config


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _storable(value: Any, depth: int = 0) -> bool:
    """JSON every database stores: finite numbers (no NaN/Infinity), no NUL characters, bounded nesting."""
    if depth > MAX_JSON_DEPTH:
        return False
    if isinstance(value, dict):
        return all("\x00" not in k and _storable(v, depth + 1) for k, v in value.items())
    if isinstance(value, list):
        return all(_storable(v, depth + 1) for v in value)
    if isinstance(value, str):
        return "\x00" not in value
    return True


def _json_object(raw: bytes, repo_id: str, filename: str) -> dict[str, Any]:
    try:
        value = json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        raise HubFileInvalid(f"{repo_id}/{filename} is not valid JSON", field=FIELD) from None
    if not isinstance(value, dict):
        raise HubFileInvalid(f"{repo_id}/{filename} is not a JSON object", field=FIELD)
    if not _storable(value):
        raise HubFileInvalid(
            f"{repo_id}/{filename} holds NUL characters or nests deeper than {MAX_JSON_DEPTH} levels", field=FIELD
        )
    return value


def _checkpoint(
    repo_id: str, revision: str, config: dict[str, Any], settings: HubSettings, tmp: Path
) -> Checkpoint | None:
    """The stored size from the safetensors index (or the single file's size); None where neither exists.

    Only config.json is required: a missing or unreadable index leaves the estimate unchanged."""
    try:
        _, raw = _download(repo_id, INDEX_FILE, revision, settings, tmp)
    except EntryNotFoundError:
        return _single_file(repo_id, revision, config, settings)
    except (HubFileInvalid, HubUnreachable):
        return None
    try:
        index = _json_object(raw, repo_id, INDEX_FILE)
    except HubFileInvalid:
        return None
    metadata = index.get("metadata") if isinstance(index.get("metadata"), dict) else {}
    total = metadata.get("total_size") if isinstance(metadata, dict) else None
    names = index.get("weight_map") if isinstance(index.get("weight_map"), dict) else {}
    return Checkpoint(
        stored_bytes=int(total)
        if isinstance(total, int | float) and not isinstance(total, bool) and total >= 0
        else None,
        dtype=stored_format(list(names or ()), config),
        source=INDEX_FILE,
    )


def _single_file(repo_id: str, revision: str, config: dict[str, Any], settings: HubSettings) -> Checkpoint | None:
    try:
        meta = get_hf_file_metadata(
            hf_hub_url(repo_id, SINGLE_FILE, revision=revision, endpoint=settings.endpoint),
            token=settings.token or False,
            timeout=settings.timeout_s,
            endpoint=settings.endpoint,
        )
    except HfHubHTTPError:
        return None
    except _TRANSPORT_ERRORS:
        return None
    return Checkpoint(stored_bytes=meta.size, dtype=stored_format([], config), source=SINGLE_FILE)


def stored_format(weight_names: list[str], config: dict[str, Any]) -> str | None:
    """The checkpoint's storage format from its tensor names (and the config's quantization_config):
    MXFP4 stores ``*_blocks`` + ``*_scales`` (gpt-oss), block-scaled FP8 ``*.weight_scale_inv``
    (DeepSeek-V3), bitsandbytes ``*.absmax`` / ``*.quant_state.*``, GPTQ/AWQ ``*.qweight`` + ``*.qzeros``;
    otherwise the config's ``torch_dtype`` (or ``dtype``)."""
    quant = config.get("quantization_config")
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    if method == "mxfp4" or any(n.endswith("_blocks") for n in weight_names):
        return "mxfp4"
    if method == "fp8" or any(n.endswith("weight_scale_inv") for n in weight_names):
        return "fp8"
    if method == "bitsandbytes" or any(".absmax" in n or ".quant_state." in n for n in weight_names):
        return "bitsandbytes"
    if method in ("gptq", "awq") or any(n.endswith(".qweight") for n in weight_names):
        return f"int4 ({method or 'GPTQ/AWQ'})"
    dtype = config.get("torch_dtype") or config.get("dtype")
    if isinstance(dtype, str):
        return {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(dtype, dtype[:20])
    return None
