"""What a probe of the checkpoint path as a user runs it found, each now held: a weights file behind a link left out of
a checkpoint made durable without it; a file name the bucket or the manifest cannot hold failed every pass after its
bytes were sent, so no newer checkpoint became durable; a restore over an earlier restore's ``.partial`` folder kept
that one's files; a resumed multipart upload of a file rewritten since failed its pass; a checkpoint folder rotated
away while a pass looked at it failed the pass; and a diverged run's NaN loss failed the pass that wrote its
manifest."""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

import services.runs.sync as sync
from services.runs.complete import completeness
from services.runs.manifest import step_prefix
from services.runs.restore import RestoreError, restore_checkpoint
from services.runs.sync import SyncOptions, read_manifest, sync_pass
from services.storage.s3 import make_s3_client
from tests.runs.conftest import RunEnv, make_checkpoint

MiB = 2**20
OPTIONS = SyncOptions(part_size=5 * MiB, multipart_threshold=5 * MiB, settle_s=0)


def _tree(directory: Path) -> dict[str, str]:
    """What a reader of the folder sees: each file's SHA-256 (links followed), by relative path."""
    return {
        p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def _own_loop_checkpoint(root: Path, step: int, files: dict[str, bytes]) -> Path:
    """A checkpoint of a user's own loop: the files, then the ``.complete`` marker; settled an hour ago."""
    directory = root / f"checkpoint-{step}"
    for name, data in files.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_bytes(data)
    old = time.time() - 3600
    for path in directory.rglob("*"):
        os.utime(path, (old, old))
    (directory / ".complete").touch()
    os.utime(directory / ".complete", (old + 1, old + 1))
    os.utime(directory, (old, old))
    return directory


def _env(run_env: RunEnv) -> tuple[Any, str, str]:
    return make_s3_client(run_env.s3), run_env.s3.s3_bucket or "", run_env.run()["prefix"]


def test_a_file_behind_a_link_is_synced_and_a_link_to_nothing_keeps_the_checkpoint_in_progress(
    run_env: RunEnv, tmp_path: Path
) -> None:
    s3, bucket, prefix = _env(run_env)
    root, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    elsewhere.mkdir()
    linked = make_checkpoint(root, 100, 6 * MiB, seed=1)
    (linked / "model.safetensors").rename(elsewhere / "model.safetensors")
    (linked / "model.safetensors").symlink_to(elsewhere / "model.safetensors")
    old = time.time() - 7200
    os.utime(linked / "model.safetensors", (old, old), follow_symlinks=False)  # the save made the link first
    reader_sees = _tree(linked)
    result = sync_pass(s3, bucket, prefix, run_env.run_id, root, run_env.api, OPTIONS)
    assert [u.manifest.step for u in result.uploaded] == [100]
    restored = restore_checkpoint(s3, bucket, prefix, run_env.api.choose(100, False), tmp_path / "r1")
    # Durable with the weights the link stands for, restored as a plain file: it was durable without them.
    assert _tree(restored.directory) == reader_sees and not (restored.directory / "model.safetensors").is_symlink()
    assert completeness(restored.directory, 100).complete

    dangling = make_checkpoint(root, 200, 6 * MiB, seed=2)
    (dangling / "model.safetensors").unlink()
    (dangling / "model.safetensors").symlink_to(elsewhere / "gone.safetensors")
    folder = make_checkpoint(root, 300, 6 * MiB, seed=3)
    (folder / "extra").symlink_to(elsewhere)  # a folder behind a link is not walked
    for directory in (dangling, folder):
        for path in [*directory.rglob("*"), directory]:
            os.utime(path, (old, old), follow_symlinks=False)
        os.utime(directory / "trainer_state.json", (old + 1, old + 1))
    result = sync_pass(s3, bucket, prefix, run_env.run_id, root, run_env.api, OPTIONS)
    assert not result.uploaded
    assert result.in_progress[200] == "model.safetensors is a link to a missing file"
    assert "extra is a link to a folder" in result.in_progress[300]
    assert read_manifest(s3, bucket, prefix, 200) is None and read_manifest(s3, bucket, prefix, 300) is None
    assert run_env.run()["last_durable_step"] == 100


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("tab\tname.bin", "must not hold control characters"),
        ("esc\x1b[31m.bin", "must not hold control characters"),
        (os.fsdecode(b"latin1-\xe9.bin"), "not UTF-8"),
        ("/".join(["d" * 200] * 5) + "/f.bin", "over S3's 1024"),
    ],
)
def test_a_name_the_bucket_cannot_hold_refuses_its_step_before_a_byte_and_newer_steps_still_sync(
    run_env: RunEnv, tmp_path: Path, name: str, reason: str
) -> None:
    s3, bucket, prefix = _env(run_env)
    root = tmp_path / "out"
    _own_loop_checkpoint(root, 100, {"model.pt": os.urandom(1000), name: os.urandom(1000)})
    _own_loop_checkpoint(root, 200, {"model.pt": os.urandom(1000)})
    result = sync_pass(s3, bucket, prefix, run_env.run_id, root, run_env.api, OPTIONS)
    assert reason in result.refused[100], result.refused
    assert [u.manifest.step for u in result.uploaded] == [200]
    assert sync.stored_steps(s3, bucket, prefix) == {200}  # nothing of step 100 was sent


