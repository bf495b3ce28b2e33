"""The readers' limits (limits.py): what passes one is refused with the limit, its value and its setting named."""

from __future__ import annotations

import bz2
import gzip
import io
import json
from pathlib import Path

import pytest

from services.datacheck import (
    DataCheckError,
    DataLimitError,
    Limits,
    RowError,
    check_dataset,
    counter_from_json,
    iter_rows,
    load_rows,
    loading,
)
from tests.datacheck.planted import BACKTRACKING_TOKENIZER

SMALL = Limits(record_bytes=4096, cell_bytes=1024, expansion_floor_bytes=2**20, expansion_ratio=10)


def test_a_jsonl_line_over_the_record_limit_is_refused_before_it_is_held(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl.gz"
    path.write_bytes(gzip.compress(b'{"text": "ok"}\n{"text": "' + b"a" * 10_000 + b'"}\n'))
    with pytest.raises(DataLimitError, match=r"line 2 of data.jsonl.gz is over the 4 KiB record limit "):
        list(load_rows(path, SMALL))
    # Exactly at the limit is fine; the newline does not count.
    line = b'{"text": "' + b"a" * (4096 - 12) + b'"}'
    assert len(line) == 4096
    assert [n for n, _ in iter_rows(io.BytesIO(line + b"\r\n"), "jsonl", limits=SMALL)] == [1]


def test_a_json_array_element_over_the_record_limit_is_refused() -> None:
    data = json.dumps([{"text": "a"}, {"text": "b" * 10_000}]).encode()
    with pytest.raises(DataLimitError, match="element 2 of the file is over the 4 KiB record limit"):
        list(iter_rows(io.BytesIO(data), "json", limits=SMALL))
    many = json.dumps([{"text": "c" * 1000}] * 50).encode()  # long files are fine, one element at a time
    assert len(list(iter_rows(io.BytesIO(many), "json", limits=SMALL))) == 50


def test_csv_cells_past_pythons_128_kib_are_read_and_past_ours_refused(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text("prompt,completion\n" + "x" * 200 * 1024 + ",answer\n", encoding="utf-8")
    report = check_dataset(path)  # the default cell limit is 16 MiB
    assert report.rows_total == 1 and report.detected_format == "prompt_completion"
    with pytest.raises(
        DataLimitError, match=r"row 1 of d.csv is over the 1 KiB cell limit \(GPUPLAN_DATACHECK_MAX_CELL"
    ):
        check_dataset(path, limits=Limits(record_bytes=2**20, cell_bytes=1024))
    # A quoted cell running over many lines counts as one record.
    lines = "prompt,completion\n" + '"' + "y\n" * 5000 + '",z\n'
    with pytest.raises(DataLimitError, match="record limit"):
        list(iter_rows(io.BytesIO(lines.encode()), "csv", limits=SMALL))


def test_a_bom_csv_is_read_without_the_bom() -> None:
    rows = list(iter_rows(io.BytesIO("\ufeffprompt,completion\na,b\n".encode()), "csv"))
    assert rows == [(1, {"prompt": "a", "completion": "b"})]


def test_bz2_past_the_expansion_limit_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl.bz2"
    path.write_bytes(bz2.compress(b'{"text": "hello there"}\n' * 200_000))
    assert path.stat().st_size < 2000
    with pytest.raises(DataLimitError, match=r"data.jsonl.bz2 decodes to more than 1 MiB, over the expansion limit"):
        list(load_rows(path, SMALL))
    # Under the default floor of 256 MiB (the line limit, 200,000 lines in 2 KB, raised to let it through).
    assert sum(1 for _ in load_rows(path, Limits(line_floor=200_000))) == 200_000


def test_too_deep_json_is_a_broken_row_not_a_crash() -> None:
    data = b"[" * 100 + b"]" * 100 + b"\n" + b"[" * 100_000 + b"\n" + b'{"text": "fine"}\n'
    rows = list(iter_rows(io.BytesIO(data), "jsonl"))
    assert [n for n, _ in rows] == [1, 2, 3]
    assert all(isinstance(r, RowError) and r.kind == "broken" for _, r in rows[:2])
    assert rows[2][1] == {"text": "fine"}


pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def test_parquet_column_chunks_are_checked_from_the_footer_first(tmp_path: Path) -> None:
    path = tmp_path / "big.parquet"
    pq.write_table(pa.table({"text": [f"row {i} " + "z" * 1000 for i in range(3000)]}), path, compression="zstd")
    with pytest.raises(DataLimitError, match=r"row group 1, column 'text' of big.parquet is \d\.\d MiB uncompressed"):
        list(load_rows(path, Limits(column_chunk_bytes=2**20)))
    assert sum(1 for _ in load_rows(path)) == 3000


def test_a_dictionary_bomb_is_measured_without_expanding_it(tmp_path: Path) -> None:
    path = tmp_path / "bomb.parquet"
    value = "a" * (8 * 10**6)
    pq.write_table(pa.table({"text": pa.array([value] * 60).dictionary_encode()}), path, compression="zstd")
    assert path.stat().st_size < 2000
    with pytest.raises(DataLimitError, match=r"bomb.parquet decodes to more than 256 MiB"):
        for _ in load_rows(path):
            pass
    with pytest.raises(DataLimitError, match=r"column 'text', row 1 of bomb.parquet, is over the 1 MiB cell limit"):
        list(load_rows(path, Limits(cell_bytes=2**20)))


def test_parquet_nested_rows_are_measured_and_read(tmp_path: Path) -> None:
    path = tmp_path / "chat.parquet"
    rows = [
        {"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a" * 100 * i}]}
        for i in range(50)
    ]
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=25)
    assert [r for _, r in load_rows(path)] == rows
    # Row 42 holds 4,100 characters of answer: over a 4 KiB record limit.
    with pytest.raises(DataLimitError, match=r"row 42 of chat.parquet is over the 4 KiB record limit"):
        list(load_rows(path, Limits(record_bytes=4096, cell_bytes=10_000)))
    with pytest.raises(DataLimitError, match=r"column 'messages', row 12 of chat.parquet, is over the 1 KiB cell"):
        list(load_rows(path, Limits(cell_bytes=1024)))


