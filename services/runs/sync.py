"""Checkpoint sync to S3-compatible storage: the node side (boto3 and the local disk).

A sync pass uploads every complete checkpoint directory that is not durable yet, oldest first. Complete
means its framework says so (services/runs/complete.py: trainer_state.json, DeepSpeed's ``latest``,
torchtune's recipe state, LitGPT's yaml files, or a ``.complete`` marker), never that it went quiet;
the settle time is an extra guard on top. Until then the checkpoint is in progress: not uploaded as
durable, not reported, and counted by ``pending_steps`` (the heartbeat's unsynced count). Then:

1. each file: hashed once (SHA-256 for the manifest, MD5 per part for the store's own check), then
   sent whole (small files) or as a multipart upload (large ones), each request carrying Content-MD5
   so the store rejects corrupted bytes; the finished object's ETag is compared with the local MD5s;
2. the manifest, written last: until it exists, the checkpoint is not durable and never restored;
3. the control plane is told (it records the last durable step) and answers which old checkpoints
   retention lets go; those are deleted from the bucket, manifest first.

Resumption needs no local state: the bucket is the truth. A file already in the bucket with the same
size and SHA-256 is skipped; an interrupted multipart upload is found with ListMultipartUploads and its
finished parts (ListParts, checked against the local part MD5s) are not sent again. Nothing local is
ever deleted. boto3 retries 5xx and connection errors with backoff (services/storage/s3.py).

The manifest is written only if no file of the directory changed (size, mtime) while it was being
uploaded and it is still complete: a trainer rewriting the directory mid-upload would otherwise give a
manifest mixing two saves. A file whose sent bytes are not the ones hashed (``FileChanged``) leaves only its
own step in progress; the pass goes on to the other steps. A durable step whose local files change later
(found cheaply: the file set, sizes, and mtimes after the manifest's ``created_at``, then a re-hash) is reported in
``SyncResult.changed`` and logged, and never uploaded again: its objects are not overwritten. The
bucket holds a copy verified complete against its manifest; overwriting it would leave the bucket
disagreeing with that manifest while it happens, the control plane refuses other files at a durable
step (409), and if the change is damage (a crashed rewrite, a bad disk) it would replace the good copy
with a broken one. The next complete checkpoint carries training on (the agent counts such a step as
unsynced and reports it, services.agent.node.RunSync).

Two agents may sync one run: an upload never writes into a step the other made durable (the manifest is
looked for before each file and created only where none exists), and an interrupted upload is cleaned up as
an orphan only after ORPHAN_QUIET_S without a write. A directory that loses a file after it was first seen
complete is being deleted, and is never made durable by this process.

A complete checkpoint the bucket or its manifest cannot hold as it is (a file name with a control character or not
in UTF-8, a key over S3's length, a step past the service's) is refused before a byte is sent
(``SyncResult.refused``), and the pass goes on: one such folder must not keep every newer checkpoint from the bucket.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import logging
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from pydantic import ValidationError

from services.core.json_limits import INT32_MAX
from services.runs.complete import METRIC_FILE, OWN_FILES, checkpoint_files, completeness
from services.runs.manifest import (
    BESIDE_PREFIX,
    MANIFEST_NAME,
    Manifest,
    ManifestFile,
    etag_matches,
    step_from_key,
    step_of,
    step_prefix,
)

log = logging.getLogger("gpuplan.sync")


def _in_result(name: str) -> dict[str, str]:
    """A log record's ``extra``: what it says is also in this SyncResult field, which a caller reporting the result
    itself (`gpuplan sync`, the agent) leaves out of its log (services/cli/common.py command_log)."""
    return {"sync_result": name}


MiB = 2**20
MAX_PARTS = 10_000
# An unfinished upload's prefix is deleted as an orphan only when none of its objects changed for this long, in
# seconds: a prefix written to lately may be another agent's upload in progress (two agents can share a run).
ORPHAN_QUIET_S = 3600.0
# S3's longest object key, in UTF-8 bytes (docs.aws.amazon.com/AmazonS3/latest/userguide/object-keys.html).
MAX_KEY_BYTES = 1024


@dataclass(frozen=True)
class SyncOptions:
    part_size: int = 64 * MiB  # S3 allows 5 MiB to 5 GiB per part, at most 10,000 parts
    multipart_threshold: int = 64 * MiB
    settle_s: float = 60.0  # a directory whose newest file is younger than this may still be written
    concurrency: int = 4  # parts in flight per file


@dataclass
class FileUpload:
    path: str
    size: int
    sha256: str
    skipped: bool = False  # already in the bucket, verified
    parts_sent: list[int] = field(default_factory=list)
    parts_reused: list[int] = field(default_factory=list)
    bytes_sent: int = 0


@dataclass
class CheckpointUpload:
    manifest: Manifest
    files: list[FileUpload]
    seconds: float

    @property
    def bytes_sent(self) -> int:
        return sum(f.bytes_sent for f in self.files)


class ControlPlane(Protocol):
    """What a sync pass needs from the API (services/runs/client.py talks HTTP; tests may use it too)."""

    def done_steps(self) -> tuple[set[int], set[int]]:
        """(durable steps, steps retention deleted): neither is uploaded again."""
        ...

    def report_durable(self, manifest: Manifest, upload_bytes_per_s: float | None) -> list[int]: ...

    def report_deleted(self, step: int) -> None: ...

    def durable_manifest(self, step: int) -> Manifest | None:
        """The manifest the API recorded for a durable step (None: none), what the bucket must hold for it."""
        ...


class BucketOnly:
    """A control plane stand-in for when the API is unreachable (the node-side guard's final sync):
    durable steps are those with a manifest in the bucket; nothing is deleted; the API learns about
    the new checkpoints at the next pass that reaches it (sync_pass re-reports bucket manifests)."""

    def __init__(self, s3: Any, bucket: str, run_prefix: str) -> None:
        self._s3, self._bucket, self._prefix = s3, bucket, run_prefix

    def done_steps(self) -> tuple[set[int], set[int]]:
        # A manifest there, readable or not (one read here that failed to parse failed the whole pass): the pass says
        # a damaged one's step as lost and syncs the others, and `restore --from-bucket` names it when it is the newest.
        stored = stored_steps(self._s3, self._bucket, self._prefix)
        return {s for s in stored if _head(self._s3, self._bucket, _manifest_key(self._prefix, s)) is not None}, set()

    def report_durable(self, manifest: Manifest, upload_bytes_per_s: float | None) -> list[int]:
        return []

    def report_deleted(self, step: int) -> None:
        return None

    def durable_manifest(self, step: int) -> Manifest | None:
        return read_manifest(self._s3, self._bucket, self._prefix, step)


@dataclass
class SyncResult:
    uploaded: list[CheckpointUpload] = field(default_factory=list)
    already_durable: list[int] = field(default_factory=list)
    superseded: list[int] = field(default_factory=list)  # older than a durable one, never uploaded
    unsettled: list[int] = field(default_factory=list)
    deleted: list[int] = field(default_factory=list)
    in_progress: dict[int, str] = field(default_factory=dict)  # not complete yet: step -> what it waits for
    changed: dict[int, list[str]] = field(default_factory=dict)  # durable, but these local files changed since
    repaired: dict[int, list[str]] = field(default_factory=dict)  # durable, these lost objects put back from local
    # Durable, but the bucket lost objects no local copy restores; or a step whose manifest in the bucket is damaged.
    # Never also in already_durable: nothing restores such a step as it is.
    lost: dict[int, str] = field(default_factory=dict)
    refused: dict[int, str] = field(default_factory=dict)  # complete, but not storable as it is (a file name, its step)


class CheckpointChanged(Exception):
    """A directory changed (or stopped being complete) while it was uploaded: no manifest was written."""


class DurableElsewhere(CheckpointChanged):
    """Another writer (a second agent of the run) made the step durable first: nothing of it was overwritten."""


class SyncError(Exception):
    """A checkpoint could not be made durable; nothing was lost, the next pass resumes."""


class FileChanged(CheckpointChanged, SyncError):
    """A file's bytes changed between its hashing and the store's check of what was sent: its step is left in
    progress (the next pass hashes the file anew) and the pass goes on to the other steps."""


class UnreadableManifest(SyncError):
    """A step's manifest in the bucket does not parse (cut short, damaged): nothing of that step can be verified."""


class Unstorable(SyncError):
    """A complete checkpoint that the bucket or its manifest cannot hold as it is (a file name, or its step): nothing of
    it is sent, and the pass goes on to newer checkpoints, which carry training on."""


# Per checkpoint directory (its path and inode: a directory made anew starts afresh), the files it held when first
# seen complete. A directory that has lost one since is being deleted (a trainer's rotation removing it file by
# file, or an upload that found a file gone): never made durable by this process, whatever its marker says.
_COMPLETE_FILES: dict[tuple[str, int], set[str]] = {}
_COMPLETE_LOCK = threading.Lock()


def _directory_key(directory: Path) -> tuple[str, int]:
    return str(directory.resolve()), directory.stat().st_ino


def _shrinking(directory: Path, gone: set[str] | None = None) -> list[str]:
    """Files a complete-looking directory lost since this process first saw it complete (``gone``: files known to
    have vanished), recording its present files; empty while it only grows."""
    try:
        key = _directory_key(directory)
        present = {p.relative_to(directory).as_posix() for p in checkpoint_files(directory)}
    except OSError:
        return sorted(gone or ())
    with _COMPLETE_LOCK:
        seen = _COMPLETE_FILES.setdefault(key, set(present))
        seen.update(gone or ())
        missing = sorted(seen - present)
        seen.update(present)
    return missing


def _md5_b64(data: bytes) -> str:
    return base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode()


def checkpoint_dirs(root: Path) -> list[tuple[int, Path]]:
    """(step, directory) of every checkpoint directory under ``root``, oldest step first."""
    if not root.is_dir():
        raise SyncError(f"checkpoint directory {root} does not exist")
    found = [(step, p) for p in root.iterdir() if p.is_dir() and (step := step_of(p.name)) is not None]
    return sorted(found)


def _snapshot(directory: Path) -> dict[str, tuple[int, int]]:
    """(size, mtime) of every file, by relative path: what "unchanged" is checked against."""
    out = {}
    for path in checkpoint_files(directory):
        try:
            stat = path.stat()
        except FileNotFoundError:
            continue  # removed since the listing: the snapshots differ, so nothing is made durable
        out[path.relative_to(directory).as_posix()] = (stat.st_size, stat.st_mtime_ns)
    return out


def _beside_snapshot(root: Path, paths: list[Path]) -> dict[str, tuple[int, int]]:
    """(size, mtime) of the files beside the checkpoint, keyed apart from its own files ("../...")."""
    out = {}
    for path in paths:
        try:
            stat = path.stat()
        except OSError:
            continue  # removed: the snapshots differ, so nothing is made durable
        out["../" + path.relative_to(root).as_posix()] = (stat.st_size, stat.st_mtime_ns)
    return out


def settled(directory: Path, settle_s: float, now: float | None = None) -> bool:
    """Whether nothing in the directory changed for ``settle_s`` seconds (the trainer is done with it)."""
    now = time.time() if now is None else now
    newest = max((p.stat().st_mtime for p in [directory, *checkpoint_files(directory)]), default=0.0)
    return now - newest >= settle_s


def wait_settled(root: Path, steps: list[int], settle_s: float) -> bool:
    """Wait, at most ``settle_s``, until the checkpoint folders of ``steps`` under ``root`` have settled (False: they
    had not by then): a final pass (the agent's on its way out, ``gpuplan sync --final`` after training) makes them
    durable instead of skipping them as still being written."""
    folders = dict(checkpoint_dirs(root))
    deadline = time.monotonic() + settle_s
    while not all(step not in folders or settled(folders[step], settle_s) for step in steps):
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(0.5, left))
    return True


