"""Read a data set row by row: JSONL, JSON array, CSV (optionally gzip), Parquet when pyarrow is installed."""

from __future__ import annotations

import codecs
import csv
import gzip
import importlib
import io
import json
import zlib
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
        if number == 1:
            line = line.removeprefix("\ufeff")  # a byte-order mark (Windows editors write one) is not data
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as exc:
            yield number, RowError("broken", f"not valid JSON: {exc.msg} at column {exc.colno}")


class _Chained(io.RawIOBase):
    """`prefix` bytes, then the rest of `handle`: lets a reader look at the start of a stream it cannot seek."""

    def __init__(self, prefix: bytes, handle: IO[bytes]) -> None:
        self._prefix = prefix
        self._handle = handle

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        if self._prefix:
            n = min(len(view), len(self._prefix))
            view[:n] = self._prefix[:n]
            self._prefix = self._prefix[n:]
            return n
        data = self._handle.read(len(view))
        view[: len(data)] = data
        return len(data)


# A JSON array element larger than this is reported as broken rather than buffered without bound.
MAX_JSON_ELEMENT_BYTES = 64 * 1024 * 1024
_READ_CHUNK_BYTES = 1 << 20


def _json_array_rows(handle: IO[bytes]) -> Iterator[tuple[int, Any]]:
    """Elements of a top-level JSON array, decoded one at a time from the stream (never the whole file)."""
    decoder = json.JSONDecoder()
    text_decoder = codecs.getincrementaldecoder("utf-8")(errors="surrogateescape")
    # lines_before / columns_before: where buf[0] sits in the file (newlines before it, characters
    # before it on its line), so an error position inside the buffer maps to the file's line and column.
    buf, pos, lines_before, columns_before, eof = "", 0, 0, 0, False
    number = 0

    def fill() -> bool:
        nonlocal buf, pos, lines_before, columns_before, eof
        if eof:
            return False
        chunk = handle.read(_READ_CHUNK_BYTES)
        eof = not chunk
        consumed = buf[:pos]
        lines_before += consumed.count("\n")
        if "\n" in consumed:
            columns_before = len(consumed) - consumed.rfind("\n") - 1
        else:
            columns_before += len(consumed.replace("\ufeff", ""))  # an editor does not count the BOM
        buf = buf[pos:] + text_decoder.decode(chunk, final=eof)
        pos = 0
        return bool(chunk)

    def skip_space() -> bool:
        nonlocal pos
        while True:
            while pos < len(buf) and buf[pos] in " \t\r\n":
                pos += 1
            if pos < len(buf):
                return True
            if not fill():
                return False

    def broken(message: str, at: int) -> RowError:
        line = lines_before + buf.count("\n", 0, at) + 1
        newline = buf.rfind("\n", 0, at)
        column = at - newline if newline >= 0 else columns_before + len(buf[:at].replace("\ufeff", "")) + 1
        return RowError("broken", f"file is not valid JSON: {message} at line {line} column {column}")

    fill()
    if buf.startswith("\ufeff"):
        pos = 1
    if not skip_space() or buf[pos] != "[":
        found = "nothing" if pos >= len(buf) else repr(buf[pos])
        yield 1, RowError("broken", f"a .json file must hold an array of rows, found {found} at the start")
        return
    pos += 1
    expect_value = True
    while True:
        if not skip_space():
            yield number + 1, broken("the array is not closed with ']'", len(buf))
            return
        if buf[pos] == "]" and (number == 0 or not expect_value):
            pos += 1
            if skip_space():
                yield number + 1, broken("extra data after the array", pos)
            return
        if not expect_value:
            if buf[pos] != ",":
                yield number + 1, broken("expected ',' or ']'", pos)
                return
            pos += 1
            expect_value = True
            continue
        while True:
            try:
                item, end = decoder.raw_decode(buf, pos)
                # A number or literal that ends exactly at the buffer's end may continue in the next chunk.
                if end < len(buf) or eof:
                    break
            except json.JSONDecodeError as exc:
                if eof or len(buf) - pos > MAX_JSON_ELEMENT_BYTES:
                    yield number + 1, broken(exc.msg, exc.pos)
                    return
            fill()
        number += 1
        pos = end
        expect_value = False
        yield number, _ENCODING_ERROR if _has_bad_bytes(item) else item


