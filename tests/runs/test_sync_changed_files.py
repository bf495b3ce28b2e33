"""A file the trainer changes while a pass uploads it fails only its own step: the pass goes on, the other complete
steps become durable, and the changed one is left in progress (never durable), hashed anew on the next pass."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

import services.runs.sync as sync
from services.runs.sync import SyncOptions, read_manifest, sync_pass
from services.storage.s3 import make_s3_client
from tests.runs.conftest import RunEnv, make_checkpoint

MiB = 2**20
OPTIONS = SyncOptions(part_size=5 * MiB, multipart_threshold=5 * MiB, settle_s=0)


def _change_after_hashing(monkeypatch: pytest.MonkeyPatch, victim: Path, keep_mtime: bool) -> list[Path]:
    """Rewrite ``victim`` (same size, other bytes in its middle) right after a pass hashed it, before its bytes are
    sent: the trainer writing into the checkpoint mid-upload. ``keep_mtime``: its size and mtime put back (a copy
    that keeps timestamps), so only its bytes tell."""
    real = sync._hash_file
    changed: list[Path] = []

    def hash_then_change(path: Path, part_size: int) -> tuple[str, str, list[bytes]]:
        hashed = real(path, part_size)
        if path == victim and not changed:
            stat = path.stat()
            with path.open("r+b") as fh:
                fh.seek(stat.st_size // 2)
                fh.write(os.urandom(4096))
            if keep_mtime:
                os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
            changed.append(path)
        return hashed

    monkeypatch.setattr(sync, "_hash_file", hash_then_change)
    return changed


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_file_changed_mid_upload_fails_only_its_step_and_the_pass_goes_on(
    run_env: RunEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env, bucket = run_env, run_env.s3.s3_bucket or ""
    prefix, s3 = env.run()["prefix"], make_s3_client(env.s3)
    root = tmp_path / "out"
    for step in (100, 200, 300):
        make_checkpoint(root, step, 6 * MiB, seed=step)  # model.safetensors goes up in two parts
    changed = _change_after_hashing(monkeypatch, root / "checkpoint-200" / "model.safetensors", keep_mtime=False)
    result = sync_pass(s3, bucket, prefix, env.run_id, root, env.api, OPTIONS)
    assert changed, "the pass never hashed the file"
    assert [u.manifest.step for u in result.uploaded] == [100, 300]
    assert result.in_progress == {200: "model.safetensors changed while it was uploaded; not made durable"}
    assert read_manifest(s3, bucket, prefix, 200) is None
    run = env.run()
    assert run["last_durable_step"] == 300 and [c["step"] for c in run["checkpoints"]] == [100, 300]
    # The next pass: step 200 is older than a durable step, so it is superseded, never made durable after the fact.
    again = sync_pass(s3, bucket, prefix, env.run_id, root, env.api, OPTIONS)
    assert again.uploaded == [] and again.superseded == [200] and read_manifest(s3, bucket, prefix, 200) is None


def test_the_changed_step_is_retried_on_the_next_pass_with_the_file_hashed_anew(
    run_env: RunEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env, bucket = run_env, run_env.s3.s3_bucket or ""
    prefix, s3 = env.run()["prefix"], make_s3_client(env.s3)
    root = tmp_path / "out"
    make_checkpoint(root, 100, 2 * MiB, seed=1)
    victim = root / "checkpoint-200" / "optimizer.pt"
    make_checkpoint(root, 200, 2 * MiB, seed=2)
    real = sync._hash_file
    _change_after_hashing(monkeypatch, victim, keep_mtime=True)
    result = sync_pass(s3, bucket, prefix, env.run_id, root, env.api, OPTIONS)
    assert [u.manifest.step for u in result.uploaded] == [100]
    assert "optimizer.pt changed while it was uploaded" in result.in_progress[200]
    assert env.run()["last_durable_step"] == 100 and read_manifest(s3, bucket, prefix, 200) is None
    # Its size and mtime are those hashed before, so only a forgotten hash lets the next pass see the new bytes.
    monkeypatch.setattr(sync, "_hash_file", real)
    retried = sync_pass(s3, bucket, prefix, env.run_id, root, env.api, OPTIONS)
    assert [u.manifest.step for u in retried.uploaded] == [200] and not retried.in_progress
    manifest = read_manifest(s3, bucket, prefix, 200)
    assert manifest is not None
    assert {f.path: f.sha256 for f in manifest.files}["optimizer.pt"] == _sha(victim)
    assert env.run()["last_durable_step"] == 200