# The agent is long-lived and a checkpoint does not change once settled: a pass that resumes after an
# interruption reuses the hashes of the pass before instead of reading many GB again.
_HASHES: dict[tuple[str, int, int, int], tuple[str, str, list[bytes]]] = {}
_HASHES_LOCK = threading.Lock()


def _hash_file(path: Path, part_size: int) -> tuple[str, str, list[bytes]]:
    """SHA-256 of the whole file, MD5 of the whole file, and the MD5 of each part-size chunk."""
    stat = path.stat()
    cache_key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns, part_size)
    with _HASHES_LOCK:
        if cache_key in _HASHES:
            return _HASHES[cache_key]
    sha, md5, parts = hashlib.sha256(), hashlib.md5(usedforsecurity=False), []
    with path.open("rb") as fh:
        while chunk := fh.read(part_size):
            sha.update(chunk)
            md5.update(chunk)
            parts.append(hashlib.md5(chunk, usedforsecurity=False).digest())
    hashed = (sha.hexdigest(), md5.hexdigest(), parts)
    with _HASHES_LOCK:
        if len(_HASHES) > 10_000:
            _HASHES.clear()
        _HASHES[cache_key] = hashed
    return hashed


def _read_part(path: Path, number: int, part_size: int) -> bytes:
    with path.open("rb") as fh:
        fh.seek((number - 1) * part_size)
        return fh.read(part_size)


