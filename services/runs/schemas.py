"""Request and response bodies of the runs API."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, field_validator

from services.core.request_models import ClosedModel, SingleLine
from services.runs.manifest import Manifest
from services.runs.retention import RetentionPolicy

# S3 bucket names (AWS rules; MinIO follows them) and key prefixes without surprises.
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]\Z")
_PREFIX = re.compile(r"^[A-Za-z0-9!_.*'()/-]*\Z")


class RunCreate(ClosedModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # An id is 32 hex digits; 64 as RunJoin.node_id: an unbounded one was echoed whole in the 422 (100 KB for 100 KB).
    node_ids: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(
        min_length=1, max_length=64, description="the nodes that run it"
    )
    checkpoint_dir: SingleLine = Field(
        min_length=1,
        max_length=1024,
        description="where the trainer saves: an absolute path on the node (the agent's --checkpoint-dir overrides it)",
    )
    bucket: str | None = Field(default=None, description="S3 bucket; default GPUPLAN_S3_BUCKET")
    prefix: SingleLine | None = Field(
        default=None,
        max_length=512,
        description="key prefix; default runs/<run id>; in the server's bucket (GPUPLAN_S3_BUCKET) it is "
        "always under orgs/<organization id>/",
    )
    spot: StrictBool = Field(default=False, description="spot (preemptible) nodes")
    preemptions_per_node_hour: StrictFloat | None = Field(
        default=None, ge=0.0, le=60.0, description="spot only; default the plan's constraints (an assumption)"
    )
    upload_mb_per_s: StrictFloat | None = Field(
        default=None, gt=0, le=100_000, description="upload bandwidth until the node has measured it (MB/s)"
    )
    max_interval_minutes: StrictFloat = Field(default=60.0, ge=1.0, le=7 * 24 * 60)
    retention: RetentionPolicy = RetentionPolicy()
    idle_minutes: StrictFloat = Field(default=15.0, ge=1.0, le=7 * 24 * 60, description="idle time before a stop")
    gpu_busy_pct: StrictFloat = Field(default=10.0, ge=0.0, le=100.0, description="GPU utilisation that counts as busy")

    @field_validator("bucket")
    @classmethod
    def _bucket(cls, value: str | None) -> str | None:
        if value is not None and (not _BUCKET.match(value) or ".." in value):
            raise ValueError("must be a valid S3 bucket name: 3-63 lowercase letters, digits, '.' and '-'")
        return value

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, value: str | None) -> str | None:
        if value is None:
            return None
        value = value.strip("/")
        if not _PREFIX.match(value) or "//" in value or any(p in (".", "..") for p in value.split("/")):
            raise ValueError("may hold letters, digits, '/', '-', '_', '.', '!', '*', \"'\", '(' and ')' only")
        return value

    @field_validator("checkpoint_dir")
    @classmethod
    def _absolute(cls, value: str) -> str:
        # The agent syncs Path(checkpoint_dir) from its own working directory (services/cli/runs.py agent_run_setup),
        # which is neither the trainer's (launch.sh's default 'outputs' is beside the exported files) nor known
        # here: 'outputs' or '~/ckpt' watched a folder the trainer never wrote, and no checkpoint became durable.
        if not value.startswith("/"):
            raise ValueError(
                f"must be an absolute path on the node, such as /data/out (got {value[:80]!r}): the agent runs in "
                "its own working directory; its --checkpoint-dir overrides this folder"
            )
        return value

    @field_validator("node_ids")
    @classmethod
    def _unique(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("lists a node twice")
        return value


class RunJoin(ClosedModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    node_id: str = Field(min_length=1, max_length=64)


class CheckpointReport(ClosedModel):
    """From the node after it wrote a checkpoint's manifest (the checkpoint is durable)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    manifest: Manifest
    upload_bytes_per_s: StrictFloat | None = Field(default=None, gt=0, le=1e12)


class CheckpointOut(BaseModel):
    step: int
    status: str
    size_bytes: int
    metric: float | None
    final: bool
    created_at: datetime
    deleted_at: datetime | None
    manifest: dict[str, Any]


class RunOut(BaseModel):
    id: str
    plan_id: str
    node_ids: list[str]
    status: str
    bucket: str
    prefix: str
    checkpoint_dir: str
    spot: bool
    schedule: dict[str, Any]
    last_durable_step: int | None
    best_step: int | None
    progress_step: int | None
    progress_loss: float | None
    progress_at: datetime | None
    upload_bytes_per_s: float | None
    created_at: datetime
    checkpoints: list[CheckpointOut]


class DurableAnswer(BaseModel):
    last_durable_step: int | None
    delete_steps: list[int] = Field(description="checkpoints retention lets go: delete them from the bucket")


class RunList(BaseModel):
    items: list[RunOut]
    next_cursor: str | None = Field(default=None, description="pass as ?before= for the next page; null: the last")
