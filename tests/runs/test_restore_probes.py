"""`gpuplan restore` as the user runs it (a subprocess against a live API and the loopback bucket)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from services.runs.manifest import MANIFEST_NAME, step_prefix
from services.runs.sync import BucketOnly, SyncOptions, sync_pass
from services.storage.s3 import make_s3_client
from tests.runs.conftest import RunEnv, make_checkpoint

MiB = 2**20
OPTIONS = SyncOptions(part_size=5 * MiB, multipart_threshold=5 * MiB, settle_s=0)
GPUPLAN = [sys.executable, "-m", "services.cli.main"]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _two_durable_steps(env: RunEnv, out: Path) -> None:
    """Steps 100 (the best: loss 0.3) and 200 (loss 0.6), both durable."""
    for step, loss in ((100, 0.3), (200, 0.6)):
        directory = make_checkpoint(out, step, 2 * MiB, seed=step)
        (directory / "gpuplan_metric.json").write_text(f'{{"metric": {loss}}}')
    s3, run = make_s3_client(env.s3), env.run()
    result = sync_pass(s3, run["bucket"], run["prefix"], env.run_id, out, env.api, OPTIONS)
    assert sorted(u.manifest.step for u in result.uploaded) == [100, 200]
    assert env.run()["best_step"] == 100


def _damage_manifest(env: RunEnv, step: int, damaged: Callable[[bytes], bytes]) -> None:
    """Replace the step's manifest in the bucket with ``damaged`` of its bytes."""
    s3, run = make_s3_client(env.s3), env.run()
    key = f"{step_prefix(run['prefix'], step)}/{MANIFEST_NAME}"
    body = s3.get_object(Bucket=run["bucket"], Key=key)["Body"].read()
    s3.put_object(Bucket=run["bucket"], Key=key, Body=damaged(body))


