"""What a lifecycle probe of stop 49 found losing data, each now held: a checkpoint losing a file mid-upload (a
trainer's rotation deleting it) made durable without it on the next pass; two agents of one run overwriting a step
the other had made durable; one agent's orphan cleanup deleting another's upload in progress; and a node whose
durable steps were written anew locally (resumed from an older step) reported nothing unsynced and was stopped idle."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any

import pytest

import services.runs.sync as sync
from services.agent.node import RunSync
from services.runs.manifest import step_prefix
from services.runs.restore import restore_checkpoint
from services.runs.sync import (
    DurableElsewhere,
    SyncOptions,
    read_manifest,
    stored_steps,
    sync_pass,
    upload_checkpoint,
    write_manifest,
)
from services.storage.s3 import make_s3_client
from tests.runs.conftest import RunEnv, make_checkpoint

MiB = 2**20
OPTIONS = SyncOptions(part_size=5 * MiB, multipart_threshold=5 * MiB, settle_s=0)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_file_that_vanishes_mid_upload_never_lets_the_checkpoint_become_durable(
    run_env: RunEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env, bucket = run_env, run_env.s3.s3_bucket or ""
    prefix, s3 = env.run()["prefix"], make_s3_client(env.s3)
    directory = make_checkpoint(tmp_path / "out", 100, 2 * MiB, seed=1)
    real = sync.upload_file
    sent: list[str] = []

    def rotating(s3: Any, bucket: str, key: str, path: Path, options: SyncOptions) -> Any:
        sent.append(key)
        if len(sent) == 2:
            (directory / "optimizer.pt").unlink()  # the trainer's rotation removing the directory, file by file
        return real(s3, bucket, key, path, options)

    monkeypatch.setattr(sync, "upload_file", rotating)
    result = sync_pass(s3, bucket, prefix, env.run_id, directory.parent, env.api, OPTIONS)
    assert not result.uploaded and "vanished while it was uploaded" in result.in_progress[100]
    monkeypatch.setattr(sync, "upload_file", real)
    again = sync_pass(s3, bucket, prefix, env.run_id, directory.parent, env.api, OPTIONS)
    assert not again.uploaded and "scheduler.pt without optimizer.pt" in again.in_progress[100]
    # An agent restarted in between (its memory of the complete directory gone) refuses it too: the Trainer's
    # optimizer and scheduler states come as a pair (services/runs/complete.py).
    monkeypatch.setattr(sync, "_COMPLETE_FILES", {})
    restarted = sync_pass(s3, bucket, prefix, env.run_id, directory.parent, env.api, OPTIONS)
    assert not restarted.uploaded and "scheduler.pt without optimizer.pt" in restarted.in_progress[100]
    assert read_manifest(s3, bucket, prefix, 100) is None and env.run()["last_durable_step"] is None


def test_a_step_another_agent_made_durable_is_never_written_into(run_env: RunEnv, tmp_path: Path) -> None:
    env, bucket = run_env, run_env.s3.s3_bucket or ""
    prefix, s3 = env.run()["prefix"], make_s3_client(env.s3)
    first = make_checkpoint(tmp_path / "a", 100, 2 * MiB, seed=1)
    second = make_checkpoint(tmp_path / "b", 100, 2 * MiB, seed=2)  # the same step, other bytes (another node)
    assert [u.manifest.step for u in sync_pass(s3, bucket, prefix, env.run_id, first.parent, env.api, OPTIONS).uploaded]
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"])
    etags = {k: s3.head_object(Bucket=bucket, Key=k)["ETag"] for k in keys}
    # The second agent began before the first's manifest existed (its control plane knew nothing durable yet).
    with pytest.raises(DurableElsewhere):
        upload_checkpoint(s3, bucket, prefix, env.run_id, second, 100, OPTIONS)
    assert {k: s3.head_object(Bucket=bucket, Key=k)["ETag"] for k in keys} == etags
    # And a manifest racing past that check is refused by the store's conditional write.
    theirs = read_manifest(s3, bucket, prefix, 100)
    assert theirs is not None
    with pytest.raises(DurableElsewhere):
        write_manifest(s3, bucket, prefix, theirs.model_copy(update={"files": theirs.files[:1]}), create=True)
    assert read_manifest(s3, bucket, prefix, 100) == theirs
    restored = restore_checkpoint(s3, bucket, prefix, env.api.choose(None, False), tmp_path / "restore")
    assert _sha(restored.directory / "model.safetensors") == _sha(first / "model.safetensors")


def test_an_upload_in_progress_elsewhere_is_no_orphan(run_env: RunEnv, tmp_path: Path) -> None:
    env, bucket = run_env, run_env.s3.s3_bucket or ""
    prefix, s3 = env.run()["prefix"], make_s3_client(env.s3)
    # Another agent's step 100, begun just now: data without a manifest yet.
    s3.put_object(Bucket=bucket, Key=f"{step_prefix(prefix, 100)}/model.safetensors", Body=b"x" * 1000)
    make_checkpoint(tmp_path / "out", 200, 2 * MiB, seed=3)
    sync_pass(s3, bucket, prefix, env.run_id, tmp_path / "out", env.api, OPTIONS)
    assert 100 in stored_steps(s3, bucket, prefix)  # younger than ORPHAN_QUIET_S: left alone
    old = sync.ORPHAN_QUIET_S
    try:
        sync.ORPHAN_QUIET_S = 0.0  # an upload abandoned long ago is cleaned up as before
        make_checkpoint(tmp_path / "out", 300, 2 * MiB, seed=4)
        sync_pass(s3, bucket, prefix, env.run_id, tmp_path / "out", env.api, OPTIONS)
    finally:
        sync.ORPHAN_QUIET_S = old
    assert 100 not in stored_steps(s3, bucket, prefix)


def test_a_durable_step_written_anew_locally_keeps_the_node_and_is_reported(run_env: RunEnv, tmp_path: Path) -> None:
    env, bucket = run_env, run_env.s3.s3_bucket or ""
    prefix, s3 = env.run()["prefix"], make_s3_client(env.s3)
    root = tmp_path / "out"
    make_checkpoint(root, 100, 2 * MiB, seed=1)
    run = RunSync(env.api, s3, bucket, prefix, root, OPTIONS)
    run.pass_once(env.api)
    run.succeeded()
    assert run.unsynced() == 0 and run.health()["last_error"] is None
    durable = read_manifest(s3, bucket, prefix, 100)
    # Resumed from an older step, the trainer saves step 100 again with other bytes.
    (root / "checkpoint-100" / "optimizer.pt").write_bytes(os.urandom(300_000))
    later = time.time() + 5
    os.utime(root / "checkpoint-100" / "optimizer.pt", (later, later))
    run.pass_once(env.api)
    run.succeeded()
    assert run.unsynced() == 1 and run.pending_bytes() > 0
    assert "differ from their durable copies" in (run.health()["last_error"] or "")
    assert read_manifest(s3, bucket, prefix, 100) == durable  # the verified copy is not overwritten


def test_retention_never_lists_a_checkpoint_it_already_deleted(run_env: RunEnv, tmp_path: Path) -> None:
    env, bucket = run_env, run_env.s3.s3_bucket or ""
    run_id = env.new_run(retention={"keep_last": 1, "keep_best": False})
    prefix, s3 = env.client.get(f"/v1/runs/{run_id}", headers=env.headers).json()["prefix"], make_s3_client(env.s3)
    root = tmp_path / "out"
    api = type(env.api)(env.client, env.key, run_id)
    deleted: list[int] = []
    for step in (100, 200, 300):
        make_checkpoint(root, step, 2 * MiB, seed=step)
        deleted += sync_pass(s3, bucket, prefix, run_id, root, api, OPTIONS).deleted
    assert deleted == [100, 200]
    final = sync_pass(s3, bucket, prefix, run_id, root, api, OPTIONS, final=True)
    assert final.deleted == []  # it listed 100 and 200 again, and the agent deleted and reported them again