def _head(s3: Any, bucket: str, key: str) -> dict[str, Any] | None:
    from botocore.exceptions import ClientError

    try:
        return dict(s3.head_object(Bucket=bucket, Key=key))
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return None
        raise


def _already_there(head: dict[str, Any] | None, size: int, sha: str, md5: str, parts: list[bytes]) -> bool:
    if head is None or int(head.get("ContentLength", -1)) != size:
        return False
    if head.get("Metadata", {}).get("sha256") not in (None, sha):
        return False
    proven = etag_matches(str(head.get("ETag", "")), md5, parts)
    return bool(proven) or (proven is None and head.get("Metadata", {}).get("sha256") == sha)


def _verify(s3: Any, bucket: str, key: str, size: int, sha: str, md5: str, parts: list[bytes]) -> None:
    if not _already_there(_head(s3, bucket, key), size, sha, md5, parts):
        raise SyncError(f"s3://{bucket}/{key}: the stored object does not match the local file")


def _existing_upload(s3: Any, bucket: str, key: str) -> str | None:
    """The newest unfinished multipart upload of ``key``; older ones are aborted."""
    uploads = [u for u in s3.list_multipart_uploads(Bucket=bucket, Prefix=key).get("Uploads", []) if u["Key"] == key]
    uploads.sort(key=lambda u: u["Initiated"])
    for stale in uploads[:-1]:
        s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=stale["UploadId"])
    return str(uploads[-1]["UploadId"]) if uploads else None


def _listed_parts(s3: Any, bucket: str, key: str, upload_id: str) -> dict[int, dict[str, Any]]:
    parts: dict[int, dict[str, Any]] = {}
    marker = 0
    while True:
        page = s3.list_parts(Bucket=bucket, Key=key, UploadId=upload_id, PartNumberMarker=marker)
        for part in page.get("Parts", []):
            parts[int(part["PartNumber"])] = part
        if not page.get("IsTruncated"):
            return parts
        marker = int(page["NextPartNumberMarker"])


def _upload_multipart(
    s3: Any, bucket: str, key: str, path: Path, sha: str, parts: list[bytes], options: SyncOptions, result: FileUpload
) -> None:
    upload_id = _existing_upload(s3, bucket, key)
    done: dict[int, str] = {}
    if upload_id is not None:
        for number, part in _listed_parts(s3, bucket, key, upload_id).items():
            # A part counts only if it is the part this file would send: same number, size and MD5.
            expected = min(options.part_size, result.size - (number - 1) * options.part_size)
            etag = str(part["ETag"]).strip('"')
            if number <= len(parts) and int(part["Size"]) == expected and etag == parts[number - 1].hex():
                done[number] = etag
            else:
                # Begun for other bytes (the file was rewritten since, or another part size): its SHA-256 metadata,
                # set when it began, is the other version's, and the finished object would fail its check.
                s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
                upload_id, done = None, {}
                break
    if upload_id is None:
        upload_id = str(s3.create_multipart_upload(Bucket=bucket, Key=key, Metadata={"sha256": sha})["UploadId"])

    def send(number: int) -> tuple[int, str, int]:
        body = _read_part(path, number, options.part_size)
        response = s3.upload_part(
            Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=body, ContentMD5=_md5_b64(body)
        )
        return number, str(response["ETag"]).strip('"'), len(body)

    missing = [n for n in range(1, len(parts) + 1) if n not in done]
    result.parts_reused = sorted(done)
    pool = ThreadPoolExecutor(max_workers=max(1, options.concurrency))
    try:
        for future in as_completed([pool.submit(send, n) for n in missing]):
            number, etag, sent = future.result()
            done[number] = etag
            result.parts_sent.append(number)
            result.bytes_sent += sent
    finally:
        # On a failure, parts not started yet are not started: the next pass resumes from the bucket.
        pool.shutdown(wait=True, cancel_futures=True)
    s3.complete_multipart_upload(
        Bucket=bucket,
        Key=key,
        UploadId=upload_id,
        MultipartUpload={"Parts": [{"PartNumber": n, "ETag": f'"{done[n]}"'} for n in sorted(done)]},
    )


