"""A sharded save is complete only with every rank's part (services/runs/shards.py).

A run on two nodes that each save to their own disk leaves each node the finishing marker with only its own ranks'
files. Before, such a folder was complete, the first node's agent made it durable, and the step could never be
resumed. The DCP case is a real torch.distributed.checkpoint save by two processes (gloo over a file rendezvous, no
port) into one folder per "node", synced with the `gpuplan sync` command against the live API and moto's S3 server;
the DeepSpeed case is torch.save archives laid out and keyed as DeepSpeed writes them (``engine._save_zero_checkpoint``:
``optimizer_state_dict`` with its ``partition_count``), which its ``zero_to_fp32.py`` counts the shards against.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from services.cli.main import main
from services.runs.complete import completeness
from tests.runs.conftest import RunEnv

_DCP_SAVE = textwrap.dedent(
    """
    import sys, torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
    rank, rendezvous, folder = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=2)
    dcp.save({f"layer{rank}.weight": torch.full((1000,), float(rank))}, checkpoint_id=folder)
    dist.destroy_process_group()
    """
)


def _dcp_save_on_two_ranks(tmp_path: Path, folders: tuple[Path, Path]) -> None:
    """torch.distributed.checkpoint.save by ranks 0 and 1, each into its folder (one folder: a shared disk)."""
    script = tmp_path / "dcp_save.py"
    script.write_text(_DCP_SAVE)
    rendezvous = tmp_path / "rendezvous"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ranks = [
        subprocess.Popen(
            [sys.executable, str(script), str(rank), str(rendezvous), str(folder)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for rank, folder in enumerate(folders)
    ]
    for process in ranks:
        output, _ = process.communicate(timeout=120)
        assert process.returncode == 0, output.decode(errors="replace")


def test_a_dcp_save_split_over_two_nodes_disks_is_never_made_durable(
    run_env: RunEnv, connect: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node0, node1 = tmp_path / "node0" / "out", tmp_path / "node1" / "out"
    _dcp_save_on_two_ranks(tmp_path, (node0 / "dist_epoch_0", node1 / "dist_epoch_0"))
    assert sorted(p.name for p in (node0 / "dist_epoch_0").iterdir()) == [".metadata", "__0_0.distcp"]

    assert main(["sync", *connect, "--dir", str(node0), "--settle-s", "0"]) == 0
    printed = capsys.readouterr().out
    assert "step 0: in progress, not complete yet (dist_epoch_0/ lacks 1 of the 2 files its .metadata names" in printed
    assert "__1_0.distcp" in printed and "another node's disk" in printed
    assert main(["sync", *connect, "--dir", str(node1), "--settle-s", "0"]) == 0
    assert "dist_epoch_0/ has no .metadata yet" in capsys.readouterr().out
    assert run_env.run()["checkpoints"] == []  # nothing durable, so nothing to restore a broken copy from

    # The same save into one folder both ranks write to (a shared disk) is complete and made durable whole.
    shared = tmp_path / "shared" / "out"
    (tmp_path / "rendezvous").unlink(missing_ok=True)
    _dcp_save_on_two_ranks(tmp_path, (shared / "dist_epoch_0", shared / "dist_epoch_0"))
    assert main(["sync", *connect, "--dir", str(shared), "--settle-s", "0"]) == 0
    assert "step 0: durable (3 files" in capsys.readouterr().out
    manifest = run_env.run()["checkpoints"][-1]["manifest"]
    assert sorted(f["path"] for f in manifest["files"]) == [".metadata", "__0_0.distcp", "__1_0.distcp"]


def _zero_shard(partition_count: Any) -> bytes:
    """A ZeRO optimizer shard as DeepSpeed saves it: optimizer_state_dict (with partition_count), ds_config,
    ds_version."""
    buffer = io.BytesIO()
    state = {"zero_stage": 3, "partition_count": partition_count, "fp32_flat_groups": [torch.zeros(1000)]}
    torch.save({"optimizer_state_dict": state, "ds_config": {"train_batch_size": 32}, "ds_version": "0.16.4"}, buffer)
    return buffer.getvalue()


def _deepspeed_tag(root: Path, step: int, ranks: range, partition_count: Any, mp_ranks: int = 1) -> Path:
    tag = root / f"global_step{step}"
    tag.mkdir(parents=True, exist_ok=True)
    for mp in range(mp_ranks):
        for rank in ranks:
            (tag / f"zero_pp_rank_{rank}_mp_rank_{mp:02d}_optim_states.pt").write_bytes(_zero_shard(partition_count))
            buffer = io.BytesIO()
            torch.save({"module": None, "dp_world_size": 16, "mp_world_size": mp_ranks}, buffer)
            (tag / f"zero_pp_rank_{rank}_mp_rank_{mp:02d}_model_states.pt").write_bytes(buffer.getvalue())
    latest = root / "latest"
    latest.write_text(tag.name)  # written after every shard
    newest = max(p.stat().st_mtime for p in tag.iterdir()) + 1
    os.utime(latest, (newest, newest))
    return tag


def test_a_deepspeed_tag_needs_the_zero_shard_of_every_data_parallel_rank(tmp_path: Path) -> None:
    node0 = tmp_path / "node0"
    tag = _deepspeed_tag(node0, 10, range(8), 16)  # ranks 0-7 of 16: the first node of two
    found = completeness(tag, 10)
    assert not found.complete
    assert found.reason.startswith("global_step10/ lacks the ZeRO optimizer shards of data-parallel ranks 8-15 of 16")
    _deepspeed_tag(node0, 10, range(8, 16), 16)  # the other node's shards copied in: complete
    assert completeness(tag, 10).complete

    # ZeRO-1/2 save a list per parameter group (the largest is the data-parallel size); a second model-parallel
    # rank needs its own full set.
    lists = _deepspeed_tag(tmp_path / "lists", 20, range(4), [4, 2], mp_ranks=2)
    assert completeness(lists, 20).complete
    (lists / "zero_pp_rank_3_mp_rank_01_optim_states.pt").unlink()
    reason = completeness(lists, 20).reason
    assert "data-parallel ranks 3 of 4 (model-parallel rank 1)" in reason

    # Shards that do not say their count: the ranks present must run from 0 without a gap.
    unsaid = _deepspeed_tag(tmp_path / "unsaid", 30, range(4), None)
    assert completeness(unsaid, 30).complete
    (unsaid / "zero_pp_rank_2_mp_rank_00_optim_states.pt").unlink()
    assert "data-parallel ranks 2 of 4" in completeness(unsaid, 30).reason


def test_a_trainer_checkpoint_under_deepspeed_needs_every_shard_too(tmp_path: Path) -> None:
    checkpoint = tmp_path / "checkpoint-10"
    _deepspeed_tag(checkpoint, 10, range(2), 4)  # the Trainer under DeepSpeed: the engine's tag inside
    (checkpoint / "scheduler.pt").write_bytes(_zero_shard(1))
    state = checkpoint / "trainer_state.json"
    state.write_text('{"global_step": 10}')
    newest = max(p.stat().st_mtime for p in checkpoint.rglob("*")) + 1
    os.utime(state, (newest, newest))
    found = completeness(checkpoint, 10)
    assert not found.complete and "data-parallel ranks 2-3 of 4" in found.reason, found
