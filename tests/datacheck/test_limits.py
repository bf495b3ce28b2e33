"""The readers' limits (limits.py): what passes one is refused with the limit, its value and its setting named."""

from __future__ import annotations

import bz2
import gzip
import io
import json
from pathlib import Path

import pytest

from services.datacheck import DataLimitError, Limits, RowError, check_dataset, iter_rows, load_rows

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
    assert sum(1 for _ in load_rows(path)) == 200_000  # under the default floor of 256 MiB


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
