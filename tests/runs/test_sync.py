"""Checkpoint sync and restore against an S3-compatible server over real HTTP, with the connection cut."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from services.core.settings import Settings
from services.runs.manifest import step_prefix
from services.runs.restore import RestoreError, restore_checkpoint
from services.runs.sync import SyncOptions, read_manifest, stored_steps, sync_pass
from services.storage.s3 import make_s3_client
from tests.runs.conftest import RunEnv, make_checkpoint
from tests.runs.proxy import CuttingProxy

MiB = 2**20


def _sha(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(8 * MiB):
            digest.update(chunk)
    return digest.hexdigest()


def _object_sha(s3: Any, bucket: str, key: str) -> str:
    digest = hashlib.sha256()
    body = s3.get_object(Bucket=bucket, Key=key)["Body"]
    while chunk := body.read(8 * MiB):
        digest.update(chunk)
    return digest.hexdigest()


@pytest.fixture
def proxy(s3_settings: Settings) -> Any:
    endpoint = urlparse(s3_settings.s3_endpoint_url)
    proxy = CuttingProxy((endpoint.hostname or "127.0.0.1", endpoint.port or 80))
    yield proxy
    proxy.close()


def _through(proxy: CuttingProxy, settings: Settings, max_attempts: int) -> Any:
    return make_s3_client(settings.model_copy(update={"s3_endpoint_url": proxy.url}), max_attempts=max_attempts)


class PartLog:
    """Records every UploadPart the store acknowledged (key, part number), through botocore's events."""

    def __init__(self, s3: Any) -> None:
        self.acknowledged: list[tuple[str, int]] = []
        s3.meta.events.register("before-parameter-build.s3.UploadPart", self._before)
        s3.meta.events.register("after-call.s3.UploadPart", self._after)

    def _before(self, params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        context["gpuplan_part"] = (params["Key"], params["PartNumber"])

    def _after(self, http_response: Any, context: dict[str, Any], **_: Any) -> None:
        if http_response.status_code == 200:
            self.acknowledged.append(context["gpuplan_part"])


def _unconfirmed_bytes(s3: Any, bucket: str, prefix: str, total: int) -> int:
    """Bytes of the checkpoint the bucket does not hold yet (finished objects and uploaded parts)."""
    held = sum(o["Size"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", []))
    for upload in s3.list_multipart_uploads(Bucket=bucket, Prefix=prefix).get("Uploads", []):
        parts = s3.list_parts(Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"]).get("Parts", [])
        held += sum(p["Size"] for p in parts)
    return max(0, total - held)


def _assert_identical(s3: Any, env: RunEnv, prefix: str, directory: Path) -> None:
    manifest = read_manifest(s3, env.s3.s3_bucket or "", prefix, int(directory.name.split("-")[1]))
    assert manifest is not None
    local = sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file())
    assert sorted(f.path for f in manifest.files) == local
    for entry in manifest.files:
        assert entry.sha256 == _sha(directory / entry.path)
        key = f"{step_prefix(prefix, manifest.step)}/{entry.path}"
        assert _object_sha(s3, env.s3.s3_bucket or "", key) == entry.sha256


def test_a_multi_hundred_mb_checkpoint_survives_20_cuts_without_resending_finished_parts(
    run_env: RunEnv, proxy: CuttingProxy, tmp_path: Path
) -> None:
    env, bucket = run_env, run_env.s3.s3_bucket or ""
    prefix = env.run()["prefix"]
    directory = make_checkpoint(tmp_path / "ckpt", 500, 320 * MiB, seed=7)
    total = sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())
    direct = make_s3_client(env.s3)
    cut_client = _through(proxy, env.s3, max_attempts=1)  # a cut ends the pass: the next one resumes
    log = PartLog(cut_client)
    options = SyncOptions(part_size=16 * MiB, multipart_threshold=16 * MiB, settle_s=0, concurrency=4)
    rng = random.Random(2026)
    cut_passes = 0
    for _trial in range(40):
        if cut_passes == 20:
            break
        # Twenty cuts spread over the whole upload: each lands at a random byte of the next share of
        # what the bucket does not hold yet (a part, the completion, or the manifest).
        remaining = _unconfirmed_bytes(direct, bucket, prefix, total)
        proxy.cut_after(rng.randint(1, remaining // (20 - cut_passes) + 64 * 1024))
        try:
            sync_pass(cut_client, bucket, prefix, env.run_id, tmp_path / "ckpt", env.api, options)
        except Exception:
            cut_passes += 1
            assert env.run()["last_durable_step"] is None  # interrupted: not durable
        else:
            break  # the pass finished before the cut point: the checkpoint is complete
        finally:
            proxy.disarm()
    assert cut_passes == 20 and proxy.cuts == 20, (cut_passes, proxy.cuts)
    # Every pass was cut, so the service never heard of step 500; whether the bucket already holds its
    # manifest (the last cut fell after the store wrote it) decides what the resuming pass must do.
    manifest_in_bucket = read_manifest(direct, bucket, prefix, 500) is not None
    result = sync_pass(cut_client, bucket, prefix, env.run_id, tmp_path / "ckpt", env.api, options)
    run = env.run()
    assert run["last_durable_step"] == 500
    assert result.already_durable == []  # durable means the service recorded it, and it had not
    if manifest_in_bucket:
        assert result.uploaded == []  # only reported: nothing is sent again
    else:
        assert [u.manifest.step for u in result.uploaded] == [500]
    # No part the store acknowledged was ever sent again.
    assert len(log.acknowledged) == len(set(log.acknowledged)), "a finished part was re-uploaded"
    _assert_identical(direct, env, prefix, directory)
    assert not direct.list_multipart_uploads(Bucket=bucket, Prefix=prefix).get("Uploads")


def test_twenty_five_random_cuts_each_end_complete_and_byte_identical(
    run_env: RunEnv, proxy: CuttingProxy, tmp_path: Path
) -> None:
    env, bucket = run_env, run_env.s3.s3_bucket or ""
    prefix = env.run()["prefix"]
    direct = make_s3_client(env.s3)
    cut_client = _through(proxy, env.s3, max_attempts=1)
    log = PartLog(cut_client)
    options = SyncOptions(part_size=5 * MiB, multipart_threshold=5 * MiB, settle_s=0, concurrency=2)
    rng = random.Random(11)
    root = tmp_path / "ckpt"
    cuts_landed = 0
    for trial in range(25):
        step = (trial + 1) * 10
        directory = make_checkpoint(root, step, rng.randint(6, 16) * MiB, seed=trial)
        total = sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())
        proxy.cut_after(rng.randint(1, total + 4096))
        try:
            sync_pass(cut_client, bucket, prefix, env.run_id, root, env.api, options)
        except Exception:
            cuts_landed += 1
            assert env.run()["last_durable_step"] in (None, step - 10 if step > 10 else None)
        finally:
            proxy.disarm()
        sync_pass(cut_client, bucket, prefix, env.run_id, root, env.api, options)
        assert env.run()["last_durable_step"] == step
        restored = restore_checkpoint(
            direct, bucket, prefix, env.api.choose(step, False), tmp_path / f"restore-{trial}"
        )
        for path in directory.rglob("*"):
            if path.is_file():
                assert _sha(path) == _sha(restored.directory / path.relative_to(directory))
    assert cuts_landed >= 20, cuts_landed
    assert len(log.acknowledged) == len(set(log.acknowledged)), "a finished part was re-uploaded"


def test_retries_absorb_503s_and_a_dropped_connection_within_one_pass(
    run_env: RunEnv, proxy: CuttingProxy, tmp_path: Path
) -> None:
    env, bucket = run_env, run_env.s3.s3_bucket or ""
    prefix = env.run()["prefix"]
    make_checkpoint(tmp_path / "ckpt", 100, 12 * MiB, seed=3)
    client = _through(proxy, env.s3, max_attempts=6)
    proxy.cut_after(7 * MiB)
    proxy.fail_connections(2)
    options = SyncOptions(part_size=5 * MiB, multipart_threshold=5 * MiB, settle_s=0, concurrency=1)
    result = sync_pass(client, bucket, prefix, env.run_id, tmp_path / "ckpt", env.api, options)
    assert [u.manifest.step for u in result.uploaded] == [100]
    assert proxy.cuts == 1 and proxy.failed_with_503 >= 1
    _assert_identical(make_s3_client(env.s3), env, prefix, tmp_path / "ckpt" / "checkpoint-100")


def test_a_crash_between_data_and_manifest_leaves_the_previous_checkpoint_restorable(
    run_env: RunEnv, tmp_path: Path
) -> None:
    env, bucket = run_env, run_env.s3.s3_bucket or ""
    prefix = env.run()["prefix"]
    s3 = make_s3_client(env.s3)
    root = tmp_path / "ckpt"
    options = SyncOptions(part_size=5 * MiB, multipart_threshold=5 * MiB, settle_s=0)
    first = make_checkpoint(root, 100, 8 * MiB, seed=1)
    sync_pass(s3, bucket, prefix, env.run_id, root, env.api, options)
    make_checkpoint(root, 200, 8 * MiB, seed=2)

    def crash() -> None:
        raise RuntimeError("power lost between the data and the manifest")

    with pytest.raises(RuntimeError, match="power lost"):
        sync_pass(s3, bucket, prefix, env.run_id, root, env.api, options, before_manifest=crash)
    run = env.run()
    assert run["last_durable_step"] == 100
    assert read_manifest(s3, bucket, prefix, 200) is None
    assert 200 in stored_steps(s3, bucket, prefix)  # its data is there, but it is not durable
    restored = restore_checkpoint(s3, bucket, prefix, env.api.choose(None, False), tmp_path / "restore")
    assert restored.step == 100
    assert _sha(restored.directory / "model.safetensors") == _sha(first / "model.safetensors")
    # The next pass completes step 200 without sending its data again.
    result = sync_pass(s3, bucket, prefix, env.run_id, root, env.api, options)
    assert [u.manifest.step for u in result.uploaded] == [200]
    assert all(f.skipped and not f.parts_sent for f in result.uploaded[0].files)
    assert env.run()["last_durable_step"] == 200


def _write_metric(directory: Path, value: float) -> None:
    (directory / "gpuplan_metric.json").write_text(f'{{"metric": {value!r}}}')


def test_retention_keeps_the_last_and_the_best_and_deletes_only_after_a_newer_one_is_durable(
    run_env: RunEnv, tmp_path: Path
) -> None:
    env, bucket = run_env, run_env.s3.s3_bucket or ""
    run_id = env.new_run(retention={"keep_last": 1, "keep_best": True, "metric_mode": "min"})
    api = env.api.__class__(env.client, env.key, run_id)
    prefix = api.run()["prefix"]
    s3 = make_s3_client(env.s3)
    root = tmp_path / "ckpt"
    options = SyncOptions(settle_s=0)
    for step, loss in ((100, 0.9), (200, 0.5), (300, 0.7), (400, 0.8)):
        directory = make_checkpoint(root, step, 2 * MiB, seed=step, settled=False)
        _write_metric(directory, loss)
        sync_pass(s3, bucket, prefix, run_id, root, api, options)
    run = api.run()
    states = {c["step"]: c["status"] for c in run["checkpoints"]}
    assert states == {100: "deleted", 200: "durable", 300: "deleted", 400: "durable"}
    assert run["best_step"] == 200 and run["last_durable_step"] == 400
    assert stored_steps(s3, bucket, prefix) == {200, 400}
    assert all(p.exists() for p in root.iterdir())  # nothing local is ever deleted
    restored = restore_checkpoint(s3, bucket, prefix, api.choose(None, True), tmp_path / "best")
    assert restored.step == 200
    # The newest durable checkpoint can never be marked deleted.
    response = env.client.post(f"/v1/runs/{run_id}/checkpoints/400/deleted", headers=env.headers)
    assert response.status_code == 409


def test_restore_refuses_a_corrupted_object_and_resumes_a_partial_download(run_env: RunEnv, tmp_path: Path) -> None:
    env, bucket = run_env, run_env.s3.s3_bucket or ""
    prefix = env.run()["prefix"]
    s3 = make_s3_client(env.s3)
    root = tmp_path / "ckpt"
    directory = make_checkpoint(root, 100, 12 * MiB, seed=5)
    sync_pass(s3, bucket, prefix, env.run_id, root, env.api, SyncOptions(settle_s=0))
    manifest = env.api.choose(None, False)

    # A partial download from an earlier attempt: only the rest is fetched.
    partial = tmp_path / "to" / "checkpoint-100.partial"
    partial.mkdir(parents=True)
    data = (directory / "model.safetensors").read_bytes()
    (partial / "model.safetensors").write_bytes(data[: len(data) // 2])
    result = restore_checkpoint(s3, bucket, prefix, manifest, tmp_path / "to")
    assert result.bytes_downloaded < result.bytes - len(data) // 3
    assert _sha(result.directory / "model.safetensors") == _sha(directory / "model.safetensors")

    # Bytes changed in the bucket (same size): refused, and no directory that looks complete.
    key = f"{step_prefix(prefix, 100)}/optimizer.pt"
    s3.put_object(Bucket=bucket, Key=key, Body=b"x" * (directory / "optimizer.pt").stat().st_size)
    with pytest.raises(RestoreError, match="checksum mismatch"):
        restore_checkpoint(s3, bucket, prefix, manifest, tmp_path / "again")
    assert not (tmp_path / "again" / "checkpoint-100").exists()


def test_an_unsettled_directory_waits_for_the_trainer(run_env: RunEnv, tmp_path: Path) -> None:
    env, bucket = run_env, run_env.s3.s3_bucket or ""
    make_checkpoint(tmp_path / "ckpt", 100, MiB, seed=1, settled=False)
    s3 = make_s3_client(env.s3)
    result = sync_pass(
        s3, bucket, env.run()["prefix"], env.run_id, tmp_path / "ckpt", env.api, SyncOptions(settle_s=60)
    )
    assert result.unsettled == [100] and not result.uploaded
    assert env.run()["last_durable_step"] is None
