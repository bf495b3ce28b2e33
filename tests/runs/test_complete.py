"""Complete checkpoints only (issue 25.1): each framework's layout written file by file, with pauses
longer than the settle time and crashes mid-file, against moto's S3 server over loopback HTTP.

The files are real: torch.save archives and safetensors files from the installed libraries, in the
order each framework writes them (transformers Trainer._save_checkpoint, DeepSpeedEngine.save_checkpoint,
torchtune FullModelHFCheckpointer.save_checkpoint 0.6, LitGPT finetune/lora.py).
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save as safetensors_bytes

from services.agent.node import RunSync
from services.core.db import make_sessionmaker, unit_of_work
from services.nodes.drivers import NodeTarget
from services.nodes.lifecycle import sweep
from services.runs.complete import completeness
from services.runs.manifest import step_of, step_prefix
from services.runs.restore import RestoreError, restore_checkpoint
from services.runs.sync import SyncOptions, pending_steps, read_manifest, stored_steps, sync_pass
from services.storage.s3 import make_s3_client
from tests.nodes.helpers import SLOW_AGENT
from tests.runs.conftest import RunEnv

SETTLE_S = 60.0
PAUSE_S = 90.0  # between two files: longer than the settle time


def _pt(n_floats: int, seed: int) -> bytes:
    buffer = io.BytesIO()
    generator = torch.Generator().manual_seed(seed)
    torch.save({"state": torch.rand(n_floats, generator=generator), "step": seed}, buffer)
    return buffer.getvalue()


def _recipe_state(epoch: int, total_epochs: int) -> bytes:
    """torchtune's recipe_state.pt after ``epoch``: TrainingProgress.state_dict() and the optimizer."""
    buffer = io.BytesIO()
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1_500_000))])
    optimizer.param_groups[0]["params"][0].grad = torch.ones(1_500_000)
    optimizer.step()
    state = {"seed": 1, "epochs_run": epoch + 1, "total_epochs": total_epochs, "max_steps_per_epoch": None}
    torch.save({**state, "dataloader": {}, "optimizer": optimizer.state_dict()}, buffer)
    return buffer.getvalue()


def _st(n_floats: int, seed: int) -> bytes:
    generator = torch.Generator().manual_seed(seed)
    return safetensors_bytes({"weight": torch.rand(n_floats, generator=generator)})


@dataclass(frozen=True)
class Layout:
    """How a framework writes the checkpoint of ``step`` under the output directory, in order. ``big`` is
    the file a crash cuts in half; the last write is what makes it complete."""

    name: str
    dir_name: Callable[[int], str]
    writes: Callable[[int], list[tuple[str, bytes]]]  # (path relative to the output directory, bytes)
    big: str  # a path fragment of the file a crash cuts short


def _hf(step: int, deepspeed: bool = False) -> list[tuple[str, bytes]]:
    d = f"checkpoint-{step}"
    files = [(f"{d}/model.safetensors", _st(200_000, step)), (f"{d}/config.json", b'{"model_type": "llama"}')]
    files.append((f"{d}/training_args.bin", _pt(10, step)))
    if deepspeed:  # the optimizer step is engine.save_checkpoint(checkpoint-N): shards, then `latest`
        files += [
            (f"{d}/global_step{step}/mp_rank_00_model_states.pt", _pt(100_000, step)),
            (f"{d}/global_step{step}/zero_pp_rank_0_mp_rank_00_optim_states.pt", _pt(1_500_000, step)),
            (f"{d}/latest", f"global_step{step}".encode()),
        ]
    else:
        files.append((f"{d}/optimizer.pt", _pt(1_500_000, step)))  # ~6 MB, like the tester's
    files += [(f"{d}/scheduler.pt", _pt(4, step)), (f"{d}/rng_state.pth", _pt(16, step))]
    state = f'{{"global_step": {step}, "log_history": [{{"step": {step}, "eval_loss": 0.5}}]}}'
    return [*files, (f"{d}/trainer_state.json", state.encode())]