def _csv_rows(text: IO[str]) -> Iterator[tuple[int, Any]]:
    # Row 1 is the first data row after the header.
    reader = csv.DictReader(text)
    for number, record in enumerate(reader, start=1):
        if None in record:
            yield number, RowError("broken", f"more cells than the {len(reader.fieldnames or [])} header columns")
        elif any(v is None for v in record.values()):
            yield number, RowError("broken", f"fewer cells than the {len(reader.fieldnames or [])} header columns")
        elif _has_bad_bytes(record):
            yield number, _ENCODING_ERROR
        else:
            yield number, dict(record)


def _parquet_rows(source: Any) -> Iterator[tuple[int, Any]]:
    """Rows of a Parquet file (a path or a seekable binary file), read one record batch at a time."""
    try:
        parquet: Any = importlib.import_module("pyarrow.parquet")
    except ImportError as exc:
        raise DataCheckError("path: Parquet needs the optional package pyarrow (pip install pyarrow)") from exc
    try:
        reader = parquet.ParquetFile(source)
    except Exception as exc:  # pyarrow raises its own error types for files that are not Parquet
        yield 1, RowError("broken", f"not a readable Parquet file: {exc}")
        return
    number = 0
    for batch in reader.iter_batches(batch_size=4096):
        for row in batch.to_pylist():
            number += 1
            yield number, row


def iter_rows(handle: IO[bytes], kind: str, *, gzipped: bool = False) -> Iterator[tuple[int, Any]]:
    """Rows of a binary stream in file format `kind` (one of FILE_FORMATS), read as they arrive.

    Yields (row_number, row) with 1-based numbers; a row that cannot be read is a RowError. Memory stays
    bounded by one row (one record batch for Parquet, which needs a seekable `handle`)."""
    if kind not in FILE_FORMATS:
        raise DataCheckError(f"format: unsupported file type {kind!r}; allowed: {', '.join(FILE_FORMATS)}")
    if gzipped:
        handle = cast(IO[bytes], gzip.GzipFile(fileobj=handle, mode="rb"))
    if kind == "parquet":
        yield from _parquet_rows(handle)
        return
    try:
        if kind == "jsonl":
            yield from _jsonl_rows(io.BufferedReader(_Chained(b"", handle), _READ_CHUNK_BYTES))
        elif kind == "csv":
            text = io.TextIOWrapper(
                io.BufferedReader(_Chained(b"", handle), _READ_CHUNK_BYTES),
                encoding="utf-8-sig",
                errors="surrogateescape",
                newline="",
            )
            yield from _csv_rows(text)
        else:
            head = handle.read(_READ_CHUNK_BYTES)
            if head.lstrip(b" \t\r\n").removeprefix(b"\xef\xbb\xbf").lstrip(b" \t\r\n").startswith(b"["):
                yield from _json_array_rows(_Chained(head, handle))  # type: ignore[arg-type]
            else:
                # Many ".json" files are really JSON Lines.
                yield from _jsonl_rows(io.BufferedReader(_Chained(head, handle), _READ_CHUNK_BYTES))
    except (OSError, EOFError, zlib.error) as exc:
        # A truncated or corrupt gzip stream: the rows before it were read; the rest cannot be.
        raise DataCheckError(f"file: cannot be read to the end ({exc})") from exc


def load_rows(path: str | Path) -> Iterator[tuple[int, Any]]:
    """Yield (row_number, row) with 1-based numbers; a row that cannot be read is a RowError with its reason."""
    source = Path(path)
    kind = file_format(source)
    if not source.is_file():
        raise DataCheckError(f"path: no such file {str(source)!r}")
    if kind == "parquet" and not source.name.lower().endswith(".gz"):
        yield from _parquet_rows(str(source))
        return
    with source.open("rb") as handle:
        yield from iter_rows(handle, kind, gzipped=source.name.lower().endswith(".gz"))