# --- the line limit: every line costs the check time, blank or not --------------------------------


def test_a_gzip_of_blank_lines_is_refused_at_the_line_limit_not_read_for_minutes(tmp_path: Path) -> None:
    # 1 GB of newlines is a 1 MB gzip, under the expansion limit's 256 MiB floor: 268 million lines took minutes.
    # Scaled down: 2 MiB of newlines in a 2 KiB gzip, past a 100,000-line floor.
    path = tmp_path / "blank.jsonl.gz"
    path.write_bytes(gzip.compress(b"\n" * (2 * 2**20), 9))
    assert path.stat().st_size < 5000
    with pytest.raises(
        DataLimitError,
        match=r"blank.jsonl.gz holds more than 100,000 lines \(blank ones counted\), over the line limit: .*"
        r"at least 100,000 and at most 20,000,000 \(a product limit",
    ):
        check_dataset(path)


@pytest.mark.parametrize("kind", ["jsonl", "csv", "json"])
def test_the_line_limit_counts_every_line_and_is_exact(kind: str) -> None:
    limits = Limits(max_lines=5, line_floor=5)
    row, blank = (b'{"text": "a"}\r\n', b"\r\n") if kind == "json" else (b'{"text": "a"}\n', b"\n")
    # Five lines each: a CSV header is a line too; a .json file may be JSON Lines, here with CRLF.
    at_limit = b"prompt,completion\na,b\n" + blank * 2 + b"a,b\n" if kind == "csv" else row + blank * 3 + row
    assert len(list(iter_rows(io.BytesIO(at_limit), kind, limits=limits))) == 2
    with pytest.raises(DataLimitError, match=r"the file holds more than 5 lines \(blank ones counted\)"):
        list(iter_rows(io.BytesIO(at_limit + blank), kind, limits=limits))


def test_a_json_array_is_refused_past_the_line_limit_in_elements() -> None:
    limits = Limits(max_lines=3, line_floor=3)
    assert len(list(iter_rows(io.BytesIO(b"[1, 2, 3]"), "json", limits=limits))) == 3
    with pytest.raises(DataLimitError, match=r"the file holds more than 3 array elements, over the line limit"):
        list(iter_rows(io.BytesIO(b"[1, 2, 3, 4]"), "json", limits=limits))


def test_the_line_limit_follows_the_stored_size() -> None:
    limits = Limits()
    assert limits.line_limit(None) == 20_000_000
    assert limits.line_limit(1000) == 100_000  # the floor
    assert limits.line_limit(5 * 10**6) == 5 * 10**6  # one per byte stored, as a plain file could hold
    assert limits.line_limit(10**12) == 20_000_000


def test_whitespace_inside_a_json_array_is_skipped_across_reads() -> None:
    # Skipped a character at a time in Python, 64 MiB of spaces took 12 s (a 64 KiB gzip under the expansion floor);
    # now a regex skips it. What a test can hold without timing it: whitespace spanning several 1 MiB reads, before,
    # between and after elements, is skipped and the elements are read where they are.
    data = b"[" + b" \n" * (2**20) + b'{"text": "a"},' + b"\t" * (3 * 2**20) + b'{"text": "b"}' + b" " * (2**20) + b"]"
    assert list(iter_rows(io.BytesIO(data), "json")) == [(1, {"text": "a"}), (2, {"text": "b"})]


