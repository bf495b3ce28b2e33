"""Read a data set row by row: JSONL, JSON array, CSV (optionally gzip), Parquet when pyarrow is installed."""

from __future__ import annotations

import csv
import gzip
import importlib
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal, cast

FILE_FORMATS = ("jsonl", "json", "csv", "parquet")
# Lone surrogates are what errors="surrogateescape" leaves for bytes that are not UTF-8.
_SURROGATE_LOW, _SURROGATE_HIGH = "\udc80", "\udcff"


class DataCheckError(ValueError):
    """A data set or an argument the checker cannot work with; the message names the field."""


@dataclass(frozen=True)
class RowError:
    """A row that could not be read: `kind` is "broken" (not parseable) or "encoding" (not UTF-8)."""

    kind: Literal["broken", "encoding"]
    reason: str


def file_format(path: str | Path) -> str:
    """The file format from the name (a trailing `.gz` is ignored); one of FILE_FORMATS."""
    name = Path(path).name.lower()
    if name.endswith(".gz"):
        name = name[:-3]
    suffix = name.rsplit(".", 1)[-1] if "." in name else ""
    if suffix == "ndjson":
        return "jsonl"
    if suffix not in FILE_FORMATS:
        raise DataCheckError(
            f"path: unsupported file type {suffix!r}; allowed: {', '.join(FILE_FORMATS)} (optionally .gz)"
        )
    return suffix


def _open_bytes(path: Path) -> IO[bytes]:
    if path.name.lower().endswith(".gz"):
        return cast(IO[bytes], gzip.open(path, "rb"))
    return path.open("rb")


def _has_bad_bytes(value: Any) -> bool:
    """Whether a decoded value still holds escaped non-UTF-8 bytes anywhere inside it."""
    if isinstance(value, str):
        return any(_SURROGATE_LOW <= ch <= _SURROGATE_HIGH for ch in value)
    if isinstance(value, dict):
        return any(_has_bad_bytes(k) or _has_bad_bytes(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_bad_bytes(v) for v in value)
    return False


_ENCODING_ERROR = RowError("encoding", "bytes that are not valid UTF-8")


def _jsonl_rows(handle: IO[bytes]) -> Iterator[tuple[int, Any]]:
    # Row number = line number, so an editor can jump to it; blank lines are skipped but still counted.
    for number, raw in enumerate(handle, start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            yield number, RowError("encoding", f"bytes that are not valid UTF-8 at byte {exc.start}")
            continue
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as exc:
            yield number, RowError("broken", f"not valid JSON: {exc.msg} at column {exc.colno}")


def _json_array_rows(text: str) -> Iterator[tuple[int, Any]]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        yield 1, RowError("broken", f"file is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}")
        return
    if not isinstance(data, list):
        yield 1, RowError("broken", f"a .json file must hold an array of rows, found {type(data).__name__}")
        return
    for number, item in enumerate(data, start=1):
        yield number, _ENCODING_ERROR if _has_bad_bytes(item) else item


def _csv_rows(text: str) -> Iterator[tuple[int, Any]]:
    # Row 1 is the first data row after the header.
    reader = csv.DictReader(io.StringIO(text, newline=""))
    for number, record in enumerate(reader, start=1):
        if None in record:
            yield number, RowError("broken", f"more cells than the {len(reader.fieldnames or [])} header columns")
        elif any(v is None for v in record.values()):
            yield number, RowError("broken", f"fewer cells than the {len(reader.fieldnames or [])} header columns")
        elif _has_bad_bytes(record):
            yield number, _ENCODING_ERROR
        else:
            yield number, dict(record)


def _parquet_rows(path: Path) -> Iterator[tuple[int, Any]]:
    try:
        parquet: Any = importlib.import_module("pyarrow.parquet")
    except ImportError as exc:
        raise DataCheckError("path: Parquet needs the optional package pyarrow (pip install pyarrow)") from exc
    table = parquet.read_table(str(path))
    yield from enumerate(table.to_pylist(), start=1)


def load_rows(path: str | Path) -> Iterator[tuple[int, Any]]:
    """Yield (row_number, row) with 1-based numbers; a row that cannot be read is a RowError with its reason."""
    source = Path(path)
    kind = file_format(source)
    if not source.is_file():
        raise DataCheckError(f"path: no such file {str(source)!r}")
    if kind == "parquet":
        yield from _parquet_rows(source)
        return
    with _open_bytes(source) as handle:
        if kind == "jsonl":
            yield from _jsonl_rows(handle)
            return
        data = handle.read()
    text = data.decode("utf-8", errors="surrogateescape").removeprefix("\ufeff")
    if kind == "csv":
        yield from _csv_rows(text)
    elif text.lstrip().startswith("["):
        yield from _json_array_rows(text)
    else:
        # Many ".json" files are really JSON Lines.
        yield from _jsonl_rows(io.BytesIO(data))
