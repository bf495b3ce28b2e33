"""Reading rows (JSONL, JSON array, CSV, gzip) and detecting the row format."""

from __future__ import annotations

import gzip
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from services.datacheck import DataCheckError, RowError, check_dataset, detect_format, format_votes, load_rows


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def test_jsonl_broken_and_encoding_rows_are_numbered(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"text": "one"}\n{"text": broken\n\n{"text": "\xff\xfe"}\n{"text": "five"}\n')
    rows = list(load_rows(path))
    assert [n for n, _ in rows] == [1, 2, 4, 5]
    assert rows[0] == (1, {"text": "one"})
    broken, encoding = rows[1][1], rows[2][1]
    assert isinstance(broken, RowError) and broken.kind == "broken" and "not valid JSON" in broken.reason
    assert isinstance(encoding, RowError) and encoding.kind == "encoding"


def test_gzip_json_array_and_csv(tmp_path: Path) -> None:
    gz = tmp_path / "d.jsonl.gz"
    with gzip.open(gz, "wt", encoding="utf-8") as handle:
        handle.write('{"text": "a"}\n{"text": "b"}\n')
    assert [r for _, r in load_rows(gz)] == [{"text": "a"}, {"text": "b"}]
    array = tmp_path / "d.json"
    array.write_text(json.dumps([{"text": "a"}, {"text": "b"}]), encoding="utf-8")
    assert [n for n, _ in load_rows(array)] == [1, 2]
    table = tmp_path / "d.csv"
    table.write_text('prompt,completion\n"Hi, there",hello\nx,y,z\n', encoding="utf-8")
    rows = list(load_rows(table))
    assert rows[0] == (1, {"prompt": "Hi, there", "completion": "hello"})
    assert isinstance(rows[1][1], RowError) and rows[1][0] == 2


def test_unsupported_extension_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(DataCheckError, match="path: unsupported file type 'txt'"):
        list(load_rows(tmp_path / "d.txt"))


def test_parquet_without_pyarrow_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A None entry in sys.modules makes `import pyarrow` fail as if it were not installed.
    for name in ("pyarrow", "pyarrow.parquet"):
        monkeypatch.setitem(sys.modules, name, None)
    path = tmp_path / "d.parquet"
    path.write_bytes(b"PAR1")
    with pytest.raises(DataCheckError, match="pyarrow"):
        list(load_rows(path))


CHAT_ROWS: list[Any] = [
    {
        "messages": [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a"},
        ]
    },
    {"messages": [{"role": "USER", "content": "q"}, {"role": "model", "content": "a"}]},
    {"messages": [{"role": "human", "content": "q"}, {"role": "bot", "content": "a"}]},
    {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]},
]


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        (CHAT_ROWS, "chat"),
        ([{"instruction": "i", "input": "", "output": "o"}, {"prompt": "p", "response": "r"}], "alpaca"),
        # Dolly's spelling: instruction / context / response.
        ([{"instruction": "i", "context": "c", "response": "r"}, {"instruction": "j", "response": "s"}], "alpaca"),
        ([{"prompt": "p", "completion": "c"}, {"prompt": "p2", "completion": "c2"}], "prompt_completion"),
        ([{"text": "t"}, {"text": "u"}], "text"),
    ],
)
def test_each_format_detected(rows: list[Any], expected: str) -> None:
    votes = format_votes(rows)
    assert votes[expected] == len(rows)
    assert detect_format(votes) == expected


def test_dolly_rows_train_on_instruction_context_and_response() -> None:
    from services.datacheck.formats import row_text

    text = row_text({"instruction": "Summarise.", "context": "Long text.", "response": "Short."}, "alpaca")
    assert text.text == "Summarise.\nLong text.\nShort." and text.target == "Short."
    votes = format_votes([{"instruction": "i", "context": 3, "response": "r"}])
    assert votes["alpaca"] == 0


def test_mismatched_rows_listed_with_reason(tmp_path: Path) -> None:
    rows: list[Any] = [
        *CHAT_ROWS,
        {"messages": [{"role": "user", "content": "q"}, {"role": "narrator", "content": "a"}]},
        {"text": "plain"},
        [1, 2],
    ]
    report = check_dataset(write_jsonl(tmp_path / "d.jsonl", rows))
    assert report.detected_format == "chat"
    reasons = {p.row_number: p.reason for p in report.mismatched_rows}
    assert set(reasons) == {5, 6, 7}
    assert "unknown role 'narrator'" in reasons[5]
    assert "no 'messages'" in reasons[6]
    assert "not an object" in reasons[7]