def test_a_step_past_what_the_service_records_is_refused_and_the_others_sync(run_env: RunEnv, tmp_path: Path) -> None:
    s3, bucket, prefix = _env(run_env)
    root = tmp_path / "out"
    _own_loop_checkpoint(root, 5, {"model.pt": b"five"})
    (root / "checkpoint-3000000000").mkdir()
    (root / "checkpoint-3000000000" / "model.pt").write_bytes(b"x")
    (root / "checkpoint-3000000000" / ".complete").touch()
    result = sync_pass(s3, bucket, prefix, run_env.run_id, root, run_env.api, OPTIONS)
    assert "past the largest step the service records" in result.refused[3000000000]
    assert [u.manifest.step for u in result.uploaded] == [5]


def test_a_restore_over_an_earlier_partial_folder_holds_only_the_manifests_files(
    run_env: RunEnv, tmp_path: Path
) -> None:
    s3, bucket, prefix = _env(run_env)
    directory = _own_loop_checkpoint(tmp_path / "out", 20, {"a.bin": os.urandom(3000), "sub/b.bin": os.urandom(9000)})
    sync_pass(s3, bucket, prefix, run_env.run_id, directory.parent, run_env.api, OPTIONS)
    # An interrupted restore of another checkpoint of the same name (another run, say) left its files.
    partial = tmp_path / "to" / "checkpoint-20.partial"
    (partial / "a.bin").mkdir(parents=True)  # a folder where the manifest has a file
    (partial / "a.bin" / "x").write_bytes(b"x")
    (partial / "trainer_state.json").write_text("{}")  # would make the copy read as an HF Trainer checkpoint
    (partial / "old").mkdir()
    (partial / "old" / "optimizer.pt").write_bytes(b"stale")
    (partial / "sub").mkdir()
    (partial / "sub" / "b.bin").symlink_to(tmp_path / "not-to-be-written")  # a download never writes through a link
    restored = restore_checkpoint(s3, bucket, prefix, run_env.api.choose(20, False), tmp_path / "to")
    assert _tree(restored.directory) == _tree(directory)
    assert not (tmp_path / "not-to-be-written").exists()


def test_a_restore_of_a_step_whose_object_is_gone_says_so(run_env: RunEnv, tmp_path: Path) -> None:
    s3, bucket, prefix = _env(run_env)
    directory = _own_loop_checkpoint(tmp_path / "out", 20, {"a.bin": os.urandom(3000)})
    sync_pass(s3, bucket, prefix, run_env.run_id, directory.parent, run_env.api, OPTIONS)
    s3.delete_object(Bucket=bucket, Key=f"{step_prefix(prefix, 20)}/a.bin")
    with pytest.raises(RestoreError, match=r"a.bin: not in the bucket .* restore another step with --step"):
        restore_checkpoint(s3, bucket, prefix, run_env.api.choose(20, False), tmp_path / "to")


class _CutAfterOnePart:
    """The S3 client, with the connection lost after the first part of a multipart upload."""

    def __init__(self, s3: Any) -> None:
        self._s3, self.parts = s3, 0

    def upload_part(self, **kwargs: Any) -> Any:
        self.parts += 1
        if self.parts > 1:
            raise ConnectionError("connection lost")
        return self._s3.upload_part(**kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._s3, name)


