"""`gpuplan sync` and `gpuplan restore` against a live service and the loopback S3 server."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from services.cli.main import main
from services.storage.s3 import make_s3_client
from tests.conftest import S3_TEST_CREDENTIALS
from tests.runs.conftest import RunEnv, make_checkpoint


@pytest.fixture
def s3_env(run_env: RunEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUPLAN_S3_ENDPOINT_URL", run_env.s3.s3_endpoint_url or "")
    monkeypatch.setenv("GPUPLAN_S3_ACCESS_KEY_ID", S3_TEST_CREDENTIALS["s3_access_key_id"])
    monkeypatch.setenv("GPUPLAN_S3_SECRET_ACCESS_KEY", S3_TEST_CREDENTIALS["s3_secret_access_key"])


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_sync_then_restore_best_and_latest(
    run_env: RunEnv, live_api: str, s3_env: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    for step, loss in ((100, 0.3), (200, 0.6)):
        directory = make_checkpoint(out, step, 6 * 2**20, seed=step)
        (directory / "gpuplan_metric.json").write_text(f'{{"metric": {loss}}}')
    connect = ["--api", live_api, "--key", run_env.key, "--run", run_env.run_id]
    assert main(["sync", *connect, "--dir", str(out), "--settle-s", "0", "--part-mib", "5"]) == 0
    printed = capsys.readouterr().out
    assert "step 100: durable" in printed and "step 200: durable" in printed
    assert run_env.run()["checkpoints"][-1]["final"] is False
    # Training ended: mark the newest (already durable) checkpoint final.
    assert main(["sync", *connect, "--dir", str(out), "--settle-s", "0", "--final"]) == 0
    assert main(["sync", *connect, "--dir", str(out), "--settle-s", "0"]) == 0
    assert "nothing new to sync" in capsys.readouterr().out

    assert main(["restore", *connect, "--to", str(tmp_path / "best"), "--best"]) == 0
    assert "step 100: 6 files" in capsys.readouterr().out
    restored = tmp_path / "best" / "checkpoint-100" / "model.safetensors"
    assert _sha(restored) == _sha(out / "checkpoint-100" / "model.safetensors")
    assert main(["restore", *connect, "--to", str(tmp_path / "latest")]) == 0
    state = (tmp_path / "latest" / "checkpoint-200" / "trainer_state.json").read_text()
    assert state == '{"global_step": 200, "log_history": []}'
    assert main(["restore", *connect, "--to", str(tmp_path / "bucket"), "--from-bucket", "--step", "100"]) == 0
    run = run_env.run()
    assert run["last_durable_step"] == 200 and run["checkpoints"][-1]["final"] is True
    assert run["checkpoints"][-1]["manifest"]["final"] is True


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["restore", "--to", "x", "--step", "999"], "no durable checkpoint"),
        (["sync", "--dir", "/nonexistent/dir", "--settle-s", "0"], "does not exist"),
        (["sync", "--dir", ".", "--settle-s", "-1"], "--settle-s must be at least 0"),
        (["restore", "--to", "x", "--step", "1", "--best"], "not allowed with argument"),
    ],
)
def test_bad_input_is_one_readable_line(
    run_env: RunEnv, live_api: str, s3_env: None, args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    command = [args[0], "--api", live_api, "--key", run_env.key, "--run", run_env.run_id, *args[1:]]
    assert main(command) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and err.startswith("gpuplan: error:") and "\n" not in err


def test_an_unreachable_service_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["sync", "--api", "http://127.0.0.1:1", "--key", "k", "--run", "r", "--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "unreachable" in err and "\n" not in err


def test_a_bucket_that_lost_the_newest_durable_checkpoint_is_refilled_from_the_node_or_reported(
    run_env: RunEnv, live_api: str, s3_env: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A lifecycle probe of stop 49: the bucket's objects of a durable step vanished (a wiped store, a lifecycle rule),
    the API still called it durable, and no pass uploaded the intact local copy again, so a restore had nothing to
    take. Each pass now lists the newest durable step's objects against the API's record of it."""
    out = tmp_path / "out"
    directory = make_checkpoint(out, 100, 6 * 2**20, seed=5)
    connect = ["--api", live_api, "--key", run_env.key, "--run", run_env.run_id]
    assert main(["sync", *connect, "--dir", str(out), "--settle-s", "0", "--part-mib", "5"]) == 0
    assert "step 100: durable" in capsys.readouterr().out
    s3, bucket, prefix = make_s3_client(run_env.s3), run_env.s3.s3_bucket or "", run_env.run()["prefix"]

    def wipe() -> None:
        for item in s3.list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]:
            s3.delete_object(Bucket=bucket, Key=item["Key"])

    wipe()
    assert main(["sync", *connect, "--dir", str(out), "--settle-s", "0"]) == 0
    printed = capsys.readouterr().out
    assert "step 100: the bucket had lost" in printed and "model.safetensors" in printed, printed
    assert main(["restore", *connect, "--to", str(tmp_path / "back")]) == 0
    assert _sha(tmp_path / "back" / "checkpoint-100" / "model.safetensors") == _sha(directory / "model.safetensors")
    # Lost again, and the node's copy changed since: nothing to put back, so one line and a failing exit.
    wipe()
    (directory / "optimizer.pt").write_bytes(b"another state")
    assert main(["sync", *connect, "--dir", str(out), "--settle-s", "0"]) == 1
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "the bucket lost" in captured.err and "step 100" in captured.err
    assert main(["sync", *connect, "--dir", str(out), "--settle-s", "0"]) == 1  # until a person acts