def test_report_counts_broken_rows_and_is_json(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "a b c"}\nnot json\n', encoding="utf-8")
    calls: list[tuple[int, int]] = []
    report = check_dataset(path, progress=lambda done, total: calls.append((done, total)))
    assert [(p.row_number, p.reason[:14]) for p in report.broken_rows] == [(2, "not valid JSON")]
    assert calls == [(2, 2)]
    assert json.loads(report.model_dump_json())["rows_total"] == 2


def test_tokenizer_json_without_tokenizers_falls_back_with_a_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    assert importlib.util.find_spec("tokenizers") is None
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": "abcd" * 10}])
    report = check_dataset(path, tokenizer_json=tmp_path / "tokenizer.json")
    assert report.tokens.method == "approx_4_chars_per_token"
    assert report.tokens.max_tokens == 10 + 2  # 40 characters / 4, plus the estimate's BOS and train.py's EOS
    assert "tokenizers package is not installed" in report.tokens.notes[0]


def test_tokenizer_json_gives_exact_counts(tmp_path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": "a a a a a"}, {"text": "a b"}])
    report = check_dataset(path, tokenizer_json=tmp_path / "tokenizer.json")
    assert report.tokens.method == "tokenizer_json"
    # Each row's words plus the EOS train.py appends (this tokenizer's post-processor adds no BOS).
    assert (report.tokens.max_tokens, report.tokens.p50_tokens) == (5 + 1, 2 + 1)


def test_parquet_rows_are_read_with_pyarrow(tmp_path: Path) -> None:
    pyarrow = pytest.importorskip("pyarrow")
    parquet = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "d.parquet"
    parquet.write_table(pyarrow.table({"prompt": ["p1", "p2"], "completion": ["c1", "c2"]}), path)
    assert list(load_rows(path)) == [
        (1, {"prompt": "p1", "completion": "c1"}),
        (2, {"prompt": "p2", "completion": "c2"}),
    ]
    report = check_dataset(path)
    assert (report.file_format, report.detected_format, report.rows_kept) == ("parquet", "prompt_completion", 2)


def test_an_instruction_row_spelled_otherwise_is_a_mismatch(tmp_path: Path) -> None:
    # A trainer's instruction template reads one pair of field names: a prompt/response row in an
    # Alpaca instruction/output file would not train.
    rows: list[Any] = [
        {"instruction": "i1", "input": "", "output": "o1"},
        {"instruction": "i2", "input": "x", "output": "o2"},
        {"prompt": "p", "response": "r"},
        {"instruction": "i3", "output": "o3"},
        {"instruction": "i4", "context": "c", "response": "r4"},
    ]
    report = check_dataset(write_jsonl(tmp_path / "d.jsonl", rows))
    assert report.detected_format == "alpaca"
    reasons = {p.row_number: p.reason for p in report.mismatched_rows}
    assert set(reasons) == {3, 5}
    assert reasons[3] == "fields 'prompt' / 'response' where the file's instruction rows use 'instruction' / 'output'"
    assert report.rows_kept == 3


def test_the_majority_spelling_wins_even_when_the_first_rows_differ(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from services.datacheck import report as report_module

    monkeypatch.setattr(report_module, "FORMAT_PROBE_ROWS", 2)
    rows: list[Any] = [{"prompt": f"p{i}", "response": f"r{i}"} for i in range(2)]
    rows += [{"instruction": f"i{i}", "output": f"o{i}"} for i in range(5)]
    report = check_dataset(write_jsonl(tmp_path / "d.jsonl", rows))
    assert [p.row_number for p in report.mismatched_rows] == [1, 2]
    assert report.rows_kept == 5


def test_a_byte_order_mark_does_not_break_the_first_jsonl_row(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"text": "a"}\r\n{"text": "\xc3\xa9\xc3\xa9", x}\r\n')
    rows = list(load_rows(path))
    assert rows[0] == (1, {"text": "a"})
    broken = rows[1][1]
    # The column an editor shows: characters, not bytes ("é" is two bytes).
    assert isinstance(broken, RowError) and broken.reason.endswith("at column 16")