LAYOUTS = [
    Layout("hf-trainer", lambda s: f"checkpoint-{s}", _hf, "optimizer.pt"),
    Layout("hf-trainer+deepspeed", lambda s: f"checkpoint-{s}", lambda s: _hf(s, deepspeed=True), "optim_states"),
    Layout(
        "deepspeed",
        lambda s: f"global_step{s}",
        lambda s: [
            (f"global_step{s}/mp_rank_00_model_states.pt", _pt(100_000, s)),
            (f"global_step{s}/zero_pp_rank_0_mp_rank_00_optim_states.pt", _pt(1_500_000, s)),
            ("latest", f"global_step{s}".encode()),  # beside the tag directories, written last
        ],
        "optim_states",
    ),
    Layout(
        "torchtune",
        lambda s: f"epoch_{s}",
        lambda s: [
            (f"epoch_{s}/adapter_model.pt", _pt(300_000, s)),
            (f"epoch_{s}/adapter_model.safetensors", _st(300_000, s)),
            (f"epoch_{s}/adapter_config.json", b'{"r": 8, "peft_type": "LORA"}'),
            (f"epoch_{s}/config.json", b'{"model_type": "llama"}'),  # copy_files from the base checkpoint
            ("recipe_state/recipe_state.pt", _recipe_state(s, 10)),  # intermediate epochs: after epoch_N
        ],
        "adapter_model.safetensors",
    ),
    Layout(
        "litgpt",
        lambda s: f"step-{s:06d}",
        lambda s: [
            (f"step-{s:06d}/lit_model.pth.lora", _pt(1_500_000, s)),
            (f"step-{s:06d}/model_config.yaml", b"name: pythia-14m\n"),  # copy_config_files
            (f"step-{s:06d}/tokenizer.json", b"{}"),
            (f"step-{s:06d}/hyperparameters.yaml", b"precision: bf16-true\n"),
            (f"step-{s:06d}/prompt_style.yaml", b"class_path: litgpt.prompts.Alpaca\n"),
        ],
        "lit_model.pth.lora",
    ),
    Layout(
        "custom-loop",
        lambda s: f"step_{s}",
        lambda s: [
            (f"step_{s}/model.pt", _pt(200_000, s)),
            (f"step_{s}/optim.pt", _pt(1_500_000, s)),
            (f"step_{s}/.complete", b""),  # the user's loop: after the last file
        ],
        "optim.pt",
    ),
]


