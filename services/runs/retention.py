"""Which checkpoints to delete from the bucket (pure).

Kept: the last ``keep_last`` durable checkpoints, the best by the evaluation metric when one is reported,
and the final one. Nothing is deleted unless a newer checkpoint is durable: a checkpoint older than the
newest durable one is the only kind that can go, so a restore always has something to restore.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import ConfigDict, Field, StrictInt

from services.core.request_models import ClosedModel


class RetentionPolicy(ClosedModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    keep_last: StrictInt = Field(default=2, ge=1, le=1000, description="durable checkpoints kept, newest first")
    keep_best: bool = Field(default=True, description="also keep the best by the reported metric")
    metric_mode: Literal["min", "max"] = Field(default="min", description="min for a loss, max for accuracy")
    keep_final: bool = True


@dataclass(frozen=True)
class StoredCheckpoint:
    step: int
    durable: bool
    metric: float | None = None
    final: bool = False


def best_step(checkpoints: list[StoredCheckpoint], mode: Literal["min", "max"]) -> int | None:
    scored = [c for c in checkpoints if c.durable and c.metric is not None]
    if not scored:
        return None
    sign = 1.0 if mode == "min" else -1.0
    # Ties go to the newer checkpoint.
    return min(scored, key=lambda c: (sign * (c.metric or 0.0), -c.step)).step


def steps_to_delete(checkpoints: list[StoredCheckpoint], policy: RetentionPolicy) -> list[int]:
    durable = sorted((c for c in checkpoints if c.durable), key=lambda c: c.step, reverse=True)
    if not durable:
        return []
    newest = durable[0].step
    keep = {c.step for c in durable[: policy.keep_last]}
    if policy.keep_best:
        best = best_step(checkpoints, policy.metric_mode)
        if best is not None:
            keep.add(best)
    if policy.keep_final:
        keep.update(c.step for c in durable if c.final)
    # Older than the newest durable one: either superseded durable checkpoints or abandoned partial
    # uploads (data without a manifest) that no later pass will complete.
    return sorted(c.step for c in checkpoints if c.step < newest and c.step not in keep)
