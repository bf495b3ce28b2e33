"""Length percentiles, the seq_len bucket, tokens per epoch, duplicates and the validation split."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.datacheck import (
    approx_tokens,
    check_dataset,
    choose_seq_len,
    exact_duplicates,
    near_duplicates,
    percentile,
    token_stats,
    validation_rows,
)


def test_nearest_rank_percentiles() -> None:
    values = list(range(1, 101))
    assert [percentile(values, p) for p in (50, 90, 95, 99, 100)] == [50, 90, 95, 99, 100]
    with pytest.raises(ValueError, match="pct"):
        percentile(values, 0)


@pytest.mark.parametrize(("p99", "bucket"), [(1, 256), (256, 256), (257, 512), (3000, 4096), (99999, 32768)])
def test_bucket_covers_p99(p99: int, bucket: int) -> None:
    assert choose_seq_len(p99) == bucket


def test_token_stats_on_constructed_lengths() -> None:
    # 98 rows of 100 tokens, one of 500 (p99) and one of 2000 (max).
    lengths = [100] * 98 + [500, 2000]
    stats = token_stats(lengths, "test", ())
    assert (stats.p50_tokens, stats.p99_tokens, stats.max_tokens) == (100, 500, 2000)
    assert stats.recommended_seq_len_tokens == 512
    assert stats.truncated_rows == 1 and stats.truncated_share == pytest.approx(0.01)
    assert stats.tokens_per_epoch_padded == 100 * 512
    assert stats.tokens_per_epoch_packed == 98 * 100 + 500 + 512


def test_approximation_is_four_characters_per_token() -> None:
    assert approx_tokens("abcd" * 10) == 10
    assert approx_tokens("abcde") == 2


LONG = " ".join(f"word{i}" for i in range(100))


def test_exact_and_near_duplicates() -> None:
    near = LONG.replace("word50", "changed")  # Jaccard 91/101 ~ 0.90
    other = " ".join(f"other{i}" for i in range(100))
    rows = [(1, LONG), (2, "  " + LONG.upper()), (3, near), (4, other)]
    exact = exact_duplicates(rows)
    assert [(d.row_number, d.duplicate_of) for d in exact] == [(2, 1)]
    found = near_duplicates([r for r in rows if r[0] != 2])
    assert [(d.row_number, d.duplicate_of) for d in found] == [(3, 1)]
    assert found[0].similarity >= 0.8


def test_half_overlap_is_not_a_near_duplicate() -> None:
    half = " ".join(f"word{i}" for i in range(50)) + " " + " ".join(f"new{i}" for i in range(50))
    assert near_duplicates([(1, LONG), (2, half)]) == []


def test_validation_rule() -> None:
    assert validation_rows(5) == 0
    assert validation_rows(500) == 50
    assert validation_rows(2000) == 100
    assert validation_rows(10_000) == 500
    assert validation_rows(100_000) == 1000


def test_report_flags_empty_short_duplicate_rows(tmp_path: Path) -> None:
    rows = [
        {"prompt": LONG, "completion": "yes " * 10},
        {"prompt": LONG, "completion": "yes " * 10},
        {"prompt": "q", "completion": ""},
        {"prompt": "hi", "completion": "ok"},
        {"prompt": "x" * 4000, "completion": "y"},
    ] + [{"prompt": f"question {i} " * 20, "completion": f"answer {i}"} for i in range(200)]
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    report = check_dataset(path)
    assert report.detected_format == "prompt_completion"
    assert [(d.row_number, d.duplicate_of) for d in report.exact_duplicates] == [(2, 1)]
    assert report.empty_rows == (3,)
    assert 4 in report.short_rows
    assert 5 in report.overlong_rows
    assert report.rows_kept == len(rows) - 2
    assert report.validation_split.rows == len(report.validation_split.row_numbers) == 20
