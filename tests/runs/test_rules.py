"""The pure rules of the run lifecycle: schedule, retention, manifest paths, busy signals."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from pydantic import ValidationError

from services.agent.signals import OLD_SESSION_S, parse_who_idle
from services.estimator.estimate import resolve_architecture
from services.nodes.idle import IdlePolicy, Signals, busy_reasons
from services.planner.checkpoints import FAILURES_PER_GPU_HOUR, CheckpointSchedule, ScheduleInputs, checkpoint_schedule
from services.runs.manifest import (
    ManifestFile,
    checkpoint_layout,
    etag_matches,
    part_md5s_etag,
    step_from_key,
    step_of,
    step_prefix,
)
from services.runs.retention import RetentionPolicy, StoredCheckpoint, best_step, steps_to_delete
from tests.conftest import make_plan


def _schedule(**inputs: object) -> CheckpointSchedule:
    plan = make_plan(method="lora", lora={"rank": 16})
    _, arch = resolve_architecture(plan)
    return checkpoint_schedule(
        plan, arch, ScheduleInputs.model_validate(inputs), RetentionPolicy(), checkpoint_layout("runs/r1")
    )


def test_young_daly_interval_is_sqrt_2cm_and_shrinks_with_more_preemptions() -> None:
    slow = _schedule(spot=True, preemptions_per_node_hour=0.05, upload_bytes_per_s=1e6, step_seconds=2.0)
    fast = _schedule(spot=True, preemptions_per_node_hour=0.5, upload_bytes_per_s=1e6, step_seconds=2.0)
    c = slow.checkpoint_bytes / 1e6
    assert slow.young_daly_interval_s == pytest.approx(math.sqrt(2 * c * 20 * 3600))
    assert fast.interval_s < slow.interval_s
    assert slow.interval_steps == round(slow.interval_s / 2.0)
    assert "Young/Daly" in slow.formula


def test_on_demand_uses_hardware_failures_and_is_capped() -> None:
    schedule = _schedule(spot=False, gpus=8)
    assert schedule.interruptions_per_hour == pytest.approx(8 * FAILURES_PER_GPU_HOUR)
    assert schedule.capped and schedule.interval_s == 3600
    assert "capped at 60 min" in schedule.formula


def test_retention_never_deletes_the_newest_durable_and_keeps_the_best_and_final() -> None:
    checkpoints = [
        StoredCheckpoint(100, True, 0.9),
        StoredCheckpoint(200, True, 0.4),
        StoredCheckpoint(300, True, 0.6, final=True),
        StoredCheckpoint(400, True, 0.7),
        StoredCheckpoint(500, False),  # uploading: newer than every durable one, never touched
    ]
    policy = RetentionPolicy(keep_last=1)
    assert steps_to_delete(checkpoints, policy) == [100]
    assert best_step(checkpoints, "min") == 200 and best_step(checkpoints, "max") == 100
    assert steps_to_delete([StoredCheckpoint(100, False), StoredCheckpoint(200, False)], policy) == []
    only = [StoredCheckpoint(100, True)]
    assert steps_to_delete(only, RetentionPolicy(keep_last=1, keep_best=False, keep_final=False)) == []


def test_manifest_paths_and_etags() -> None:
    assert [step_of(n) for n in ("checkpoint-500", "step_7", "step-7", "epoch_2", "42", "logs")] == [
        500, 7, 7, 2, 42, None,
    ]  # fmt: skip
    assert step_prefix("runs/r1/", 5) == "runs/r1/step-0000000005"
    assert step_from_key("runs/r1", "runs/r1/step-0000000005/a/b.bin") == 5
    assert step_from_key("runs/r1", "runs/r1/other/a") is None
    with pytest.raises(ValidationError):
        ManifestFile(path="../etc/passwd", size=1, sha256="0" * 64)
    parts = [bytes(16), bytes([1] * 16)]
    assert etag_matches(f'"{part_md5s_etag(parts)}"', None, parts) is True
    assert etag_matches('"' + "a" * 32 + '"', "b" * 32, None) is False
    assert etag_matches('"not-an-md5"', "b" * 32, None) is None  # e.g. SSE-KMS: fall back to the SHA-256


def test_who_idle_column(tmp_path: Path) -> None:
    who = (
        "alice    pts/0        2026-11-29 21:00 00:42        1234 (10.0.0.5)\n"
        "bob      pts/1        2026-11-29 22:00   .          2345 (10.0.0.6)\n"
        "carol    pts/2        2026-11-27 10:00  old         3456 (10.0.0.7)\n"
    )
    assert parse_who_idle(who) == 0.0
    assert parse_who_idle(who.splitlines()[0]) == 42 * 60
    assert parse_who_idle("") is None
    # "old" is more than a day, how much more unknown: idle past any idle window (up to a week), not one day.
    assert parse_who_idle(who.splitlines()[2]) == OLD_SESSION_S
    assert not busy_reasons(Signals(interactive_idle_s=OLD_SESSION_S), IdlePolicy(idle_minutes=7 * 24 * 60))