class Disk:
    """Writes files with mtimes from a clock the test moves: a pause is a number, not a sleep."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.clock = datetime.now(UTC).timestamp() - 86_400  # a day ago, so created_at is later

    def write(self, relative: str, data: bytes) -> Path:
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        self.clock += 1
        os.utime(path, (self.clock, self.clock))
        os.utime(path.parent, (self.clock, self.clock))
        return path

    def pause(self, seconds: float) -> float:
        self.clock += seconds
        return self.clock


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _run_keep_last_one(env: RunEnv) -> tuple[str, dict[str, Any]]:
    # keep_last=1 and no best: a newer durable step makes retention delete the older one at once.
    run_id = env.new_run(retention={"keep_last": 1, "keep_best": False})
    env.run_id = run_id
    return run_id, env.run()


@pytest.mark.parametrize("layout", LAYOUTS, ids=[x.name for x in LAYOUTS])
def test_no_incomplete_checkpoint_is_ever_durable_latest_restored_or_a_reason_to_stop(
    run_env: RunEnv, tmp_path: Path, layout: Layout
) -> None:
    env = run_env
    run_id, run = _run_keep_last_one(env)
    bucket, prefix = run["bucket"], run["prefix"]
    s3 = make_s3_client(env.s3)
    root = tmp_path / "out"
    root.mkdir()
    disk = Disk(root)
    options = SyncOptions(settle_s=SETTLE_S)

    def sync() -> Any:
        return sync_pass(s3, bucket, prefix, run_id, root, env.api, options, now=disk.pause(PAUSE_S))

    old, new = 4, 7  # steps (epochs for torchtune)
    for relative, data in layout.writes(old):
        disk.write(relative, data)
    first = sync()
    assert [u.manifest.step for u in first.uploaded] == [old], first
    old_dir = root / layout.dir_name(old)
    assert completeness(old_dir, old).complete

    def assert_only_old_is_durable(what: str) -> None:
        assert read_manifest(s3, bucket, prefix, new) is None, what
        state = env.run()
        assert state["last_durable_step"] == old, what
        assert {c["step"]: c["status"] for c in state["checkpoints"]} == {old: "durable"}, what
        assert old in stored_steps(s3, bucket, prefix), what  # retention did not delete the complete one
        # What the heartbeat reports as unsynced: the incomplete step counts, so the node is kept.
        assert pending_steps(root, {old}, set()) == [new], what

    writes = layout.writes(new)
    big = next(i for i, (relative, _) in enumerate(writes) if layout.big in relative)
    for index, (relative, data) in enumerate(writes[:-1]):
        if index == big:
            # The writer crashes half-way through its largest file, then a long quiet pause.
            disk.write(relative, data[: len(data) // 2])
            crashed = sync()
            assert new in crashed.in_progress and not crashed.uploaded, crashed
            assert_only_old_is_durable(f"{relative} half written")
        disk.write(relative, data)
        result = sync()  # every file is followed by a pause longer than the settle time
        assert not result.uploaded and new in result.in_progress, (relative, result)
        assert_only_old_is_durable(f"after {relative}")

    # A plain restore takes the latest complete step.
    restored = restore_checkpoint(s3, bucket, prefix, env.api.choose(None, False), tmp_path / "restore")
    assert restored.step == old
    for path in old_dir.rglob("*"):
        if path.is_file():
            assert _sha(path) == _sha(restored.directory / path.relative_to(old_dir))

    # A power loss behind the marker: the marker reached the disk, the big file did not all.
    marker_relative, marker_data = writes[-1]
    big_path = root / writes[big][0]
    whole = big_path.read_bytes()
    big_path.write_bytes(whole[: len(whole) // 2])
    os.utime(big_path, (disk.clock, disk.clock))
    disk.write(marker_relative, marker_data)
    cut = sync()
    assert new in cut.in_progress and not cut.uploaded, cut
    assert_only_old_is_durable("marker written, a file cut short")

    # The file whole again and the marker written last: now it is complete, durable and the latest,
    # and retention lets the old one go (so the assertions above could have failed).
    big_path.write_bytes(whole)
    os.utime(big_path, (disk.clock, disk.clock))
    disk.write(marker_relative, marker_data)
    done = sync()
    assert [u.manifest.step for u in done.uploaded] == [new], done
    assert done.deleted == [old]
    assert env.run()["last_durable_step"] == new
    assert pending_steps(root, {new}, {old}) == []
    restored = restore_checkpoint(s3, bucket, prefix, env.api.choose(None, False), tmp_path / "restore-new")
    # The restored copy reads as complete where it lands (one mtime for all; DeepSpeed gets its `latest`).
    assert restored.step == new and completeness(restored.directory, new).complete
    if layout.name == "deepspeed":
        assert (tmp_path / "restore-new" / "latest").read_text() == f"global_step{new}"


def test_a_restored_deepspeed_checkpoint_is_complete_when_the_wall_clock_runs_ahead_of_the_file_system(
    run_env: RunEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file system stamps a new file from a coarser clock than the wall clock restore reads; restore's own
    `latest` must not come out older than the shards it stamped (the clock is 60 s ahead here, a tick in life)."""
    env = run_env
    _, run = _run_keep_last_one(env)
    s3 = make_s3_client(env.s3)
    root = tmp_path / "out"
    root.mkdir()
    disk = Disk(root)
    layout = next(x for x in LAYOUTS if x.name == "deepspeed")
    for relative, data in layout.writes(3):
        disk.write(relative, data)
    done = sync_pass(
        s3,
        run["bucket"],
        run["prefix"],
        env.run_id,
        root,
        env.api,
        SyncOptions(settle_s=SETTLE_S),
        now=disk.pause(PAUSE_S),
    )
    assert [u.manifest.step for u in done.uploaded] == [3], done
    ahead_ns = time.time_ns() + 60 * 10**9
    monkeypatch.setattr(time, "time_ns", lambda: ahead_ns)  # restore reads the one time module, as everything does
    monkeypatch.setattr(time, "time", lambda: ahead_ns / 1e9)
    restored = restore_checkpoint(s3, run["bucket"], run["prefix"], env.api.choose(None, False), tmp_path / "to")
    assert restored.step == 3
    assert completeness(restored.directory, 3).complete, completeness(restored.directory, 3)

    # A `latest` naming another tag (a newer save on this disk) is not replaced: DeepSpeed would resume from the
    # restored step instead, without a word. Refused before a byte is fetched; one naming the same tag is kept.
    other = tmp_path / "other"
    other.mkdir()
    (other / "latest").write_text("global_step9")
    with pytest.raises(RestoreError, match=r"latest already exists and names 'global_step9', not global_step3"):
        restore_checkpoint(s3, run["bucket"], run["prefix"], env.api.choose(None, False), other)
    assert sorted(p.name for p in other.iterdir()) == ["latest"]
    (other / "latest").write_text("global_step3\n")
    assert restore_checkpoint(s3, run["bucket"], run["prefix"], env.api.choose(None, False), other).step == 3
    assert (other / "latest").read_text() == "global_step3"


