"""The one place gpuplan talks to the Hugging Face Hub (huggingface_hub over HTTP).

``fetch_model`` reads a repository's ``config.json`` and, where it exists, ``model.safetensors.index.json``
(its ``metadata.total_size`` is the stored checkpoint size); without an index, one ``HEAD`` of
``model.safetensors`` gives the size. The element counts per dtype come from the safetensors headers
(``get_safetensors_metadata``: a range request per shard, never the weights), so a mixed FP8/MXFP4 + BF16
checkpoint is sized exactly; where the headers cannot be read, the weight names tell the format.
``HF_TOKEN`` and ``HF_ENDPOINT`` are read when a fetch starts, so a token or a mirror set after start-up is
honoured. Every request has a timeout and every file a size limit checked before it is downloaded.
"""

from __future__ import annotations

import importlib
import json
import tempfile
from pathlib import Path
from typing import Any

from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_download, hf_hub_url
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    NotASafetensorsRepoError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
    SafetensorsParsingError,
)

from services.hub.errors import HubFileInvalid, HubModelGated, HubModelNotFound, HubUnreachable
from services.hub.models import FIELD, Checkpoint, HubModel, HubSettings, check_repo_id

CONFIG_FILE = "config.json"
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


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
    guessed = Checkpoint(
        stored_bytes=int(total)
        if isinstance(total, int | float) and not isinstance(total, bool) and total >= 0
        else None,
        dtype=stored_format(list(names or ()), config),
        source=INDEX_FILE,
    )
    return _with_headers(guessed, repo_id, revision, config, settings)


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
    guessed = Checkpoint(stored_bytes=meta.size, dtype=stored_format([], config), source=SINGLE_FILE)
    return _with_headers(guessed, repo_id, revision, config, settings)


# Bits per element of each safetensors dtype (safetensors' Dtype::bitsize, safetensors/src/tensor.rs).
DTYPE_BITS = {
    "BOOL": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "F64": 64,
    "I64": 64,
    "U64": 64,
}
HEADERS_SOURCE = "safetensors headers"
# No safetensors, an unreadable header (a shape that is not a list of ints), refused or unreachable: the guess.
_HEADER_ERRORS: tuple[type[BaseException], ...] = (
    NotASafetensorsRepoError,
    SafetensorsParsingError,
    HfHubHTTPError,
    ValueError,
    TypeError,
    *_TRANSPORT_ERRORS,
)


def _with_headers(
    guessed: Checkpoint, repo_id: str, revision: str, config: dict[str, Any], settings: HubSettings
) -> Checkpoint:
    """The checkpoint with exact element counts per dtype from every shard's safetensors header
    (huggingface_hub's get_safetensors_metadata: one HEAD, then a range GET of each shard's first 100 kB);
    the guess from the weight names where the headers cannot be read."""
    api = HfApi(endpoint=settings.endpoint, token=settings.token or False)
    try:
        found = api.get_safetensors_metadata(
            repo_id, revision=revision, token=settings.token or False, timeout=settings.timeout_s
        )
    except _HEADER_ERRORS:
        return guessed
    counts: dict[str, int] = {str(dtype): int(n) for dtype, n in sorted(found.parameter_count.items())}
    if not counts:
        return guessed
    tensor_bytes = sum(n * DTYPE_BITS.get(dtype, 16) // 8 for dtype, n in counts.items())
    return Checkpoint(
        stored_bytes=guessed.stored_bytes if guessed.stored_bytes else tensor_bytes,
        dtype=mixed_format(list(found.weight_map), counts, config),
        source=HEADERS_SOURCE,
        parameters_by_dtype=counts,
        tensor_bytes=tensor_bytes,
    )


_DTYPE_NAMES = {"BF16": "bf16", "F16": "fp16", "F32": "fp32", "F8_E4M3": "fp8", "F8_E5M2": "fp8", "F4": "fp4"}


def mixed_format(weight_names: list[str], counts: dict[str, int], config: dict[str, Any]) -> str | None:
    """The storage format of a checkpoint whose element counts per dtype are known: the quantized format
    (from the names, as stored_format) and every float dtype beside it, largest share first, e.g.
    "mxfp4 + bf16" (gpt-oss: U8 blocks and scales, BF16 attention) or "fp8 + bf16 + fp32" (DeepSeek-V3)."""
    base = stored_format(weight_names, config)
    floats = [_DTYPE_NAMES[d] for d, _ in sorted(counts.items(), key=lambda kv: -kv[1]) if d in _DTYPE_NAMES]
    parts: list[str] = []
    if base is not None and base not in ("bf16", "fp16", "fp32"):  # quantized: named first
        parts.append(base)
    for name in floats:
        if name not in parts:
            parts.append(name)
    return " + ".join(parts) or base


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