def upload_file(s3: Any, bucket: str, key: str, path: Path, options: SyncOptions) -> FileUpload:
    from botocore.exceptions import ClientError

    stat = path.stat()
    size = stat.st_size
    multipart = size > options.multipart_threshold
    # S3 allows 10,000 parts: a file too large for the configured part size gets larger parts (the
    # same size on every pass, so a resumed upload still matches its parts).
    part_size = max(options.part_size, -(-size // MAX_PARTS)) if multipart else max(size, 1)
    options = replace(options, part_size=part_size)
    sha, md5, parts = _hash_file(path, part_size)
    result = FileUpload(path=key, size=size, sha256=sha)
    if _already_there(_head(s3, bucket, key), size, sha, md5, parts):
        result.skipped = True
        return result
    try:
        if multipart:
            _upload_multipart(s3, bucket, key, path, sha, parts, options, result)
        else:
            body = path.read_bytes()
            s3.put_object(Bucket=bucket, Key=key, Body=body, ContentMD5=_md5_b64(body), Metadata={"sha256": sha})
            result.bytes_sent = size
        _verify(s3, bucket, key, size, sha, md5, parts)
    except SyncError:
        # The bytes sent are not the ones hashed: the file changed mid-upload, or under a size and mtime put back (a
        # copy that keeps timestamps, say). Hashed anew on the next pass instead of failing every pass until the agent
        # restarts; a file that changed fails only its own step (FileChanged), not the whole pass.
        _forget_hashes(path)
        if _differs(path, size, sha):
            raise FileChanged(f"{path.name} changed while it was uploaded; not made durable") from None
        raise
    except ClientError:
        # The store refused what was sent (a part cut short by a truncated file: EntityTooSmall): a change seen in
        # the file's size or mtime is the step's failure; anything else is the store's, for the caller.
        if _stat_changed(path, stat.st_size, stat.st_mtime_ns):
            _forget_hashes(path)
            raise FileChanged(f"{path.name} changed while it was uploaded; not made durable") from None
        raise
    return result


# Both raise FileNotFoundError for a file deleted meanwhile: the caller's sign of a directory being rotated away.
def _stat_changed(path: Path, size: int, mtime_ns: int) -> bool:
    now = path.stat()
    return (now.st_size, now.st_mtime_ns) != (size, mtime_ns)


def _differs(path: Path, size: int, sha: str) -> bool:
    """Whether the file no longer holds the bytes hashed as ``sha``: read anew, past every cache."""
    if path.stat().st_size != size:
        return True
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(8 * MiB):
            digest.update(chunk)
    return digest.hexdigest() != sha


def _forget_hashes(path: Path) -> None:
    resolved = str(path.resolve())
    with _HASHES_LOCK:
        for cache_key in [k for k in _HASHES if k[0] == resolved]:
            del _HASHES[cache_key]


def read_metric(directory: Path, step: int) -> float | None:
    """The evaluation metric saved with a checkpoint: ``gpuplan_metric.json`` ({"metric": x}) if the
    training script writes one, else the ``eval_loss`` transformers' ``trainer_state.json`` logged at this very step.
    An earlier evaluation's is not this checkpoint's: with saves more frequent than evaluations, a later checkpoint
    inherited the best loss, ranked best on the tie, and retention deleted the checkpoint evaluated (a probe)."""
    explicit = directory / METRIC_FILE
    value: object = None
    try:
        if explicit.is_file():
            value = json.loads(explicit.read_text())["metric"]
        elif (state := directory / "trainer_state.json").is_file():
            history = json.loads(state.read_text()).get("log_history", [])
            losses = [e["eval_loss"] for e in history if "eval_loss" in e and int(e.get("step", -1)) == step]
            value = losses[-1] if losses else None
    except (ValueError, KeyError, TypeError, OSError, AttributeError):
        log.warning("unreadable metric in %s; the checkpoint is kept without one", directory)
        return None
    if value is None:
        return None
    # A diverged run's NaN loss (Python's json reads NaN and Infinity) ranks nothing, and the manifest's JSON would
    # store it as null, unlike the one written; a bool is no measurement.
    try:
        number = math.nan if isinstance(value, bool) else float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        number = math.nan
    if math.isfinite(number):
        return number
    log.warning("metric %r in %s is not a finite number; the checkpoint is kept without one", value, directory)
    return None


def upload_checkpoint(
    s3: Any,
    bucket: str,
    run_prefix: str,
    run_id: str,
    directory: Path,
    step: int,
    options: SyncOptions,
    *,
    final: bool = False,
    before_manifest: Callable[[], None] | None = None,
) -> CheckpointUpload:
    started = time.monotonic()
    base = step_prefix(run_prefix, step)
    uploads: list[FileUpload] = []
    beside_uploads: list[FileUpload] = []
    root = directory.parent
    beside = [root / relative for relative in completeness(directory, step).beside]
    before = _snapshot(directory) | _beside_snapshot(root, beside)  # taken before any file is hashed
    sending = [(path, path.relative_to(directory).as_posix(), uploads) for path in checkpoint_files(directory)]
    sending += [(path, path.relative_to(root).as_posix(), beside_uploads) for path in beside]
    keys = [
        f"{base}/{relative}" if into is uploads else f"{base}/{BESIDE_PREFIX}/{relative}"
        for _, relative, into in sending
    ]
    problem = _unstorable(
        run_id,
        directory.name,
        step,
        [(rel, key, into is uploads) for (_, rel, into), key in zip(sending, keys, strict=True)],
    )
    if problem is not None:
        raise Unstorable(problem)
    for (path, relative, into), key in zip(sending, keys, strict=True):
        # Another agent of the run may have made this step durable meanwhile: its objects are never overwritten
        # (one HEAD before each file, as many as the resumption's own).
        if _head(s3, bucket, f"{base}/{MANIFEST_NAME}") is not None:
            raise DurableElsewhere("made durable by another writer while this one uploaded; its objects are kept")
        try:
            upload = upload_file(s3, bucket, key, path, options)
        except FileNotFoundError:  # deleted mid-upload: the trainer's rotation removing the directory, say
            if into is uploads:  # a file beside it (torchtune's recipe state) is rewritten by the next save instead
                _shrinking(directory, {relative})
            raise CheckpointChanged(f"{relative} vanished while it was uploaded; not made durable") from None
        except FileChanged:
            raise FileChanged(f"{relative} changed while it was uploaded; not made durable") from None
        upload.path = relative
        into.append(upload)
    if not uploads:
        raise SyncError(f"{directory} is empty")
    manifest = Manifest(
        run_id=run_id,
        step=step,
        dir_name=directory.name,
        files=tuple(ManifestFile(path=u.path, size=u.size, sha256=u.sha256) for u in uploads),
        beside=tuple(ManifestFile(path=u.path, size=u.size, sha256=u.sha256) for u in beside_uploads),
        metric=read_metric(directory, step),
        final=final,
        created_at=datetime.now(UTC),
    )
    if before_manifest is not None:
        before_manifest()  # failure injection: a crash (or a write) between the data and the manifest
    after = _snapshot(directory) | _beside_snapshot(root, beside)
    if after != before:
        moved = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        raise CheckpointChanged(f"changed while it was uploaded ({', '.join(moved[:5])}); not made durable")
    state = completeness(directory, step)
    if not state.complete:
        raise CheckpointChanged(f"no longer complete after the upload ({state.reason}); not made durable")
    write_manifest(s3, bucket, run_prefix, manifest, create=True)
    return CheckpointUpload(manifest=manifest, files=uploads, seconds=time.monotonic() - started)


_NO_SHA = "0" * 64


def _unstorable(run_id: str, dir_name: str, step: int, files: list[tuple[str, str, bool]]) -> str | None:
    """Why a complete checkpoint cannot be stored as it is (None: it can), before a byte is sent: a file name that is
    not UTF-8 or holds a control character, an object key over S3's length, a step or a file count its manifest
    cannot hold. ``files``: (relative path, object key, whether it is the checkpoint's own file) of each file."""
    if step > INT32_MAX:
        return f"step {step} is past the largest step the service records ({INT32_MAX}); rename the folder"
    entries = []
    for relative, key, own in files:
        if own and (relative == MANIFEST_NAME or relative.split("/", 1)[0] == BESIDE_PREFIX):
            return f"{relative!r}: a checkpoint may not hold {MANIFEST_NAME} or {BESIDE_PREFIX}/ at its top"
        try:
            key_bytes = len(key.encode())
        except UnicodeEncodeError:
            return f"{relative!r}: the file name is not UTF-8, which an object key must be; rename it"
        if key_bytes > MAX_KEY_BYTES:
            return f"{relative[:80]!r}...: its object key is {key_bytes} bytes, over S3's {MAX_KEY_BYTES}; shorten it"
        try:
            entry = ManifestFile(path=relative, size=0, sha256=_NO_SHA)
        except ValidationError as exc:
            return f"{relative!r}: {exc.errors()[0]['msg'].removeprefix('Value error, ')}; rename it"
        if own:
            entries.append(entry)
    try:
        Manifest(run_id=run_id, step=step, dir_name=dir_name, files=tuple(entries), created_at=datetime.now(UTC))
    except ValidationError as exc:
        error = exc.errors()[0]
        return f"its manifest cannot hold it ({'.'.join(map(str, error['loc']))}: {error['msg']})"
    return None


def write_manifest(s3: Any, bucket: str, run_prefix: str, manifest: Manifest, *, create: bool = False) -> None:
    """Write a checkpoint's manifest (what makes it durable) and read it back. ``create``: only where the step has
    none yet (S3's conditional write, If-None-Match: *), so of two agents racing to one step the first one's stands;
    a store without conditional writes answers NotImplemented and gets a plain write."""
    from botocore.exceptions import ClientError

    body = manifest.model_dump_json(indent=1).encode()
    key = f"{step_prefix(run_prefix, manifest.step)}/{MANIFEST_NAME}"
    try:
        if create:
            s3.put_object(Bucket=bucket, Key=key, Body=body, ContentMD5=_md5_b64(body), IfNoneMatch="*")
        else:
            s3.put_object(Bucket=bucket, Key=key, Body=body, ContentMD5=_md5_b64(body))
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code")
        if create and code in ("PreconditionFailed", "412", "ConditionalRequestConflict"):
            # boto3's retry of this very write, whose first answer was lost after the store carried it out, meets its
            # own manifest (the same bytes, created_at included): written, not another writer's.
            if read_manifest(s3, bucket, run_prefix, manifest.step) == manifest:
                return
            raise DurableElsewhere("made durable by another writer first; its manifest is kept") from None
        if not (create and code in ("NotImplemented", "501")):
            raise
        s3.put_object(Bucket=bucket, Key=key, Body=body, ContentMD5=_md5_b64(body))
    if read_manifest(s3, bucket, run_prefix, manifest.step) != manifest:
        raise SyncError(f"step {manifest.step}: the manifest read back differs from the one written")


def _manifest_key(run_prefix: str, step: int) -> str:
    return f"{step_prefix(run_prefix, step)}/{MANIFEST_NAME}"


def read_manifest(s3: Any, bucket: str, run_prefix: str, step: int) -> Manifest | None:
    from botocore.exceptions import ClientError

    try:
        body = s3.get_object(Bucket=bucket, Key=_manifest_key(run_prefix, step))["Body"].read()
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return None
        raise
    try:
        return Manifest.model_validate_json(body)
    except ValidationError as exc:
        # Cut short or damaged in the bucket: a line naming the step for `gpuplan restore` and `sync`, not a traceback.
        raise UnreadableManifest(
            f"step {step}: s3://{bucket}/{step_prefix(run_prefix, step)}/{MANIFEST_NAME} is not a readable manifest "
            f"({exc.errors()[0]['msg'][:120]}); this step cannot be restored as it is"
        ) from None


# The manifests of durable steps this process compared local files with (they do not change but for
# the final flag), and the SHA-256 of files whose mtime made them suspect, by (path, size, mtime).
_MANIFESTS: dict[tuple[str, str, int], Manifest] = {}
_SHAS: dict[tuple[str, int, int], str] = {}


def _sha256(path: Path) -> str:
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    with _HASHES_LOCK:
        if key in _SHAS:
            return _SHAS[key]
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(8 * MiB):
            digest.update(chunk)
    with _HASHES_LOCK:
        if len(_SHAS) > 100_000:
            _SHAS.clear()
        _SHAS[key] = digest.hexdigest()
    return _SHAS[key]


def local_changes(directory: Path, manifest: Manifest) -> list[str]:
    """Files of a durable checkpoint that differ from its manifest: added, removed, another size, or
    (only for files modified after the manifest was made, so a pass costs a stat per file) another
    SHA-256."""
    # gpuplan's own files may follow the save (an evaluation ending after the step became durable): their metric
    # reaches the service as such (late_metric), and the checkpoint's data is unchanged.
    recorded = {f.path: f for f in manifest.files if f.path not in OWN_FILES}
    local = {
        relative: p
        for p in checkpoint_files(directory)
        if (relative := p.relative_to(directory).as_posix()) not in OWN_FILES
    }
    changed = sorted(set(local) ^ set(recorded))
    made_ns = int(manifest.created_at.timestamp() * 1e9)
    for relative in sorted(set(local) & set(recorded)):
        path, entry = local[relative], recorded[relative]
        try:
            stat = path.stat()
            if stat.st_size != entry.size or (stat.st_mtime_ns > made_ns and _sha256(path) != entry.sha256):
                changed.append(relative)
        except FileNotFoundError:
            changed.append(relative)  # removed since the listing
    return sorted(changed)


# The metric files late_metric read, by (path, mtime): a pass reads a changed file once, and warns once of a bad one.
_LATE_METRICS: dict[tuple[str, int], float | None] = {}


def late_metric(directory: Path, step: int, manifest: Manifest) -> float | None:
    """A metric the training script wrote after the step became durable (``gpuplan_metric.json`` may follow the
    marker: docs/runs.md) other than the one its manifest carries; None: none new. Retention keeps the best by it.
    The file is the script's own word, so it replaces an ``eval_loss`` the manifest was made with (that one stood,
    and retention deleted the checkpoint the file named best: a probe)."""
    path = directory / METRIC_FILE
    if not path.is_file():
        return None
    try:
        key = (str(path), path.stat().st_mtime_ns)
    except OSError:
        return None
    if key not in _LATE_METRICS:
        if len(_LATE_METRICS) > 10_000:
            _LATE_METRICS.clear()
        _LATE_METRICS[key] = read_metric(directory, step)
    found = _LATE_METRICS[key]
    return found if found != manifest.metric else None


def _manifest_for(s3: Any, bucket: str, run_prefix: str, step: int) -> Manifest | None:
    key = (bucket, run_prefix, step)
    if key not in _MANIFESTS:
        manifest = read_manifest(s3, bucket, run_prefix, step)
        if manifest is None:
            return None
        _MANIFESTS[key] = manifest
    return _MANIFESTS[key]


def _keys(s3: Any, bucket: str, prefix: str) -> list[str]:
    keys: list[str] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys.extend(o["Key"] for o in page.get("Contents", []))
    return keys


def delete_checkpoint(s3: Any, bucket: str, run_prefix: str, step: int) -> None:
    """Delete a checkpoint from the bucket: the manifest first, so a half-deleted one is never durable."""
    base = step_prefix(run_prefix, step)
    s3.delete_object(Bucket=bucket, Key=f"{base}/{MANIFEST_NAME}")
    keys = _keys(s3, bucket, base + "/")
    for start in range(0, len(keys), 1000):
        s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys[start : start + 1000]]})
    for upload in s3.list_multipart_uploads(Bucket=bucket, Prefix=base + "/").get("Uploads", []):
        s3.abort_multipart_upload(Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"])


def stored_steps(s3: Any, bucket: str, run_prefix: str) -> set[int]:
    """Every step with any object under the run's prefix (durable or not)."""
    prefix = run_prefix.strip("/") + "/" if run_prefix.strip("/") else ""
    return {s for k in _keys(s3, bucket, prefix) if (s := step_from_key(run_prefix, k)) is not None}


def sync_pass(
    s3: Any,
    bucket: str,
    run_prefix: str,
    run_id: str,
    checkpoint_dir: Path,
    control: ControlPlane,
    options: SyncOptions,
    *,
    final: bool = False,
    now: float | None = None,
    before_manifest: Callable[[], None] | None = None,
) -> SyncResult:
    """One pass: make every complete checkpoint durable, report it, apply retention. ``final`` marks the
    newest checkpoint as the run's final one (kept by retention)."""
    result = SyncResult()
    durable, deleted = control.done_steps()
    local = checkpoint_dirs(checkpoint_dir)
    newest_local = local[-1][0] if local else None

    def apply_retention(to_delete: list[int]) -> None:
        for old in to_delete:
            delete_checkpoint(s3, bucket, run_prefix, old)
            control.report_deleted(old)
            result.deleted.append(old)

    def note_changes(step: int, directory: Path, manifest: Manifest | None) -> None:
        changed = local_changes(directory, manifest) if manifest is not None else []
        if changed and directory.is_dir():  # a folder gone meanwhile was rotated away, not changed
            result.changed[step] = changed
            log.warning(
                "step %d: local files changed after it was made durable (%s); the bucket keeps the verified "
                "upload and it is not uploaded again",
                step,
                ", ".join(changed[:5]),
                extra=_in_result("changed"),
            )

    for step, directory in local:
        if step in durable or step in deleted:
            try:
                stored_manifest = _manifest_for(s3, bucket, run_prefix, step) if step in durable else None
                # Already durable: marking it final, or adding the metric an evaluation wrote after it became durable,
                # rewrites only its manifest, read anew (the cache may be older).
                marking = final and step == newest_local and step in durable
                metric = late_metric(directory, step, stored_manifest) if stored_manifest is not None else None
                stored = read_manifest(s3, bucket, run_prefix, step) if marking or metric is not None else None
            except UnreadableManifest as exc:
                # Damaged in the bucket: said (the agent's sync error), and newer checkpoints still sync; it failed
                # every pass of a new node's agent, so that no checkpoint after it ever became durable.
                result.lost[step] = str(exc)
                log.error("%s", exc, extra=_in_result("lost"))
                continue
            if stored_manifest is not None:
                note_changes(step, directory, stored_manifest)
            update: dict[str, Any] = {"final": True} if marking else {}
            if metric is not None and stored is not None:
                update["metric"] = metric
            if stored is not None and any(getattr(stored, name) != value for name, value in update.items()):
                marked = stored.model_copy(update=update)
                write_manifest(s3, bucket, run_prefix, marked)
                _MANIFESTS[(bucket, run_prefix, step)] = marked
                apply_retention(control.report_durable(marked, None))
            elif stored is not None:
                _MANIFESTS[(bucket, run_prefix, step)] = stored  # another writer's update: not read again each pass
            result.already_durable.append(step)
            continue
        if durable and step < max(durable):
            result.superseded.append(step)
            continue
        try:
            state = completeness(directory, step)
            lost = _shrinking(directory) if state.complete else []
            quiet = state.complete and not lost and settled(directory, options.settle_s, now)
        except FileNotFoundError as exc:
            # Removed while this pass looked at it (a trainer's rotation deleting old checkpoints): not an error.
            result.in_progress[step] = _vanished(directory, exc)
            continue
        if not state.complete:
            result.in_progress[step] = state.reason
            # Debug: the agent logs a step's waiting once per change (services/agent/node.py), `gpuplan sync` prints it.
            log.debug("step %d: in progress, not uploaded: %s", step, state.reason, extra=_in_result("in_progress"))
            continue
        if lost:
            result.in_progress[step] = f"lost {', '.join(lost[:5])} since it was complete: being deleted"
            log.warning(
                "step %d: %s; never made durable", step, result.in_progress[step], extra=_in_result("in_progress")
            )
            continue
        if not quiet:
            result.unsettled.append(step)
            continue
        is_final = final and step == newest_local
        try:
            existing = read_manifest(s3, bucket, run_prefix, step)
        except UnreadableManifest as exc:
            # A manifest the service never recorded, damaged: nothing of the step is overwritten (a manifest is there),
            # and, as for a durable one, it is said and the other steps sync; it failed the whole pass.
            result.lost[step] = str(exc)
            log.error("%s", exc, extra=_in_result("lost"))
            continue
        if existing is not None:
            # Durable in the bucket, but the control plane was not told (it was unreachable last time):
            # reported as it is (its objects are never sent again), marked final if asked.
            note_changes(step, directory, existing)
            if is_final and not existing.final:
                existing = existing.model_copy(update={"final": True})
                write_manifest(s3, bucket, run_prefix, existing)
            to_delete = control.report_durable(existing, None)
        else:
            try:
                upload = upload_checkpoint(
                    s3,
                    bucket,
                    run_prefix,
                    run_id,
                    directory,
                    step,
                    options,
                    final=is_final,
                    before_manifest=before_manifest,
                )
            except CheckpointChanged as exc:
                result.in_progress[step] = str(exc)
                log.warning("step %d: %s; the next pass tries again", step, exc, extra=_in_result("in_progress"))
                continue
            except FileNotFoundError as exc:
                result.in_progress[step] = _vanished(directory, exc)
                continue
            except Unstorable as exc:
                result.refused[step] = str(exc)
                log.warning("step %d: complete, but not stored: %s", step, exc, extra=_in_result("refused"))
                continue
            result.uploaded.append(upload)
            rate = upload.bytes_sent / upload.seconds if upload.bytes_sent and upload.seconds > 0 else None
            to_delete = control.report_durable(upload.manifest, rate)
        durable.add(step)
        apply_retention(to_delete)
    if durable and max(durable) not in {u.manifest.step for u in result.uploaded} and max(durable) not in result.lost:
        newest = max(durable)
        _audit(s3, bucket, run_prefix, newest, dict(local).get(newest), control, options, result)
    # The audit may have found the newest durable step lost: it is said there alone.
    result.already_durable = [step for step in result.already_durable if step not in result.lost]
    # Interrupted uploads older than the newest durable checkpoint that no local directory will finish;
    # looked for only when this pass made a checkpoint durable (listing the run's prefix is not free).
    if result.uploaded or result.deleted:
        local_steps = {s for s, _ in local}
        for orphan in stored_steps(s3, bucket, run_prefix) - durable - local_steps:
            if (
                orphan < max(durable)
                # Any manifest, damaged or not, was written last: not an interrupted upload.
                and _head(s3, bucket, _manifest_key(run_prefix, orphan)) is None
                and _quiet(s3, bucket, step_prefix(run_prefix, orphan) + "/", ORPHAN_QUIET_S)
            ):
                delete_checkpoint(s3, bucket, run_prefix, orphan)
    return result


def _vanished(directory: Path, exc: FileNotFoundError) -> str:
    where = Path(exc.filename).name if exc.filename else directory.name
    return f"{where} vanished while this pass looked at it: being deleted"


def _audit(
    s3: Any,
    bucket: str,
    run_prefix: str,
    step: int,
    directory: Path | None,
    control: ControlPlane,
    options: SyncOptions,
    result: SyncResult,
) -> None:
    """Whether the bucket still holds the newest durable checkpoint (the one a resume takes) as the API recorded it,
    by one listing of its prefix: a bucket wiped, or a lifecycle rule that expired its objects, left the API calling
    it durable and nothing uploading it again (a lifecycle probe of stop 49). Objects lost are put back from the
    local copy where it still has them with the recorded SHA-256 (``result.repaired``); else the step is reported
    ``result.lost``, which the agent raises as its sync error."""
    recorded = control.durable_manifest(step)
    if recorded is None:
        return
    base = step_prefix(run_prefix, step)
    stored: dict[str, int] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=base + "/"):
        stored.update((o["Key"], int(o["Size"])) for o in page.get("Contents", []))
    wanted = [(f"{base}/{f.path}", f, directory) for f in recorded.files]
    root = directory.parent if directory is not None else None
    wanted += [(f"{base}/{BESIDE_PREFIX}/{f.path}", f, root) for f in recorded.beside]
    gone = [(key, f, where) for key, f, where in wanted if stored.get(key) != f.size]
    if not gone and f"{base}/{MANIFEST_NAME}" in stored:
        return
    put_back: list[str] = []
    for key, f, where in gone:
        path = where / f.path if where is not None else None
        if path is None or not path.is_file() or path.stat().st_size != f.size or _sha256(path) != f.sha256:
            result.lost[step] = (
                f"the bucket lost {gone[0][1].path if len(gone) == 1 else f'{len(gone)} files'} of durable "
                f"step {step} (s3://{bucket}/{base}/) and no local copy with the recorded SHA-256 is left to put back: "
                "the API still lists it durable; restore an older step"
            )
            log.error("step %d: %s", step, result.lost[step], extra=_in_result("lost"))
            return
        try:
            put = upload_file(s3, bucket, key, path, options)
        except (FileChanged, FileNotFoundError):
            put = None
        if put is None or put.sha256 != f.sha256:
            result.lost[step] = f"{f.path} of durable step {step} changed while it was put back; the next pass retries"
            return
        put_back.append(f.path)
    with contextlib.suppress(DurableElsewhere):  # the manifest is still there, or another agent put it back first
        write_manifest(s3, bucket, run_prefix, recorded, create=True)
    result.repaired[step] = put_back = put_back or [MANIFEST_NAME]
    log.warning(
        "step %d: the bucket had lost %s; put back from the local copy",
        step,
        ", ".join(put_back[:5]),
        extra=_in_result("repaired"),
    )


def _quiet(s3: Any, bucket: str, prefix: str, seconds: float) -> bool:
    """Whether nothing under ``prefix`` was written (an object, or a multipart upload begun) for ``seconds``."""
    latest: datetime | None = None
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            latest = item["LastModified"] if latest is None else max(latest, item["LastModified"])
    for upload in s3.list_multipart_uploads(Bucket=bucket, Prefix=prefix).get("Uploads", []):
        latest = upload["Initiated"] if latest is None else max(latest, upload["Initiated"])
    return latest is None or (datetime.now(UTC) - latest).total_seconds() >= seconds


def pending_steps(checkpoint_dir: Path, durable: set[int], deleted: set[int]) -> list[int]:
    """Local checkpoints not durable yet, in progress ones included (what a heartbeat reports as
    unsynced, so the idle sweep keeps the node): everything newer than the newest durable step."""
    try:
        local = checkpoint_dirs(checkpoint_dir)
    except SyncError:
        return []
    newest = max(durable, default=-1)
    return [s for s, _ in local if s not in durable and s not in deleted and s > newest]