def test_torchtunes_last_epoch_counts_only_with_every_shard_whole_and_settled(run_env: RunEnv, tmp_path: Path) -> None:
    """The last epoch has no recipe state after it: the index must name only whole shards that are
    there, and the settle time guards the config files torchtune copies last."""
    env = run_env
    run = env.run()
    s3 = make_s3_client(env.s3)
    root = tmp_path / "out"
    root.mkdir()
    disk = Disk(root)
    options = SyncOptions(settle_s=SETTLE_S)
    shards = [_st(400_000, 1), _st(400_000, 2)]
    index = b'{"metadata": {"total_size": 3200000}, "weight_map": {"a": "model-00001-of-00002.safetensors", '
    index += b'"b": "model-00002-of-00002.safetensors"}}'

    def sync(pause: float = PAUSE_S) -> Any:
        return sync_pass(s3, run["bucket"], run["prefix"], env.run_id, root, env.api, options, now=disk.pause(pause))

    disk.write("epoch_2/model-00001-of-00002.safetensors", shards[0])
    assert 2 in sync().in_progress  # no index yet
    disk.write("epoch_2/model-00002-of-00002.safetensors", shards[1][:1000])
    disk.write("epoch_2/model.safetensors.index.json", index)
    cut = sync()
    assert "model-00002-of-00002.safetensors" in cut.in_progress[2], cut  # its header says it is longer
    (root / "epoch_2/model-00002-of-00002.safetensors").unlink()
    assert "missing" in sync().in_progress[2]
    disk.write("epoch_2/model-00002-of-00002.safetensors", shards[1])
    disk.write("epoch_2/config.json", b"{}")
    # The recipe state of an earlier epoch says the run has 10 epochs: epoch 2 is an intermediate one
    # and waits for the recipe state written after it.
    disk.write("recipe_state/recipe_state.pt", _recipe_state(1, 10))
    disk.write("epoch_2/config.json", b"{}")
    assert "waits for recipe_state" in sync().in_progress[2]
    # ... it said 3: epoch 2 is the last, with no marker after it.
    disk.write("recipe_state/recipe_state.pt", _recipe_state(1, 3))
    disk.write("epoch_2/config.json", b"{}")
    assert sync(pause=1).unsettled == [2]  # whole, but torchtune may still be copying config files
    assert [u.manifest.step for u in sync().uploaded] == [2]


