"""Restore a durable checkpoint onto a node (boto3 and the local disk).

Files are downloaded into ``<to>/<dir name>.partial`` (an interrupted download resumes with a ranged
GET from where it stopped), each verified against the manifest's size and SHA-256, and the directory
is renamed to its final name only when every file is verified: a restore never leaves a directory that
looks complete but is not. What else the ``.partial`` folder holds (an earlier restore of another checkpoint of the
same name) is removed first, so the copy holds the manifest's files and no others. Every restored file gets the
same mtime, so the framework's last-written file (services/runs/complete.py) is not older than the others and the
copy reads as complete; a DeepSpeed tag directory (``global_stepN``) gets a ``latest`` beside it naming it, as the
engine wrote, and files the manifest keeps beside the folder (torchtune's ``recipe_state/recipe_state.pt``) are put
back beside it, verified the same way, with the same mtime.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from services.runs.complete import DEEPSPEED_LATEST
from services.runs.manifest import BESIDE_PREFIX, Manifest, ManifestFile, step_prefix
from services.runs.sync import read_manifest

CHUNK = 8 * 2**20
_TAG = re.compile(r"global_step\d+")  # a DeepSpeed tag folder, which gets a `latest` naming it


class RestoreError(Exception):
    pass


@dataclass(frozen=True)
class RestoreResult:
    step: int
    directory: Path
    files: int
    bytes: int
    bytes_downloaded: int


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _download(s3: Any, bucket: str, key: str, target: Path, size: int) -> int:
    """Fetch ``key`` into ``target``, continuing a partial file; returns the bytes fetched now."""
    have = target.stat().st_size if target.exists() else 0
    if have > size:
        target.unlink()
        have = 0
    target.parent.mkdir(parents=True, exist_ok=True)
    if have == size:
        target.touch()  # an empty file (a `.complete` marker) has nothing to fetch but must exist
        return 0
    extra = {"Range": f"bytes={have}-"} if have else {}
    body = s3.get_object(Bucket=bucket, Key=key, **extra)["Body"]
    fetched = 0
    with target.open("ab") as fh:
        while chunk := body.read(CHUNK):
            fh.write(chunk)
            fetched += len(chunk)
    return fetched


def _prune(partial: Path, keep: set[str]) -> None:
    """Remove from the ``.partial`` folder whatever the manifest does not list: an earlier restore of another
    checkpoint of the same name (another run, a step saved anew) may have left files there, and the folder is renamed
    into place whole. Links go too: a download never writes through one."""
    if not partial.is_dir() or partial.is_symlink():
        return
    folders = {parent.as_posix() for name in keep for parent in PurePosixPath(name).parents}
    for path in sorted(partial.rglob("*"), key=lambda p: len(p.parts), reverse=True):  # a folder after its files
        relative = path.relative_to(partial).as_posix()
        if path.is_dir() and not path.is_symlink():
            if relative not in folders:
                path.rmdir()  # emptied above
        elif path.is_symlink() or relative not in keep:
            path.unlink()


def _fetch_verified(s3: Any, bucket: str, key: str, target: Path, entry: ManifestFile) -> int:
    """Download one file (resuming a partial one) until its size and SHA-256 match; bytes fetched."""
    from botocore.exceptions import ClientError

    fetched = 0
    for attempt in (1, 2):
        try:
            fetched += _download(s3, bucket, key, target, entry.size)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                raise RestoreError(
                    f"{entry.path}: not in the bucket (s3://{bucket}/{key}): this checkpoint cannot be restored; "
                    "restore another step with --step"
                ) from None
            raise
        if target.stat().st_size == entry.size and _sha256(target) == entry.sha256:
            return fetched
        target.unlink()  # corrupt or changed: fetch it once more from the start
        if attempt == 2:
            raise RestoreError(f"{entry.path}: checksum mismatch after two downloads; nothing was restored")
    return fetched


def _taken_beside(to: Path, stored: Manifest) -> str | None:
    """What stands where the restore puts a file beside the folder, with other contents (None: nothing): a newer
    save's recipe state, or a ``latest`` naming another tag. Replacing it would resume the run there from this step
    without a word, as restoring over an existing folder would; the same file is left as it is."""
    for entry in stored.beside:
        place = to / entry.path
        if place.is_symlink() or (place.exists() and not place.is_file()):
            return f"{place} already exists and is not a plain file"
        if place.exists() and (place.stat().st_size != entry.size or _sha256(place) != entry.sha256):
            return f"{place} already exists with other contents (another step's)"
    latest = to / DEEPSPEED_LATEST
    if _TAG.fullmatch(stored.dir_name) and (latest.exists() or latest.is_symlink()):
        try:
            named = latest.read_text().strip() if latest.is_file() and not latest.is_symlink() else None
        except (OSError, UnicodeDecodeError):
            named = None
        if named != stored.dir_name:
            shown = "something else" if named is None else repr(named[:80])
            return f"{latest} already exists and names {shown}, not {stored.dir_name}"
    return None


def restore_checkpoint(s3: Any, bucket: str, run_prefix: str, expected: Manifest, to: Path) -> RestoreResult:
    """Download and verify the checkpoint ``expected`` describes (the control plane's record); the
    manifest in the bucket must agree with it, or nothing is restored."""
    stored = read_manifest(s3, bucket, run_prefix, expected.step)
    if stored is None:
        raise RestoreError(f"step {expected.step}: no manifest in s3://{bucket}/{run_prefix}; it is not durable")
    if stored.files != expected.files or stored.beside != expected.beside:
        raise RestoreError(f"step {expected.step}: the bucket's manifest differs from the control plane's record")
    final = to / stored.dir_name
    if final.exists():
        raise RestoreError(f"{final} already exists; restore into an empty directory or remove it")
    taken = _taken_beside(to, stored)
    if taken is not None:
        raise RestoreError(f"{taken}; restore into an empty directory or remove it")
    partial = to / f"{stored.dir_name}.partial"
    base = step_prefix(run_prefix, stored.step)
    _prune(partial, {entry.path for entry in stored.files})
    downloaded = 0
    for entry in stored.files:
        downloaded += _fetch_verified(s3, bucket, f"{base}/{entry.path}", partial / entry.path, entry)
    # Files kept beside the folder (torchtune's recipe state) land beside it, as the framework reads them.
    beside = [(to / f"{entry.path}.partial", to / entry.path) for entry in stored.beside]
    for entry, (target, _) in zip(stored.beside, beside, strict=True):
        downloaded += _fetch_verified(s3, bucket, f"{base}/{BESIDE_PREFIX}/{entry.path}", target, entry)
    # One mtime for every file, the `latest` written here included: the file system stamps a new file from a
    # coarser clock than time.time_ns, which can lag it by a tick, and a tag file older than its shards reads as
    # a checkpoint being rewritten (services.runs.complete).
    stamp = time.time_ns()
    for path in [*partial.rglob("*"), partial, *(target for target, _ in beside)]:
        os.utime(path, ns=(stamp, stamp))
    partial.rename(final)
    for target, place in beside:
        target.replace(place)
    if _TAG.fullmatch(stored.dir_name):
        latest = to / f"{DEEPSPEED_LATEST}.partial"
        latest.write_text(stored.dir_name)
        os.utime(latest, ns=(stamp, stamp))
        latest.replace(to / DEEPSPEED_LATEST)
    return RestoreResult(stored.step, final, len(stored.files), stored.total_bytes, downloaded)