def test_a_step_that_cannot_be_stored_is_said_and_fails_the_command_while_newer_ones_sync(
    run_env: RunEnv, live_api: str, s3_env: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A probe: a file name with a tab sent every file of its step, then failed on the manifest with a pydantic
    traceback, on every pass, and no newer step became durable."""
    out = tmp_path / "out"
    make_checkpoint(out, 100, 6 * 2**20, seed=1)
    (out / "checkpoint-100" / "notes\tfinal.txt").write_text("x")
    os.utime(out / "checkpoint-100" / "notes\tfinal.txt", (0, 0))
    make_checkpoint(out, 200, 6 * 2**20, seed=2)
    connect = ["--api", live_api, "--key", run_env.key, "--run", run_env.run_id]
    assert main(["sync", *connect, "--dir", str(out), "--settle-s", "0", "--part-mib", "5"]) == 1
    printed = capsys.readouterr().out
    assert "step 200: durable" in printed
    assert "step 100: complete, but not stored ('notes\\tfinal.txt': must not hold control characters" in printed
    assert run_env.run()["last_durable_step"] == 200


def test_settings_and_folders_the_cli_cannot_use_are_one_line(
    run_env: RunEnv,
    live_api: str,
    s3_env: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A probe: a bad GPUPLAN_S3_ADDRESSING_STYLE, an endpoint without its scheme, and a checkpoint folder the user
    cannot read each ended `gpuplan sync` (or restore) in a traceback."""
    connect = ["--api", live_api, "--key", run_env.key, "--run", run_env.run_id]
    make_checkpoint(tmp_path / "out", 100, 6 * 2**20, seed=1)
    sync = ["sync", *connect, "--dir", str(tmp_path / "out"), "--settle-s", "0"]
    monkeypatch.setenv("GPUPLAN_S3_ADDRESSING_STYLE", "sideways")
    with pytest.raises(SystemExit) as exited:
        main(sync)
    assert str(exited.value.code).startswith("gpuplan: error: GPUPLAN_S3_ADDRESSING_STYLE: Input should be")
    monkeypatch.delenv("GPUPLAN_S3_ADDRESSING_STYLE")
    monkeypatch.setenv("GPUPLAN_S3_ENDPOINT_URL", "127.0.0.1:9000")
    for command in (sync, ["restore", *connect, "--to", str(tmp_path / "r")]):
        assert main(command) == 2
        err = capsys.readouterr().err.strip()
        assert "GPUPLAN_S3_ENDPOINT_URL" in err and "Invalid endpoint: 127.0.0.1:9000" in err and "\n" not in err
    monkeypatch.setenv("GPUPLAN_S3_ENDPOINT_URL", run_env.s3.s3_endpoint_url or "")

    def unreadable(directory: Path) -> list[Path]:
        raise PermissionError(13, "Permission denied", str(directory))

    monkeypatch.setattr("services.runs.sync.checkpoint_files", unreadable)
    assert main(sync) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"gpuplan: error: sync: {tmp_path / 'out' / 'checkpoint-100'}: Permission denied"


def test_the_console_command_says_a_lost_step_once_on_stderr(run_env: RunEnv, live_api: str, tmp_path: Path) -> None:
    """A probe: `gpuplan sync` configured no logging, so the pass's records reached stderr bare (logging's last resort)
    beside the command's own error line: a lost step was said twice. Run as a user runs it, the console script in its
    own process."""
    out = tmp_path / "out"
    directory = make_checkpoint(out, 100, 6 * 2**20, seed=5)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPLAN_")}
    env.update(
        PYTHONPATH=str(Path(__file__).resolve().parents[2]),
        GPUPLAN_API_KEY=run_env.key,
        GPUPLAN_S3_ENDPOINT_URL=run_env.s3.s3_endpoint_url or "",
        GPUPLAN_S3_ACCESS_KEY_ID=S3_TEST_CREDENTIALS["s3_access_key_id"],
        GPUPLAN_S3_SECRET_ACCESS_KEY=S3_TEST_CREDENTIALS["s3_secret_access_key"],
    )
    gpuplan = Path(sys.executable).parent / "gpuplan"
    command = [str(gpuplan), "sync", "--api", live_api, "--run", run_env.run_id, "--dir", str(out), "--settle-s", "0"]

    def sync() -> subprocess.CompletedProcess[str]:
        return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, stdin=subprocess.DEVNULL)

    first = sync()
    assert first.returncode == 0 and "step 100: durable" in first.stdout and first.stderr == "", first.stderr
    s3, bucket, prefix = make_s3_client(run_env.s3), run_env.s3.s3_bucket or "", run_env.run()["prefix"]
    for item in s3.list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]:
        s3.delete_object(Bucket=bucket, Key=item["Key"])
    (directory / "optimizer.pt").write_bytes(b"another state")
    lost = sync()
    assert lost.returncode == 1
    lines = lost.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuplan sync: the bucket lost 5 files of durable step 100"), lines
    assert lines[0].endswith("the API still lists it durable; restore an older step"), lines


