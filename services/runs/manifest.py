"""The bucket layout of a run's checkpoints and the manifest that makes one durable (pure).

Layout, under the run's prefix::

    <prefix>/step-0000001200/<relative path of each file>
    <prefix>/step-0000001200/manifest.json      written last

A checkpoint is durable only when its manifest exists and every file it lists is in the bucket with
the listed size and SHA-256. Data without a manifest is an interrupted upload, never restored.
"""

from __future__ import annotations

import hashlib
import re
from datetime import datetime
from pathlib import PurePosixPath

from pydantic import ConfigDict, Field, StrictFloat, StrictInt, field_validator

from services.core.json_limits import INT32_MAX
from services.core.request_models import ClosedModel, SingleLine

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1
# Where a checkpoint's files from beside its folder are stored under its step prefix (a checkpoint may
# not hold a top-level entry of this name).
BESIDE_PREFIX = "_beside"
# Directory names trainers give their checkpoints: checkpoint-500 (transformers), step-500 / step_500
# (LitGPT: step-000500), global_step500 (DeepSpeed's tag), epoch_2 / dist_epoch_2 (torchtune), or a bare
# number. services/runs/complete.py decides when each is complete.
_STEP_PATTERNS = (
    re.compile(r"^checkpoint[-_](\d+)$"),
    re.compile(r"^step[-_]?(\d+)$"),
    re.compile(r"^global_step(\d+)$"),
    re.compile(r"^(?:dist_)?epoch[-_](\d+)$"),
    re.compile(r"^(\d+)$"),
)


def step_of(dir_name: str) -> int | None:
    """The training step a checkpoint directory's name carries (None: not a checkpoint directory)."""
    for pattern in _STEP_PATTERNS:
        match = pattern.match(dir_name)
        if match:
            return int(match.group(1))
    return None


def step_prefix(run_prefix: str, step: int) -> str:
    return "/".join(p for p in (run_prefix.strip("/"), f"step-{step:010d}") if p)


def checkpoint_layout(run_prefix: str) -> str:
    """The layout line of a run's checkpoint schedule (services.planner.checkpoints carries it)."""
    return f"{step_prefix(run_prefix, 0).replace('0000000000', '<step:010d>')}/<files>, manifest.json last"


def step_from_key(run_prefix: str, key: str) -> int | None:
    rest = key[len(run_prefix.strip("/")) :].lstrip("/") if run_prefix.strip("/") else key
    head = rest.split("/", 1)[0]
    match = re.fullmatch(r"step-(\d{10})", head)
    return int(match.group(1)) if match else None


class ManifestFile(ClosedModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    path: SingleLine = Field(min_length=1, max_length=1024, description="relative POSIX path inside the checkpoint")
    # 64 TiB a file: 100,000 such files still sum within the 64-bit size_bytes column.
    size: StrictInt = Field(ge=0, le=2**46)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")

    @field_validator("path")
    @classmethod
    def _relative(cls, value: str) -> str:
        path = PurePosixPath(value)
        if path.is_absolute() or ".." in path.parts or value != path.as_posix():
            raise ValueError("must be a normalised relative path without '..'")
        return value


class Manifest(ClosedModel):
    """What a durable checkpoint holds; stored as <step prefix>/manifest.json and in the database."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: StrictInt = Field(default=MANIFEST_VERSION, ge=1, le=1000)
    run_id: str = Field(min_length=1, max_length=64)
    step: StrictInt = Field(ge=0, le=INT32_MAX)  # run_checkpoints.step, runs.last_durable_step
    dir_name: SingleLine = Field(min_length=1, max_length=255, description="the directory's name on the node")
    files: tuple[ManifestFile, ...] = Field(min_length=1, max_length=100_000)
    beside: tuple[ManifestFile, ...] = Field(
        default=(),
        max_length=16,
        description="files kept beside the checkpoint folder that resuming from it needs, relative to the run's "
        f"checkpoint root (torchtune's recipe_state/recipe_state.pt); stored under <step>/{BESIDE_PREFIX}/",
    )
    metric: StrictFloat | None = Field(default=None, description="evaluation metric reported with it, if any")
    final: bool = False
    created_at: datetime

    @field_validator("dir_name")
    @classmethod
    def _one_name(cls, value: str) -> str:
        # A restore writes the checkpoint to <target>/<dir_name>: '..', '/x' or 'a/b' would put it elsewhere.
        if value in (".", "..") or "/" in value or "\\" in value:
            raise ValueError(f"must be one directory name (no '/', not '.' or '..'), got {value[:80]!r}")
        return value

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in (*self.files, *self.beside))


def part_md5s_etag(part_md5s: list[bytes]) -> str:
    """The ETag S3 gives a multipart object: MD5 of the concatenated part MD5s, '-' and the part count."""
    return f"{hashlib.md5(b''.join(part_md5s), usedforsecurity=False).hexdigest()}-{len(part_md5s)}"


def etag_matches(etag: str, md5_hex: str | None, part_md5s: list[bytes] | None) -> bool | None:
    """Whether an ETag proves the content; None when the store's ETag is not an MD5 (e.g. SSE-KMS), in
    which case the caller falls back to the size and the SHA-256 it stored as metadata."""
    etag = etag.strip('"')
    if "-" in etag:
        if part_md5s is None or not re.fullmatch(r"[0-9a-f]{32}-\d+", etag):
            return None
        return etag == part_md5s_etag(part_md5s)
    if md5_hex is None or not re.fullmatch(r"[0-9a-f]{32}", etag):
        return None
    return etag == md5_hex
