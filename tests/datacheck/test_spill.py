"""Flat memory: the spill to a scratch SQLite file gives the same answers as the in-memory path, and its
files are removed (also on errors); length percentiles from a histogram equal those of the sorted list."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.datacheck import check_dataset, exact_duplicates, near_duplicates, token_stats
from services.datacheck import report as report_module
from services.datacheck.dedup import text_digest
from services.datacheck.spill import SCRATCH_PREFIX, ExactIndex, Scratch
from services.datacheck.tokens import PERCENTILES, LengthHistogram, histogram_token_stats
from tests.datacheck.planted import Planted, write_planted


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Planted]:
    path = tmp_path_factory.mktemp("spill-planted") / "train.jsonl"
    return path, write_planted(path, base_rows=1000)


def _spy_on_passes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, bool]]:
    """Record, for each pass as it closes, its spilled near-duplicate rows and whether it made a scratch file."""
    seen: list[tuple[int, bool]] = []
    close = report_module._Pass.close

    def spying(state: report_module._Pass) -> None:
        seen.append((state.index.spilled_rows, state.scratch.used))
        close(state)

    monkeypatch.setattr(report_module._Pass, "close", spying)
    return seen


@pytest.mark.parametrize("limit", [None, 3])
@pytest.mark.parametrize("budget", [0, 1, 7, 100])
def test_spilled_check_gives_the_same_report(
    planted: tuple[Path, Planted], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, budget: int, limit: int | None
) -> None:
    path, truth = planted
    monkeypatch.setattr(report_module, "CHUNK_ROWS", 50)  # many chunks, so rows on disk are looked up
    in_memory = check_dataset(path, max_listed=limit)
    spill_dir = tmp_path / "spill"
    spill_dir.mkdir()
    monkeypatch.setattr(report_module, "SPILL_ROWS", budget)
    monkeypatch.setattr(report_module, "SPILL_DIR", str(spill_dir))
    seen = _spy_on_passes(monkeypatch)
    spilled = check_dataset(path, max_listed=limit)
    assert seen and seen[-1][0] > 0 and seen[-1][1]  # the disk path was taken
    assert spilled == in_memory
    assert {d.row_number: d.duplicate_of for d in spilled.near_duplicates} == (
        truth.near if limit is None else {d.row_number: d.duplicate_of for d in in_memory.near_duplicates}
    )
    assert spilled.counts["exact_duplicates"] == len(truth.exact)
    assert spilled.counts["near_duplicates"] == len(truth.near)
    assert list(spill_dir.iterdir()) == []  # the scratch directory is gone


def test_default_budget_never_touches_disk_for_a_small_set(
    planted: tuple[Path, Planted], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _spy_on_passes(monkeypatch)
    check_dataset(planted[0])
    assert seen == [(0, False)]


def test_scratch_files_are_removed_when_the_check_fails(
    planted: tuple[Path, Planted], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _ = planted
    spill_dir = tmp_path / "spill"
    spill_dir.mkdir()
    monkeypatch.setattr(report_module, "CHUNK_ROWS", 50)
    monkeypatch.setattr(report_module, "SPILL_ROWS", 10)
    monkeypatch.setattr(report_module, "SPILL_DIR", str(spill_dir))
    monkeypatch.setattr(report_module, "PROGRESS_EVERY_ROWS", 500)
    made: list[Path] = []

    def progress(done: int, total: int) -> None:
        made.extend(spill_dir.iterdir())
        raise RuntimeError("stop")

    with pytest.raises(RuntimeError, match="stop"):
        check_dataset(path, progress=progress)
    assert made and made[0].name.startswith(SCRATCH_PREFIX)  # it had spilled by row 500
    assert list(spill_dir.iterdir()) == []


def test_scratch_is_made_on_first_use_and_removed(tmp_path: Path) -> None:
    with Scratch(tmp_path) as scratch:
        assert not scratch.used and list(tmp_path.iterdir()) == []
        scratch.db.execute("CREATE TABLE t (x)")
        assert scratch.path is not None and scratch.path.parent == tmp_path
    assert list(tmp_path.iterdir()) == []


def _texts(rng: random.Random, rows: int) -> list[tuple[int, str]]:
    vocab = [f"w{i}" for i in range(3000)]
    out: list[tuple[int, str]] = []
    for number in range(1, rows + 1):
        draw = rng.random()
        if draw < 0.15 and out:  # a copy with one word changed
            words = rng.choice(out)[1].split()
            words[rng.randrange(len(words))] = "changed"
            out.append((number, " ".join(words)))
        elif draw < 0.25 and out:
            out.append((number, "  " + rng.choice(out)[1].upper()))
        else:
            out.append((number, " ".join(rng.choices(vocab, k=rng.randint(3, 60)))))
    return out


@pytest.mark.parametrize("memory_rows", [0, 5, 64])
def test_near_duplicate_index_spills_with_the_same_answers(memory_rows: int) -> None:
    rows = _texts(random.Random(memory_rows), 1500)
    expected = near_duplicates(rows, chunk_rows=37)
    assert len(expected) > 100
    assert near_duplicates(rows, chunk_rows=37, memory_rows=memory_rows) == expected


@pytest.mark.parametrize("memory_rows", [0, 3, 50])
def test_exact_index_spills_with_the_same_answers(tmp_path: Path, memory_rows: int) -> None:
    rows = _texts(random.Random(7), 1200)
    expected = {d.row_number: d.duplicate_of for d in exact_duplicates(rows)}
    with Scratch(tmp_path) as scratch:
        index = ExactIndex(scratch, memory_rows)
        found: dict[int, int] = {}
        for at in range(0, len(rows), 41):
            chunk = rows[at : at + 41]
            hashes = [int.from_bytes(text_digest(t)[:8], "big") for _, t in chunk]
            for (number, _), first in zip(chunk, index.first_rows(hashes, [n for n, _ in chunk]), strict=True):
                if first is not None:
                    found[number] = first
        assert scratch.used
    assert found == expected and len(found) > 50
    assert list(tmp_path.iterdir()) == []


def _sorted_list_stats(lengths: list[int]) -> dict[str, int]:
    """The definition: nearest-rank percentiles over the sorted list of every length."""
    ordered = sorted(lengths)
    out = {f"p{p}": ordered[max(math.ceil(p / 100 * len(ordered)), 1) - 1] if ordered else 0 for p in PERCENTILES}
    out["max"] = ordered[-1] if ordered else 0
    return out


@given(st.lists(st.integers(min_value=0, max_value=40_000), max_size=300))
def test_histogram_gives_the_percentiles_of_the_sorted_lengths(lengths: list[int]) -> None:
    histogram = LengthHistogram()
    for at in range(0, len(lengths), 17):
        histogram.add(lengths[at : at + 17])
    stats = histogram_token_stats(*histogram.arrays(), "test", ())
    assert stats == token_stats(lengths, "test", ())
    assert stats.rows_counted == len(lengths) == histogram.rows
    expected = _sorted_list_stats(lengths)
    got = {f"p{p}": getattr(stats, f"p{p}_tokens") for p in PERCENTILES} | {"max": stats.max_tokens}
    assert got == expected
    seq_len = stats.recommended_seq_len_tokens
    assert stats.truncated_rows == sum(1 for v in lengths if v > seq_len)
    assert stats.tokens_per_epoch_packed == sum(min(v, seq_len) for v in lengths)
