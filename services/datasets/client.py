"""Upload a data set file to a gpuplan service, resumably: the service says which parts it has, the
client sends the others (one part in memory at a time), then completes the upload."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

PART_ATTEMPTS = 4


class UploadError(Exception):
    """The service refused the upload, or could not be reached; the message says why."""


def _message(response: httpx.Response) -> str:
    try:
        body = response.json()
        return str(body.get("message") or body)
    except ValueError:
        return f"HTTP {response.status_code}"


def _check(response: httpx.Response) -> dict[str, Any]:
    if response.status_code >= 400:
        raise UploadError(_message(response))
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        # Another server on that address (an HTML page, a proxy's login form) answered: this was a traceback.
        kind = response.headers.get("content-type") or "no content type"
        raise UploadError(f"{response.url}: the answer ({kind}) is not a gpuplan service's; check --api")
    return body


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def upload_file(
    client: httpx.Client,
    path: Path,
    *,
    resume_id: str | None = None,
    data_country: str | None = None,
    model: str | None = None,
    started: Callable[[str], None] | None = None,
    sent: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Create (or resume) the upload of `path`, send the parts the service lacks, complete it; returns the
    data set as the service shows it. `started(id)` is called once the id is known; `sent(n, total)` per part."""
    size = path.stat().st_size
    if resume_id is not None:
        body = _check(client.get(f"/v1/datasets/{resume_id}"))
        if body["size_bytes"] != size:
            raise UploadError(f"--resume {resume_id}: that upload is {body['size_bytes']:,} bytes, {path} is {size:,}")
    else:
        fields: dict[str, Any] = {"name": path.name, "size_bytes": size, "sha256": file_sha256(path)}
        if data_country:
            fields["data_country"] = data_country
        if model:
            fields["model"] = model
        body = _check(client.post("/v1/datasets", json=fields))
    dataset_id = body["id"]
    if started is not None:
        started(dataset_id)
    if body["status"] != "uploading":
        return body
    upload = body["upload"]
    part_size, total = int(upload["part_size_bytes"]), int(upload["parts_total"])
    with path.open("rb") as handle:
        for number in upload["parts_missing"]:
            handle.seek((number - 1) * part_size)
            data = handle.read(part_size)
            for attempt in range(PART_ATTEMPTS):
                try:
                    _check(client.put(f"/v1/datasets/{dataset_id}/parts/{number}", content=data))
                    break
                except httpx.TransportError:
                    if attempt == PART_ATTEMPTS - 1:
                        raise
                    time.sleep(2**attempt)
            if sent is not None:
                sent(number, total)
    return _check(client.post(f"/v1/datasets/{dataset_id}/complete"))


def wait_for_check(client: httpx.Client, dataset_id: str, poll_s: float = 1.0) -> dict[str, Any]:
    while True:
        body = _check(client.get(f"/v1/datasets/{dataset_id}"))
        if body["status"] in ("done", "failed"):
            return body
        time.sleep(poll_s)