def test_torchtunes_recipe_state_travels_with_its_epoch_and_a_restore_resumes_from_it(
    run_env: RunEnv, tmp_path: Path
) -> None:
    """recipe_state/recipe_state.pt lives beside the epoch folders and is rewritten every epoch: each durable
    epoch keeps the copy written right after it, a later rewrite is not a change of the earlier epoch, and
    a restore puts it back where torchtune reads it, so the exported launcher resumes (epochs run, optimizer)."""
    from services.export.resume import RESUME_FILE, resume_script

    env = run_env
    run = env.run()
    s3 = make_s3_client(env.s3)
    root = tmp_path / "out"
    root.mkdir()
    disk = Disk(root)
    options = SyncOptions(settle_s=SETTLE_S)

    def sync() -> Any:
        return sync_pass(s3, run["bucket"], run["prefix"], env.run_id, root, env.api, options, now=disk.pause(PAUSE_S))

    states = {}
    for epoch in (0, 1):
        for relative, data in LAYOUTS[3].writes(epoch):
            disk.write(relative, data)
        states[epoch] = (root / "recipe_state" / "recipe_state.pt").read_bytes()
        result = sync()
        assert [u.manifest.step for u in result.uploaded] == [epoch] and result.changed == {}
        manifest = read_manifest(s3, run["bucket"], run["prefix"], epoch)
        assert manifest is not None and [f.path for f in manifest.beside] == ["recipe_state/recipe_state.pt"]
        assert manifest.beside[0].sha256 == hashlib.sha256(states[epoch]).hexdigest()
    assert states[0] != states[1]
    assert sync().changed == {}  # the rewrite of the recipe state after epoch 1 is no change of epoch 0

    # The node is lost: restore the latest epoch on a new one, into the trainer's checkpoint folder.
    fresh = tmp_path / "new-node"
    fresh.mkdir()
    latest = read_manifest(s3, run["bucket"], run["prefix"], 1)
    assert latest is not None
    result = restore_checkpoint(s3, run["bucket"], run["prefix"], latest, fresh)
    assert result.bytes == latest.total_bytes > sum(f.size for f in latest.files)
    assert (fresh / "recipe_state" / "recipe_state.pt").read_bytes() == states[1]
    assert not list(fresh.rglob("*.partial"))
    assert completeness(fresh / "epoch_1", 1).complete
    # The export's own resume.py (what launch.sh runs) resumes from the restored epoch.
    script = tmp_path / RESUME_FILE
    script.write_text(resume_script())
    found = subprocess.run(
        [sys.executable, str(script), "torchtune-lora"],
        capture_output=True,
        text=True,
        env={**os.environ, "GPUPLAN_CHECKPOINT_DIR": str(fresh)},
        check=True,
    ).stdout.split()
    assert "resume_from_checkpoint=True" in found
    assert "checkpointer.adapter_checkpoint=epoch_1/adapter_model.pt" in found

    # Epoch 0 restored into the same folder would put its recipe state over epoch 1's (torchtune would resume
    # from epoch 1 again with epoch 0's optimizer): refused before a byte is fetched, epoch 1's state untouched.
    first = read_manifest(s3, run["bucket"], run["prefix"], 0)
    assert first is not None
    with pytest.raises(RestoreError, match=r"recipe_state.pt already exists with other contents"):
        restore_checkpoint(s3, run["bucket"], run["prefix"], first, fresh)
    assert (fresh / "recipe_state" / "recipe_state.pt").read_bytes() == states[1]
    assert not (fresh / "epoch_0").exists() and not list(fresh.rglob("*.partial"))


def test_a_rewrite_in_place_is_in_progress_until_the_marker_is_written_again(tmp_path: Path) -> None:
    """A resumed trainer saving the same step over an old directory: the old marker is there, but
    older than the files being rewritten."""
    disk = Disk(tmp_path)
    for relative, data in _hf(500):
        disk.write(relative, data)
    directory = tmp_path / "checkpoint-500"
    assert completeness(directory, 500).complete
    disk.write("checkpoint-500/optimizer.pt", _pt(1_500_000, 9))
    state = completeness(directory, 500)
    assert not state.complete and "optimizer.pt is newer than trainer_state.json" in state.reason
    disk.write("checkpoint-500/trainer_state.json", b'{"global_step": 500}')
    assert completeness(directory, 500).complete
    # gpuplan's own metric file, written by a callback after the save, does not reopen it.
    disk.write("checkpoint-500/gpuplan_metric.json", b'{"metric": 0.4}')
    assert completeness(directory, 500).complete
    # A plain DeepSpeed tag older than the one `latest` names was finished before it.
    for relative, data in [("global_step100/x.pt", _pt(4, 1)), ("global_step200/x.pt", _pt(4, 2))]:
        disk.write(relative, data)
    assert not completeness(tmp_path / "global_step100", 100).complete
    disk.write("latest", b"global_step100")
    assert completeness(tmp_path / "global_step100", 100).complete
    assert "still names global_step100" in completeness(tmp_path / "global_step200", 200).reason
    disk.write("latest", b"global_step200")
    assert completeness(tmp_path / "global_step200", 200).complete
    # Directory names: DeepSpeed tags, LitGPT's zero-padded steps, torchtune's DCP epochs.
    assert [step_of(n) for n in ("global_step300", "step-000600", "dist_epoch_3", "latest")] == [300, 600, 3, None]
    unknown = disk.write("checkpoint-9/model.safetensors", _st(10, 1)).parent
    assert ".complete" in completeness(unknown, 9).reason  # no marker: the error names the options


SHARD = "model-00001-of-00002.safetensors"