def test_a_multipart_upload_cut_then_resumed_after_the_file_was_rewritten_starts_afresh(
    run_env: RunEnv, tmp_path: Path
) -> None:
    s3, bucket, prefix = _env(run_env)
    directory = _own_loop_checkpoint(tmp_path / "out", 3, {"big.bin": os.urandom(16 * MiB)})
    with pytest.raises(ConnectionError):
        sync_pass(_CutAfterOnePart(s3), bucket, prefix, run_env.run_id, directory.parent, run_env.api, OPTIONS)
    # The trainer saves step 3 again before it was durable: the upload begun for the old bytes carries their SHA-256.
    _own_loop_checkpoint(tmp_path / "out", 3, {"big.bin": os.urandom(16 * MiB)})
    result = sync_pass(s3, bucket, prefix, run_env.run_id, directory.parent, run_env.api, OPTIONS)
    assert [u.manifest.step for u in result.uploaded] == [3]  # it failed this pass: "does not match the local file"
    restored = restore_checkpoint(s3, bucket, prefix, run_env.api.choose(3, False), tmp_path / "r")
    assert _tree(restored.directory) == _tree(directory)


@pytest.mark.parametrize("victim", [1, 3])
def test_a_folder_rotated_away_while_a_pass_looks_at_it_is_no_error(
    run_env: RunEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, victim: int
) -> None:
    """The Trainer's rotation (save_total_limit) deletes old checkpoints right after a save, as the agent's pass runs:
    step 1 is durable and rotated away, step 3 is new and deleted before it is looked at."""
    s3, bucket, prefix = _env(run_env)
    root = tmp_path / "out"
    for step in (1, 2):
        _own_loop_checkpoint(root, step, {"w.bin": os.urandom(100)})
    sync_pass(s3, bucket, prefix, run_env.run_id, root, run_env.api, OPTIONS)
    _own_loop_checkpoint(root, 3, {"w.bin": os.urandom(100)})
    _own_loop_checkpoint(root, 4, {"w.bin": os.urandom(100)})
    listed = sync.checkpoint_files

    def listing_then_rotation(directory: Path) -> list[Path]:
        files = listed(directory)
        if directory.name == f"checkpoint-{victim}" and directory.exists():
            shutil.rmtree(directory)  # between the listing and the stat of each file
        return files

    monkeypatch.setattr(sync, "checkpoint_files", listing_then_rotation)
    result = sync_pass(s3, bucket, prefix, run_env.run_id, root, run_env.api, OPTIONS)
    assert 4 in [u.manifest.step for u in result.uploaded]
    assert not result.changed
    if victim == 3:
        assert "vanished while this pass looked at it" in result.in_progress[3]


def test_a_diverged_runs_nan_loss_is_no_metric_and_fails_no_pass(run_env: RunEnv, tmp_path: Path) -> None:
    s3, bucket, prefix = _env(run_env)
    directory = make_checkpoint(tmp_path / "out", 100, 6 * MiB, seed=1)
    # transformers writes the log history with json.dumps, which writes a NaN loss as NaN.
    state = '{"global_step": 100, "log_history": [{"step": 50, "eval_loss": 0.5}, {"step": 100, "eval_loss": NaN}]}'
    (directory / "trainer_state.json").write_text(state)
    old = time.time() - 3000
    os.utime(directory / "trainer_state.json", (old, old))
    result = sync_pass(s3, bucket, prefix, run_env.run_id, directory.parent, run_env.api, OPTIONS)
    assert [u.manifest.step for u in result.uploaded] == [100]
    manifest = read_manifest(s3, bucket, prefix, 100)
    assert manifest is not None and manifest.metric is None
    assert run_env.run()["last_durable_step"] == 100


def test_a_file_rewritten_under_its_old_size_and_mtime_is_hashed_anew_after_the_failed_pass(
    run_env: RunEnv, tmp_path: Path
) -> None:
    """A probe: a file changed after a pass hashed it, its size and mtime put back (a copy keeping timestamps), made
    every later pass fail the upload's check until the agent restarted (the hashes are cached by size and mtime).
    The upload that finds the stored bytes differ still fails its step (nothing is made durable), and the next one
    hashes anew."""
    s3, bucket, prefix = _env(run_env)
    directory = _own_loop_checkpoint(tmp_path / "out", 30, {"model.pt": b"a" * 4096})
    weights = directory / "model.pt"
    sync._hash_file(weights, 4096)  # a pass hashed it (and was interrupted before sending)
    stat = weights.stat()
    weights.write_bytes(b"b" * 4096)
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with pytest.raises(sync.FileChanged, match=r"model\.pt changed while it was uploaded"):
        sync.upload_file(s3, bucket, f"{prefix}/x/model.pt", weights, OPTIONS)
    uploaded = sync.upload_file(s3, bucket, f"{prefix}/x/model.pt", weights, OPTIONS)
    assert uploaded.sha256 == hashlib.sha256(b"b" * 4096).hexdigest()
