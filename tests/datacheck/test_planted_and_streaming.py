"""Planted problems found with exact counts; streaming readers; equivalence of the fast MinHash."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.datacheck import (
    RowError,
    check_dataset,
    find_pii,
    iban_valid,
    iter_rows,
    loading,
    luhn_valid,
    minhash,
    tc_kimlik_valid,
)
from services.datacheck.dedup import minhash_reference
from tests.datacheck.planted import Planted, write_planted


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Planted]:
    path = tmp_path_factory.mktemp("planted") / "train.jsonl"
    return path, write_planted(path, base_rows=1000)


def test_every_planted_problem_found_with_exact_counts(planted: tuple[Path, Planted]) -> None:
    path, truth = planted
    report = check_dataset(path)
    assert report.rows_total == truth.rows_total
    assert report.detected_format == "alpaca"
    assert [p.row_number for p in report.broken_rows] == truth.broken
    assert [p.row_number for p in report.encoding_problem_rows] == truth.encoding
    assert [p.row_number for p in report.mismatched_rows] == truth.mismatched
    assert list(report.empty_rows) == truth.empty
    assert {d.row_number: d.duplicate_of for d in report.exact_duplicates} == truth.exact
    assert {d.row_number: d.duplicate_of for d in report.near_duplicates} == truth.near
    assert all(d.similarity >= 0.8 for d in report.near_duplicates)
    assert list(report.overlong_rows) == truth.overlong
    assert report.tokens.recommended_seq_len_tokens == 512
    # Valid TC Kimlik, IBAN and card numbers counted exactly; their invalid look-alikes never.
    assert {k.kind: k.count for k in report.pii} == truth.pii
    assert report.pii_findings_total == sum(truth.pii.values())
    dropped = len(truth.broken + truth.encoding + truth.mismatched + truth.empty) + len(truth.exact) + len(truth.near)
    assert report.rows_kept == truth.rows_total - dropped
    assert report.counts["near_duplicates"] == len(truth.near)


def test_capped_lists_keep_exact_counts(planted: tuple[Path, Planted]) -> None:
    path, truth = planted
    report = check_dataset(path, max_listed=3)
    assert len(report.exact_duplicates) == 3 and report.counts["exact_duplicates"] == len(truth.exact)
    assert len(report.near_duplicates) == 3 and report.counts["near_duplicates"] == len(truth.near)
    assert report.counts["broken_rows"] == len(truth.broken)
    assert report.listed_limit == 3


def test_gzip_gives_the_same_report(planted: tuple[Path, Planted], tmp_path: Path) -> None:
    path, _ = planted
    gz = tmp_path / "train.jsonl.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    plain, packed = check_dataset(path), check_dataset(gz)
    assert packed.counts == plain.counts
    assert packed.tokens == plain.tokens
    assert packed.validation_split == plain.validation_split


def test_progress_estimates_the_total_then_reports_it_exactly(planted: tuple[Path, Planted]) -> None:
    path, truth = planted
    calls: list[tuple[int, int]] = []
    check_dataset(path, progress=lambda done, total: calls.append((done, total)))
    assert calls[-1] == (truth.rows_total, truth.rows_total)
    assert [done for done, _ in calls[:-1]] == list(range(1000, truth.rows_total, 1000))
    assert all(total >= done for done, total in calls)


def test_format_is_confirmed_over_the_whole_set(tmp_path: Path) -> None:
    # The first 1,000 rows are plain text; most rows are prompt/completion: a second pass decides.
    rows: list[Any] = [{"text": f"plain {i}"} for i in range(1000)]
    rows += [{"prompt": f"question {i}", "completion": f"answer {i}"} for i in range(1500)]
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    report = check_dataset(path)
    assert report.detected_format == "prompt_completion"
    assert report.counts["mismatched_rows"] == 1000
    assert report.tokens.rows_counted == 1500


def test_json_array_is_read_element_by_element(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loading, "_READ_CHUNK_BYTES", 7)  # elements straddle every read
    rows = [{"text": "é" * 20 + str(i), "n": i, "x": [1.5, None, True]} for i in range(50)]
    data = ("\ufeff [\n " + ",\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n] ").encode()
    assert list(iter_rows(io.BytesIO(data), "json")) == list(enumerate(rows, start=1))
    assert list(iter_rows(io.BytesIO(b"[]"), "json")) == []
    assert list(iter_rows(io.BytesIO(b"[1, 23]"), "json")) == [(1, 1), (2, 23)]


@pytest.mark.parametrize(
    ("data", "rows_before", "reason"),
    [
        (b'[{"a": 1},\n {"a": 2}, {"a": }]', 2, "line 2 column 18"),
        (b'[{"a": 1} {"a": 2}]', 1, "expected ',' or ']'"),
        (b'[{"a": 1},', 1, "not closed"),
        (b'{"a": 1}', 0, None),
        (b'[{"a": 1}] x', 1, "extra data"),
    ],
)
def test_broken_json_array_reports_where(data: bytes, rows_before: int, reason: str | None) -> None:
    rows = list(iter_rows(io.BytesIO(data), "json"))
    if reason is None:  # an object, not an array: read as JSON Lines
        assert rows == [(1, {"a": 1})]
        return
    assert all(not isinstance(r, RowError) for _, r in rows[:rows_before])
    last = rows[-1][1]
    assert isinstance(last, RowError) and last.kind == "broken" and reason in last.reason


@pytest.mark.parametrize("chunk_bytes", [4, 7, 1 << 20])
@pytest.mark.parametrize(
    ("data", "where"),
    [
        (b'[{"a": 1},\n  {"a": broken},\n {"a": 3}]', "line 2 column 9"),
        ('\ufeff[{"é": "ü"}, {"a": }]'.encode(), "line 1 column 20"),
        (b'[\n{"a": 1},\n\n   {"a": 2} {"a": 3}]', "line 4 column 13"),
    ],
)
def test_broken_json_array_column_is_the_editors_column(
    data: bytes, where: str, chunk_bytes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # However the reads split the file, the position is the line and column an editor shows (BOM not counted).
    monkeypatch.setattr(loading, "_READ_CHUNK_BYTES", chunk_bytes)
    last = list(iter_rows(io.BytesIO(data), "json"))[-1][1]
    assert isinstance(last, RowError) and last.reason.endswith(where), last.reason


def test_truncated_gzip_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl.gz"
    path.write_bytes(gzip.compress(b'{"text": "a"}\n' * 1000)[:-30])
    with pytest.raises(loading.DataCheckError, match="cannot be read to the end"):
        check_dataset(path)


@pytest.mark.parametrize("words", [5, 6, 40, 300])
def test_numpy_minhash_equals_its_definition(words: int) -> None:
    text = " ".join(f"Word{i % 17}x{i}" for i in range(words))
    assert minhash(text) == minhash_reference(text)
    assert minhash("too short text") is None


def test_csv_streams_with_a_bom(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_bytes('\ufeffprompt,completion\n"a, b",c\n'.encode())
    report = check_dataset(path)
    assert report.detected_format == "prompt_completion" and report.rows_total == 1


@given(st.from_regex(r"[1-9][0-9]{10}", fullmatch=True))
def test_an_eleven_digit_number_is_personal_data_only_with_a_valid_checksum(number: str) -> None:
    kinds = [f.kind for f in find_pii(1, {"text": f"no {number} ok"})]
    assert kinds == (["tc_kimlik"] if tc_kimlik_valid(number) else [])


@given(st.from_regex(r"4[0-9]{15}", fullmatch=True))
def test_a_card_number_is_personal_data_only_when_luhn_holds(number: str) -> None:
    grouped = " ".join(number[i : i + 4] for i in range(0, 16, 4))
    kinds = [f.kind for f in find_pii(1, {"text": f"kart {grouped} tamam"})]
    assert kinds == (["payment_card"] if luhn_valid(number) else [])


@given(st.from_regex(r"TR[0-9]{24}", fullmatch=True))
def test_an_iban_is_personal_data_only_when_mod_97_holds(iban: str) -> None:
    kinds = [f.kind for f in find_pii(1, {"text": f"IBAN {iban} lutfen"})]
    assert kinds == (["iban"] if iban_valid(iban) else [])


def test_a_full_near_duplicate_index_says_so(planted: tuple[Path, Planted], monkeypatch: pytest.MonkeyPatch) -> None:
    from services.datacheck import report as report_module

    path, truth = planted
    monkeypatch.setattr(report_module, "NEAR_DUPLICATE_INDEX_ROWS", 500)
    capped = check_dataset(path)
    assert capped.notes and "index is full at 500 kept rows" in capped.notes[0]
    # Copies of the first 500 rows are still found; exact duplicates and counts do not depend on the index.
    found = {d.row_number: d.duplicate_of for d in capped.near_duplicates}
    assert found == {row: of for row, of in truth.near.items() if of <= 500}
    assert capped.counts["exact_duplicates"] == len(truth.exact)
    monkeypatch.undo()
    assert check_dataset(path).notes == ()