@pytest.mark.parametrize(
    ("added", "removed", "reason"),
    [
        ((), "optimizer.pt", "scheduler.pt without optimizer.pt"),
        ((), "scheduler.pt", "optimizer.pt without scheduler.pt"),
        ((), "model.safetensors", "no model weights"),
        (("model.safetensors.index.json", SHARD), SHARD, "shards model.safetensors.index.json names"),
        (("adapter_model.safetensors", "adapter_config.json"), "adapter_config.json", "adapter_config.json"),
    ],
)
def test_a_trainer_checkpoint_missing_what_every_save_writes_is_not_complete_whoever_looks(
    tmp_path: Path, added: tuple[str, ...], removed: str, reason: str
) -> None:
    """A checkpoint that lost a file after its trainer_state.json (a rotation under way, a cleanup) read complete to
    an agent that had not seen it whole before (a restart): a resume from it starts a fresh optimizer or fails. What
    transformers' Trainer always writes is now required, whatever the agent remembers (a lifecycle probe of stop
    49)."""
    disk = Disk(tmp_path)
    files = {
        "model.safetensors.index.json": f'{{"weight_map": {{"w": "{SHARD}"}}}}'.encode(),
        SHARD: _st(10, 1),
        "adapter_model.safetensors": _st(10, 2),
        "adapter_config.json": b'{"r": 8, "peft_type": "LORA"}',
    }
    for relative, data in [*_hf(700)[:-1], *((f"checkpoint-700/{n}", files[n]) for n in added), _hf(700)[-1]]:
        disk.write(relative, data)  # trainer_state.json last
    directory = tmp_path / "checkpoint-700"
    assert completeness(directory, 700).complete
    (directory / removed).unlink()
    state = completeness(directory, 700)
    assert not state.complete and reason in state.reason, state.reason