def _restore(env: RunEnv, api: str, cli_env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    command = [*GPUPLAN, "restore", "--api", api, "--key", env.key, "--run", env.run_id, *args]
    return subprocess.run(command, env=cli_env, capture_output=True, text=True, timeout=120)


def test_restore_best_from_the_bucket_restores_the_best_not_the_latest(
    run_env: RunEnv, live_api: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    _two_durable_steps(run_env, out)
    done = _restore(run_env, live_api, cli_env, "--to", str(tmp_path / "r"), "--from-bucket", "--best")
    assert done.returncode == 0, done.stderr
    assert "step 100:" in done.stdout, done.stdout
    restored = tmp_path / "r" / "checkpoint-100" / "model.safetensors"
    assert _sha(restored) == _sha(out / "checkpoint-100" / "model.safetensors")
    assert not (tmp_path / "r" / "checkpoint-200").exists()


def test_a_truncated_manifest_is_one_line_naming_it_not_a_traceback(
    run_env: RunEnv, live_api: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    _two_durable_steps(run_env, out)
    _damage_manifest(run_env, 200, lambda body: body[: len(body) // 2])  # cut short (a bad copy, bit rot)
    for args in (["--to", str(tmp_path / "a")], ["--to", str(tmp_path / "b"), "--from-bucket"]):
        done = _restore(run_env, live_api, cli_env, *args)
        assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "manifest" in lines[0] and "step 200" in lines[0], done.stderr
        assert not (tmp_path / "a" / "checkpoint-200").exists()
    # An older step, whose manifest is whole, still restores.
    done = _restore(run_env, live_api, cli_env, "--to", str(tmp_path / "c"), "--step", "100")
    assert done.returncode == 0, done.stderr


def test_a_damaged_manifest_of_a_durable_step_does_not_stop_newer_checkpoints_from_syncing(
    run_env: RunEnv, live_api: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    _two_durable_steps(run_env, out)
    _damage_manifest(run_env, 200, lambda _: b'{"version": 1, "run_id": ')
    make_checkpoint(out, 300, 2 * MiB, seed=300)  # training goes on; a new node's `gpuplan sync` (no cache) runs
    command = [*GPUPLAN, "sync", "--api", live_api, "--key", run_env.key, "--run", run_env.run_id, "--dir", str(out),
               "--settle-s", "0", "--part-mib", "5"]  # fmt: skip
    done = subprocess.run(command, env=cli_env, capture_output=True, text=True, timeout=120)
    assert "Traceback" not in done.stderr, done.stderr
    assert "step 300: durable" in done.stdout, (done.stdout, done.stderr)
    assert run_env.run()["last_durable_step"] == 300
    # The damaged step is said, once, and fails the command: someone has to look at it.
    assert done.returncode == 1 and done.stderr.count("step 200") == 1, done.stderr
    restored = _restore(run_env, live_api, cli_env, "--to", str(tmp_path / "r"))
    assert restored.returncode == 0 and "step 300:" in restored.stdout, restored.stderr


def _sync(env: RunEnv, api: str, cli_env: dict[str, str], out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`gpuplan sync` as a new node runs it (a process of its own: no manifest cached)."""
    command = [*GPUPLAN, "sync", "--api", api, "--key", env.key, "--run", env.run_id, "--dir", str(out),
               "--settle-s", "0", "--part-mib", "5", *args]  # fmt: skip
    return subprocess.run(command, env=cli_env, capture_output=True, text=True, timeout=120)


def test_a_damaged_manifest_of_a_step_the_service_does_not_know_is_said_and_the_others_sync(
    run_env: RunEnv, live_api: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    """A damaged manifest of a step the service never recorded (and of one no local folder holds) failed the whole
    pass, through the API and against the bucket alone: no newer checkpoint became durable."""
    out = tmp_path / "out"
    _two_durable_steps(run_env, out)
    s3, run = make_s3_client(run_env.s3), run_env.run()
    for step in (250, 300):  # 250: no local folder, older than the newest durable step (looked at as an orphan)
        key = f"{step_prefix(run['prefix'], step)}/{MANIFEST_NAME}"
        s3.put_object(Bucket=run["bucket"], Key=key, Body=b'{"version": 1, "run_id": ')
    make_checkpoint(out, 300, 2 * MiB, seed=300)
    make_checkpoint(out, 400, 2 * MiB, seed=400)
    done = _sync(run_env, live_api, cli_env, out)
    assert "Traceback" not in done.stderr, done.stderr
    assert "step 400: durable" in done.stdout, (done.stdout, done.stderr)
    lines = done.stderr.splitlines()
    assert done.returncode == 1 and len(lines) == 1 and "step 300" in lines[0], done.stderr
    assert "is not a readable manifest" in lines[0], done.stderr
    assert run_env.run()["last_durable_step"] == 400
    key = f"{step_prefix(run['prefix'], 250)}/{MANIFEST_NAME}"
    assert s3.get_object(Bucket=run["bucket"], Key=key)["Body"].read() == b'{"version": 1, "run_id": '  # kept
    # Against the bucket alone (the node-side guard's final sync), too.
    make_checkpoint(out, 500, 2 * MiB, seed=500)
    alone = BucketOnly(s3, run["bucket"], run["prefix"])
    result = sync_pass(s3, run["bucket"], run["prefix"], run_env.run_id, out, alone, OPTIONS)
    assert [u.manifest.step for u in result.uploaded] == [500] and list(result.lost) == [300]
    assert sorted(result.already_durable) == [100, 200, 400]


def test_a_durable_step_with_a_damaged_manifest_is_lost_not_also_already_durable(
    run_env: RunEnv, live_api: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    """The pass reported such a step in both `already_durable` and `lost` (`gpuplan sync --json` showed both)."""
    out = tmp_path / "out"
    _two_durable_steps(run_env, out)
    _damage_manifest(run_env, 200, lambda body: body[: len(body) // 2])
    done = _sync(run_env, live_api, cli_env, out, "--json")
    assert done.returncode == 1, done.stderr
    printed = json.loads(done.stdout)
    assert printed["already_durable"] == [100] and list(printed["lost"]) == ["200"], printed
    # The text says it once, on stderr, and not that all is synced.
    done = _sync(run_env, live_api, cli_env, out)
    assert done.returncode == 1 and done.stderr.count("step 200") == 1, done.stderr
    assert "nothing new to sync" not in done.stdout, done.stdout
    # Against the bucket alone, where that step is the newest with a manifest, the same.
    s3, run = make_s3_client(run_env.s3), run_env.run()
    alone = BucketOnly(s3, run["bucket"], run["prefix"])
    result = sync_pass(s3, run["bucket"], run["prefix"], run_env.run_id, out, alone, OPTIONS)
    assert result.already_durable == [100] and list(result.lost) == [200]


def test_marking_final_a_durable_step_whose_manifest_was_damaged_since_it_was_read_is_said_not_raised(
    run_env: RunEnv, tmp_path: Path
) -> None:
    """The final pass re-reads the newest durable step's manifest to mark it final, outside the damaged-manifest
    handling: damaged after this process had read it, it failed the whole final pass."""
    out = tmp_path / "out"
    _two_durable_steps(run_env, out)
    s3, run = make_s3_client(run_env.s3), run_env.run()
    again = sync_pass(s3, run["bucket"], run["prefix"], run_env.run_id, out, run_env.api, OPTIONS)
    assert again.already_durable == [100, 200]  # this process has read both manifests now
    _damage_manifest(run_env, 200, lambda body: body[:10])
    result = sync_pass(s3, run["bucket"], run["prefix"], run_env.run_id, out, run_env.api, OPTIONS, final=True)
    assert list(result.lost) == [200] and "step 200" in result.lost[200], result.lost
    assert result.already_durable == [100]
