"""A pending sharded checkpoint is checked again on every sync pass; its shard files are read once while they are
unchanged (services/runs/shards.py caches what it read by path, size and mtime), and again once one changes.

Before, each `gpuplan sync` pass over a DeepSpeed tag waiting for other ranks' shards unpickled a ZeRO shard's
data.pkl again, and over a torch.distributed.checkpoint folder its .metadata (up to 64 MiB) again."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from services.runs import shards
from tests.runs.conftest import RunEnv
from tests.runs.test_sharded_saves import _dcp_save_on_two_ranks, _deepspeed_tag, _zero_shard


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How often a ZeRO shard's archive was read (by file name), and how often any torch pickle was unpickled
    ("unpickled": the DCP .metadata, where nothing else is one)."""
    counts: Counter[str] = Counter()
    archive_state = shards.torch_archive_state
    unpickle = shards.NoCodeUnpickler.load

    def counted_archive(path: Path) -> Any:
        counts[path.name] += 1
        return archive_state(path)

    def counted_load(self: shards.NoCodeUnpickler) -> Any:
        counts["unpickled"] += 1
        return unpickle(self)

    monkeypatch.setattr(shards, "torch_archive_state", counted_archive)
    monkeypatch.setattr(shards.NoCodeUnpickler, "load", counted_load)
    return counts


def _bump(path: Path, data: bytes | None = None) -> None:
    """Rewrite (or only touch) a file so that its mtime changes: a second back, never ahead of the clock (a file
    dated in the future reads as still being written, and the sync would wait for it)."""
    if data is not None:
        path.write_bytes(data)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns - 1_000_000_000))


def test_an_unchanged_pending_zero_shard_is_read_once_across_sync_passes(
    run_env: RunEnv, tmp_path: Path, sync: Callable[[Path], str], reads: Counter[str]
) -> None:
    node0 = tmp_path / "node0" / "out"
    tag = _deepspeed_tag(node0, 10, range(8), 16)  # ranks 0-7 of 16: waits for the other node's shards
    first = "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    for _ in range(2):
        assert "lacks the ZeRO optimizer shards of data-parallel ranks 8-15 of 16" in sync(node0)
    assert reads[first] == 1, reads

    _bump(tag / first, _zero_shard(16))  # rewritten: read again, once
    for _ in range(2):
        assert "data-parallel ranks 8-15 of 16" in sync(node0)
    assert reads[first] == 2, reads
    _bump(tag / first)  # only its mtime moved: read again too
    assert "data-parallel ranks 8-15 of 16" in sync(node0)
    assert reads[first] == 3, reads
    assert run_env.run()["checkpoints"] == []


def test_an_unchanged_pending_dcp_metadata_is_read_once_across_sync_passes(
    run_env: RunEnv, tmp_path: Path, sync: Callable[[Path], str], reads: Counter[str]
) -> None:
    node0, node1 = tmp_path / "node0" / "out", tmp_path / "node1" / "out"
    _dcp_save_on_two_ranks(tmp_path, (node0 / "dist_epoch_0", node1 / "dist_epoch_0"))
    metadata = node0 / "dist_epoch_0" / shards.DCP_METADATA
    for _ in range(2):
        assert "dist_epoch_0/ lacks 1 of the 2 files its .metadata names" in sync(node0)
    assert reads["unpickled"] == 1, reads

    _bump(metadata)  # a new mtime (the coordinator wrote it again): read again
    assert "lacks 1 of the 2 files" in sync(node0)
    assert reads["unpickled"] == 2, reads

    # The missing rank's file copied in: complete and durable, the cached names still right.
    (node0 / "dist_epoch_0" / "__1_0.distcp").write_bytes((node1 / "dist_epoch_0" / "__1_0.distcp").read_bytes())
    assert "step 0: durable (3 files" in sync(node0)
    assert reads["unpickled"] == 2, reads


def test_the_cache_of_shard_reads_is_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reads: Counter[str]
) -> None:
    """The least recently used answer goes past the bound: a long-lived agent over many pending saves keeps a few."""
    monkeypatch.setattr(shards, "_READS", type(shards._READS)())
    monkeypatch.setattr(shards, "_READS_LIMIT", 2)
    tags = [_deepspeed_tag(tmp_path / f"run{n}", 10, range(2), 4) for n in range(3)]
    for tag in tags:
        assert "data-parallel ranks 2-3 of 4" in (shards.zero_shards_missing(tag) or "")
    assert len(shards._READS) == 2
    assert "data-parallel ranks 2-3 of 4" in (shards.zero_shards_missing(tags[2]) or "")  # still held: not read
    assert "data-parallel ranks 2-3 of 4" in (shards.zero_shards_missing(tags[0]) or "")  # dropped: read again
    assert reads["zero_pp_rank_0_mp_rank_00_optim_states.pt"] == 4, reads