def test_local_files_changed_after_the_upload_are_reported_and_never_uploaded_over(
    run_env: RunEnv, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    env = run_env
    run = env.run()
    bucket, prefix = run["bucket"], run["prefix"]
    s3 = make_s3_client(env.s3)
    root = tmp_path / "out"
    root.mkdir()
    disk = Disk(root)
    options = SyncOptions(settle_s=0)
    for relative, data in _hf(600):
        disk.write(relative, data)
    directory = root / "checkpoint-600"
    original = (directory / "optimizer.pt").read_bytes()
    sync_pass(s3, bucket, prefix, env.run_id, root, env.api, options)
    manifest = read_manifest(s3, bucket, prefix, 600)
    assert manifest is not None

    # Unchanged: nothing reported, nothing re-hashed (mtimes are older than the manifest).
    assert sync_pass(s3, bucket, prefix, env.run_id, root, env.api, options).changed == {}
    # Same size, other bytes, written now; and a file added.
    (directory / "optimizer.pt").write_bytes(bytes(len(original)))
    (directory / "extra.bin").write_bytes(b"x")
    with caplog.at_level(logging.WARNING, logger="gpuplan.sync"):
        result = sync_pass(s3, bucket, prefix, env.run_id, root, env.api, options)
    assert result.changed == {600: ["extra.bin", "optimizer.pt"]} and result.uploaded == []
    assert "step 600: local files changed after it was made durable" in caplog.text
    # The bucket still holds exactly what its manifest lists: the verified upload.
    assert read_manifest(s3, bucket, prefix, 600) == manifest
    key = f"{step_prefix(prefix, 600)}/optimizer.pt"
    stored = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    assert stored == original
    assert hashlib.sha256(stored).hexdigest() == next(f.sha256 for f in manifest.files if f.path == "optimizer.pt")
    assert pending_steps(root, {600}, set()) == []  # its durable copy exists
    restored = restore_checkpoint(s3, bucket, prefix, env.api.choose(None, False), tmp_path / "back")
    assert (restored.directory / "optimizer.pt").read_bytes() == original


def test_a_file_changed_during_the_upload_gets_no_manifest(run_env: RunEnv, tmp_path: Path) -> None:
    env = run_env
    run = env.run()
    s3 = make_s3_client(env.s3)
    root = tmp_path / "out"
    root.mkdir()
    disk = Disk(root)
    for relative, data in _hf(800):
        disk.write(relative, data)
    options = SyncOptions(settle_s=0)

    def rewrite() -> None:  # the trainer writes into the directory after its files were uploaded
        disk.write("checkpoint-800/scheduler.pt", _pt(4, 99))

    result = sync_pass(s3, run["bucket"], run["prefix"], env.run_id, root, env.api, options, before_manifest=rewrite)
    assert "changed while it was uploaded (scheduler.pt)" in result.in_progress[800] and not result.uploaded
    assert read_manifest(s3, run["bucket"], run["prefix"], 800) is None
    assert env.run()["last_durable_step"] is None
    # scheduler.pt is now newer than trainer_state.json: in progress until the trainer writes it again.
    assert (
        "newer than trainer_state.json"
        in sync_pass(s3, run["bucket"], run["prefix"], env.run_id, root, env.api, options).in_progress[800]
    )
    disk.write("checkpoint-800/trainer_state.json", b'{"global_step": 800}')
    uploaded = sync_pass(s3, run["bucket"], run["prefix"], env.run_id, root, env.api, options).uploaded
    assert [u.manifest.step for u in uploaded] == [800]


class Recording:
    name = "recording"

    def __init__(self) -> None:
        self.stopped: list[str] = []

    def stop(self, node: NodeTarget) -> str:
        self.stopped.append(node.id)
        return "ok"

    def start(self, node: NodeTarget) -> str:
        return "ok"


def test_the_agent_reports_an_in_progress_checkpoint_unsynced_and_the_sweep_keeps_the_node(
    run_env: RunEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """End to end through the agent: its background sync pass, its heartbeat to the service, and the
    service's idle sweep with a driver that records stops."""
    import services.agent.agent as agent_module

    monkeypatch.setattr(agent_module, "local_signals", _idle_signals(agent_module.local_signals))
    env = run_env
    root = tmp_path / "out"
    root.mkdir()
    disk = Disk(root)
    for relative, data in _hf(100):
        disk.write(relative, data)
    for relative, data in _hf(200)[:-3]:  # crashed after the optimizer: no scheduler, RNG state or trainer_state
        disk.write(relative, data)
    optimizer = root / "checkpoint-200" / "optimizer.pt"
    optimizer.write_bytes(optimizer.read_bytes()[: 3 * 2**20])
    agent = env.joined_agent("ckpt-node")
    run = env.run()
    s3 = make_s3_client(env.s3)
    agent.attach_run(RunSync(env.api, s3, run["bucket"], run["prefix"], root, SyncOptions(settle_s=SETTLE_S), 3600))
    assert agent.syncer is not None
    assert agent.syncer.start(env.api)
    agent.syncer.wait(60)
    assert agent.syncer.run.last_error is None
    assert agent.syncer.run.durable == {100} and 200 in agent.syncer.run.in_progress
    assert agent.heartbeat()
    node = env.client.get(f"/v1/nodes/{agent.node_id}", headers=env.headers).json()
    assert node["unsynced_checkpoints"] == 1

    app: Any = env.client.app
    factory = make_sessionmaker(app.state.engine)
    driver = Recording()
    now = datetime.now(UTC)
    for minutes in (0, 20, 40):
        with unit_of_work(factory) as session:
            sweep(session, now + timedelta(minutes=minutes), driver, 7200)
    assert driver.stopped == []  # idle for 40 min, but a checkpoint is not durable: kept
    # The service asked for a sync; the final pass (SIGTERM) still does not make it durable.
    agent.syncer.final(reachable=True)
    assert env.run()["last_durable_step"] == 100 and agent.syncer.run.unsynced() == 1

    # The trainer finishes the save: durable, nothing unsynced, and the idle node may go.
    for relative, data in _hf(200):
        disk.write(relative, data)
    agent.syncer.final(reachable=True)
    assert env.run()["last_durable_step"] == 200 and agent.syncer.run.unsynced() == 0
    agent.interval_s = SLOW_AGENT["heartbeat_interval_s"]  # the sweep 16 min on counts those minutes as idle
    assert agent.heartbeat()
    with unit_of_work(factory) as session:
        sweep(session, datetime.now(UTC), driver, 7200)
        sweep(session, datetime.now(UTC) + timedelta(minutes=16), driver, 7200)
    assert driver.stopped == [agent.node_id]
    agent.syncer.wait(60)  # a pass the last heartbeat's "sync" command may have started


def _idle_signals(real: Callable[..., Any]) -> Callable[..., Any]:
    """The machine's own signals but no interactive session (whoever is logged in to the test machine
    must not keep the node busy); the unsynced count is the agent's own."""
    from dataclasses import replace as dc_replace

    def signals(*args: Any) -> Any:
        return dc_replace(real(*args), interactive_idle_s=None, job_running=False)

    return signals