def test_parquet_past_the_line_limit_is_refused_from_the_footer(tmp_path: Path) -> None:
    # 30 million int8 zeros are a 110 KB Parquet file under the expansion floor: its rows took 33 s to read.
    path = tmp_path / "many.parquet"
    pq.write_table(pa.table({"text": pa.array([0] * 50, pa.int8())}), path)
    limits = Limits(max_lines=49, line_floor=49)
    with pytest.raises(DataLimitError, match=r"many.parquet holds more than 49 rows, over the line limit"):
        next(iter(load_rows(path, limits)))
    assert sum(1 for _ in load_rows(path, Limits(max_lines=50, line_floor=50))) == 50


def test_a_parquet_string_column_of_nulls_only_is_read(tmp_path: Path) -> None:
    # Its dictionary is empty: measuring it raised IndexError (an internal error of the check).
    path = tmp_path / "nulls.parquet"
    pq.write_table(pa.table({"text": pa.nulls(3, pa.string()), "n": [1, 2, 3]}), path)
    assert [row for _, row in load_rows(path)] == [{"text": None, "n": n} for n in (1, 2, 3)]
    assert check_dataset(path).counts["mismatched_rows"] == 3


@pytest.mark.parametrize("kind", ["jsonl", "csv", "json", "parquet"])
def test_a_row_of_too_many_values_is_broken_before_it_is_walked(
    kind: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # One 20 MB line of ten million numbers took 28 s and 880 MB to check; scaled down to a limit of 50 values.
    monkeypatch.setattr(loading, "MAX_VALUES", 50, raising=False)  # (raising=False: the old code had none)
    if kind == "parquet":  # counted in Arrow: the crowded row never becomes Python objects
        turns = [[{"role": "user", "content": "hi"}] * 4, [{"role": "user", "content": "hi"}] * 12]
        table = pa.table({"text": ["a", "b", "c"], "ids": [list(range(40)), list(range(60)), [1]]})
        rows = []
        for columns in (table, pa.table({"messages": turns})):
            path = tmp_path / "data.parquet"
            pq.write_table(columns, path, row_group_size=2)
            rows += load_rows(path)
        assert [type(row).__name__ for _, row in rows] == ["dict", "RowError", "dict", "dict", "RowError"]
        # 3 + 4 turns x 5 (the turn, its two keys and two values) = 23 values; 3 + 12 x 5 = 63.
        assert (
            rows[1][1]
            == rows[4][1]
            == RowError("broken", "more than 50 values (keys, strings, numbers, lists, objects)")
        )
        return
    if kind == "csv":  # a cell is two values, its column name and its text
        data = b"text," + b",".join(b"c%d" % i for i in range(20)) + b"\nhello there" + b",x" * 20 + b"\n"
        wide = b"text," + b",".join(b"c%d" % i for i in range(30)) + b"\nhello there" + b",x" * 30 + b"\n"
        rows = [*iter_rows(io.BytesIO(data), "csv"), *iter_rows(io.BytesIO(wide), "csv")]
    else:
        good = {"text": "hello there", "ids": list(range(40))}
        bad = {"text": "hello there", "ids": list(range(60))}
        data = (
            json.dumps([good, bad]).encode() if kind == "json" else (json.dumps(good) + "\n" + json.dumps(bad)).encode()
        )
        rows = list(iter_rows(io.BytesIO(data), kind))
    assert not isinstance(rows[0][1], RowError)
    assert rows[1][1] == RowError("broken", "more than 50 values (keys, strings, numbers, lists, objects)")


def test_a_tokenizer_that_panics_on_a_row_fails_the_check_with_a_reason(tmp_path: Path) -> None:
    pytest.importorskip("tokenizers")
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"text": "a" * 40 + "b"}) + "\n", encoding="utf-8")
    counter = counter_from_json(json.dumps(BACKTRACKING_TOKENIZER))
    with pytest.raises(DataCheckError, match=r"tokenizer: the tokenizer failed on a row .*retry-limit-in-match"):
        check_dataset(path, counter=counter)


def test_a_parquet_value_of_nan_or_infinity_is_a_broken_row(tmp_path: Path) -> None:
    # Written back by --write-clean as NaN, which strict JSON readers refuse (as JSON Lines rows holding them are).
    path = tmp_path / "scores.parquet"
    pq.write_table(pa.table({"text": ["a", "b", "c"], "score": [1.0, float("nan"), float("-inf")]}), path)
    rows = [row for _, row in load_rows(path)]
    assert rows[0] == {"text": "a", "score": 1.0}
    assert (
        rows[1]
        == rows[2]
        == RowError("broken", "NaN, Infinity or a number too large for a double, which no JSON holds")
    )