def _evaluated(directory: Path, step: int, evaluations: dict[int, float]) -> None:
    """The checkpoint's trainer_state.json as the Trainer writes it: the evaluations logged up to its step."""
    history = [{"step": s, "eval_loss": loss} for s, loss in sorted(evaluations.items()) if s <= step]
    (directory / "trainer_state.json").write_text(json.dumps({"global_step": step, "log_history": history}))


def _connect(run_env: RunEnv, live_api: str, run_id: str) -> list[str]:
    return ["--api", live_api, "--key", run_env.key, "--run", run_id]


def test_a_checkpoint_saved_between_evaluations_has_no_metric_and_the_evaluated_best_is_kept(
    run_env: RunEnv, live_api: str, s3_env: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Saves every 50 steps, evaluations every 100: checkpoint-250 took step 200's loss, ranked best on the tie (the
    # newer), and retention deleted checkpoint-200, the one evaluated (a lifecycle probe).
    run_id = run_env.new_run(retention={"keep_last": 1, "keep_best": True, "metric_mode": "min"})
    out, evaluations = tmp_path / "out", {100: 0.9, 200: 0.2, 300: 0.5, 400: 0.6}
    for step in range(50, 401, 50):
        _evaluated(make_checkpoint(out, step, 1 * 2**20, seed=step), step, evaluations)
    assert main(["sync", *_connect(run_env, live_api, run_id), "--dir", str(out), "--settle-s", "0"]) == 0
    capsys.readouterr()
    run = run_env.client.get(f"/v1/runs/{run_id}", headers=run_env.headers).json()
    checkpoints = {c["step"]: c for c in run["checkpoints"]}
    assert run["best_step"] == 200 and checkpoints[200]["status"] == "durable"
    assert checkpoints[250]["metric"] is None and checkpoints[200]["metric"] == 0.2


def test_a_metric_file_written_after_an_evaluated_checkpoint_became_durable_replaces_its_eval_loss(
    run_env: RunEnv, live_api: str, s3_env: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The manifest's eval_loss stood against the script's own metric file, and retention deleted the step it named best.
    run_id = run_env.new_run(retention={"keep_last": 2, "keep_best": True, "metric_mode": "min"})
    out, connect = tmp_path / "out", _connect(run_env, live_api, run_id)
    for step, loss in ((100, 0.9), (200, 0.5)):
        _evaluated(make_checkpoint(out, step, 1 * 2**20, seed=step), step, {step: loss})
    assert main(["sync", *connect, "--dir", str(out), "--settle-s", "0"]) == 0
    (out / "checkpoint-100" / "gpuplan_metric.json").write_text('{"metric": 0.1}')
    assert main(["sync", *connect, "--dir", str(out), "--settle-s", "0"]) == 0
    for step in (300, 400):
        _evaluated(make_checkpoint(out, step, 1 * 2**20, seed=step), step, {step: 0.6})
    assert main(["sync", *connect, "--dir", str(out), "--settle-s", "0"]) == 0
    capsys.readouterr()
    run = run_env.client.get(f"/v1/runs/{run_id}", headers=run_env.headers).json()
    checkpoints = {c["step"]: c for c in run["checkpoints"]}
    assert run["best_step"] == 100 and checkpoints[100]["status"] == "durable" and checkpoints[100]["metric"] == 0.1
    assert checkpoints[200]["status"] == "deleted"


def test_sync_final_waits_for_the_checkpoint_just_written_and_fails_without_it(
    run_env: RunEnv, live_api: str, s3_env: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `train && gpuplan sync --final && shutdown`: the checkpoint written a moment ago was "still being written", the
    # pass exited 0, and the finished model was left on the node (a lifecycle probe).
    out, connect = tmp_path / "out", _connect(run_env, live_api, run_env.run_id)
    make_checkpoint(out, 600, 1 * 2**20, seed=6, settled=False)
    assert main(["sync", *connect, "--dir", str(out), "--settle-s", "1", "--final"]) == 0
    assert "step 600: durable" in capsys.readouterr().out
    run = run_env.client.get(f"/v1/runs/{run_env.run_id}", headers=run_env.headers).json()
    (final,) = [c for c in run["checkpoints"] if c["step"] == 600]
    assert final["status"] == "durable" and final["final"]
    # One the pass cannot make durable (its weights' index names a shard not written) fails the command.
    broken = make_checkpoint(out, 700, 1 * 2**20, seed=7)
    (broken / "model.safetensors.index.json").write_text('{"weight_map": {"w": "model-00002-of-00002.safetensors"}}')
    assert main(["sync", *connect, "--dir", str(out), "--settle-s", "0", "--final"]) == 1
    assert "--final: the newest checkpoint, step 700, is not durable" in capsys.readouterr().err
