"""Read a data set row by row: JSONL, JSON array, CSV (plain, gzip, bz2, or zstd when the zstandard
package is installed), Parquet when pyarrow is installed; every reader works within Limits (limits.py)."""

from __future__ import annotations

import bz2
import codecs
import csv
import gzip
import importlib
import io
import json
import math
import re
import shutil
import tempfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal, cast

import numpy as np
import numpy.typing as npt

from .limits import DataCheckError as DataCheckError
from .limits import DataLimitError, Limits, over_cell, over_expansion, over_lines, over_record, size_text

FILE_FORMATS = ("jsonl", "json", "csv", "parquet")
COMPRESSED_SUFFIXES = (".gz", ".bz2", ".zst", ".zstd")
# Magic numbers: RFC 1952 (gzip), the bzip2 stream header, RFC 8878 section 3.1.1 (zstd frame).
_GZIP_MAGIC, _ZSTD_MAGIC = b"\x1f\x8b", b"\x28\xb5\x2f\xfd"
# Nesting deeper than this is refused per row: the checks that walk a row stay far from Python's recursion limit.
MAX_DEPTH = 64
# Values in one row (object keys, strings, numbers, lists and objects), a product limit: a row with more is refused as
# broken before it is walked further. A row trains as one sequence of at most 32,768 tokens (the largest seq_len
# bucket, tokens.py) and a chat turn costs at least 5 template tokens (training.py), so no trainable row comes near;
# one 20 MB line of ten million numbers took 28 s and 880 MB to check, a 31 MB line of two million keys 31 s.
MAX_VALUES = 100_000
# Lone surrogates are what errors="surrogateescape" leaves for bytes that are not UTF-8, and what a JSON escape such as
# "\ud800" leaves unpaired: neither is Unicode text, so neither can be written as UTF-8 (--write-clean) or tokenized.
_SURROGATE_LOW, _SURROGATE_HIGH = "\ud800", "\udfff"


@dataclass(frozen=True)
class RowError:
    """A row that could not be read: `kind` is "broken" (not parseable) or "encoding" (not UTF-8)."""

    kind: Literal["broken", "encoding"]
    reason: str
    # The file cannot be read past this row (a JSON array's syntax broke): a JSON loader reads none of it, and the
    # rows after it are neither counted nor listed.
    ends_file: bool = False


def compressed_name(path: str | Path) -> bool:
    """Whether the name ends in a compression suffix (.gz, .bz2, .zst, .zstd)."""
    return Path(path).name.lower().endswith(COMPRESSED_SUFFIXES)


def file_format(path: str | Path) -> str:
    """The file format from the name (a trailing compression suffix is ignored); one of FILE_FORMATS."""
    name = Path(path).name.lower()
    for suffix in COMPRESSED_SUFFIXES:
        name = name.removesuffix(suffix)
    suffix = name.rsplit(".", 1)[-1] if "." in name else ""
    if suffix == "ndjson":
        return "jsonl"
    if suffix not in FILE_FORMATS:
        raise DataCheckError(
            f"path: unsupported file type {suffix!r}; allowed: {', '.join(FILE_FORMATS)} (optionally .gz, .bz2 or .zst)"
        )
    return suffix


def _bad_text(text: str) -> bool:
    return any(_SURROGATE_LOW <= ch <= _SURROGATE_HIGH for ch in text)


def _row_problem(value: Any) -> RowError | None:
    """Why a decoded row cannot be used as it is: nested past MAX_DEPTH, more than MAX_VALUES values, or escaped
    non-UTF-8 bytes inside.
    Walks the value with an explicit stack (no recursion, whatever the nesting)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    values = 1
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if _bad_text(item):
                return _ENCODING_ERROR
        elif item is _NOT_FINITE or (isinstance(item, float) and not math.isfinite(item)):  # Parquet: NaN as read
            return _NOT_FINITE_ERROR
        elif isinstance(item, dict | list):
            if depth > MAX_DEPTH:
                return RowError("broken", f"nested more than {MAX_DEPTH} levels deep")
            values += len(item) * (2 if isinstance(item, dict) else 1)
            if values > MAX_VALUES:
                return _too_many_values()
            if isinstance(item, dict):
                stack.extend((k, depth) for k in item)
                stack.extend((v, depth + 1) for v in item.values())
            else:
                stack.extend((v, depth + 1) for v in item)
    return None


class _NotFinite:
    """What the readers put where JSON text holds NaN, Infinity or a number past a double's range: Python's json
    takes them, strict readers do not, and --write-clean wrote them back ("n": Infinity) as rows kept."""


_NOT_FINITE = _NotFinite()
_NOT_FINITE_ERROR = RowError("broken", "NaN, Infinity or a number too large for a double, which no JSON holds")


def _not_finite(_: str) -> _NotFinite:
    return _NOT_FINITE


def _finite_float(text: str) -> float | _NotFinite:
    value = float(text)
    return value if math.isfinite(value) else _NOT_FINITE


def _too_many_values() -> RowError:
    return RowError("broken", f"more than {MAX_VALUES:,} values (keys, strings, numbers, lists, objects)")


_ENCODING_ERROR = RowError("encoding", "bytes that are not valid UTF-8, or an escaped lone surrogate such as \\ud800")
_TOO_LONG_NUMBER = RowError("broken", "not valid JSON: a number of more than 4,300 digits")
_TOO_DEEP = RowError("broken", "not valid JSON: nested too deeply")


def _bounded_lines(
    handle: IO[bytes], limits: Limits, label: str, stored_bytes: int | None = None
) -> Iterator[tuple[int, bytes]]:
    """(line_number, line) with the newline; a line over the record limit is refused before more is read, and
    a file past the line limit (limits.line_limit; blank lines count) when its next line is reached."""
    limit, most = limits.record_bytes, limits.line_limit(stored_bytes)
    number = 0
    while True:
        raw = handle.readline(limit + 2)
        if not raw:
            return
        number += 1
        if number > most:
            raise over_lines(label, limits, stored_bytes)
        if len(raw) - raw.endswith(b"\n") - raw.endswith(b"\r\n") > limit:
            raise over_record(f"line {number} of {label}", limit)
        yield number, raw


def _jsonl_rows(
    handle: IO[bytes], limits: Limits, label: str, stored_bytes: int | None = None
) -> Iterator[tuple[int, Any]]:
    # Row number = line number, so an editor can jump to it; blank lines are skipped but still counted.
    for number, raw in _bounded_lines(handle, limits, label, stored_bytes):
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
            row = json.loads(line, parse_constant=_not_finite, parse_float=_finite_float)
        except json.JSONDecodeError as exc:
            yield number, RowError("broken", f"not valid JSON: {exc.msg} at column {exc.colno}")
            continue
        except RecursionError:
            yield number, _TOO_DEEP
            continue
        except ValueError:  # an integer over sys.get_int_max_str_digits() digits: json.loads refuses to convert it
            yield number, _TOO_LONG_NUMBER
            continue
        # The line decoded as UTF-8, so an encoding problem here is an escaped lone surrogate ("\ud800"): refused
        # as undecodable bytes are, since --write-clean could not write it back as UTF-8 (it raised mid-file).
        yield number, _row_problem(row) or row


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


_READ_CHUNK_BYTES = 1 << 20
# JSON's whitespace (RFC 8259 section 2), skipped in C: a character at a time in Python, 64 MiB of spaces inside an
# array took 12 s.
_JSON_SPACE = re.compile(r"[ \t\r\n]*")


def _json_array_rows(
    handle: IO[bytes], limits: Limits, label: str, stored_bytes: int | None = None
) -> Iterator[tuple[int, Any]]:
    """Elements of a top-level JSON array, decoded one at a time from the stream (never the whole file);
    an element over the record limit (counted in characters) is refused, and a file past the line limit
    (limits.line_limit, counting elements)."""
    most = limits.line_limit(stored_bytes)
    decoder = json.JSONDecoder(parse_constant=_not_finite, parse_float=_finite_float)
    text_decoder = codecs.getincrementaldecoder("utf-8")(errors="surrogateescape")
    # lines_before / columns_before: where buf[0] sits in the file (newlines before it, characters
    # before it on its line), so an error position inside the buffer maps to the file's line and column.
    buf, pos, lines_before, columns_before, eof = "", 0, 0, 0, False
    number = 0

    def fill(size: int = _READ_CHUNK_BYTES) -> bool:
        nonlocal buf, pos, lines_before, columns_before, eof
        if eof:
            return False
        chunk = handle.read(size)
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
            space = _JSON_SPACE.match(buf, pos)  # always matches (maybe the empty string)
            pos = space.end() if space else pos
            if pos < len(buf):
                return True
            if not fill():
                return False

    def broken(message: str, at: int) -> RowError:
        line = lines_before + buf.count("\n", 0, at) + 1
        newline = buf.rfind("\n", 0, at)
        column = at - newline if newline >= 0 else columns_before + len(buf[:at].replace("\ufeff", "")) + 1
        return RowError("broken", f"file is not valid JSON: {message} at line {line} column {column}", ends_file=True)

    fill()
    if buf.startswith("\ufeff"):
        pos = 1
    if not skip_space() or buf[pos] != "[":
        found = "nothing" if pos >= len(buf) else repr(buf[pos])
        yield (
            1,
            RowError("broken", f"a .json file must hold an array of rows, found {found} at the start", ends_file=True),
        )
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
                if eof:
                    yield number + 1, broken(exc.msg, exc.pos)
                    return
            except RecursionError:
                yield number + 1, broken("nested too deeply", pos)
                return
            except ValueError:  # an integer over sys.get_int_max_str_digits() digits (JSONDecodeError is caught above)
                yield number + 1, broken("a number of more than 4,300 digits", pos)
                return
            pending = len(buf) - pos
            if pending > limits.record_bytes:
                raise over_record(f"element {number + 1} of {label}", limits.record_bytes)
            # Read until the pending text has doubled: a long element is parsed O(log n) times, not O(n).
            fill(max(_READ_CHUNK_BYTES, pending))
        if end - pos > limits.record_bytes:
            raise over_record(f"element {number + 1} of {label}", limits.record_bytes)
        if number >= most:
            raise over_lines(label, limits, stored_bytes, "array elements")
        number += 1
        pos = end
        expect_value = False
        yield number, _row_problem(item) or item


class _RecordLines:
    """The decoded lines of a CSV file for csv.reader, refusing a record (one or more lines) over the
    record limit as it is read: `record_bytes` is reset by the caller at each record boundary."""

    def __init__(self, handle: IO[bytes], limits: Limits, label: str, stored_bytes: int | None = None) -> None:
        self._lines = _bounded_lines(handle, limits, label, stored_bytes)
        self.limit, self.label = limits.record_bytes, label
        self.record_bytes = 0
        self.line = 0

    def __iter__(self) -> _RecordLines:
        return self

    def __next__(self) -> str:
        self.line, raw = next(self._lines)
        self.record_bytes += len(raw)
        if self.record_bytes > self.limit + 2:
            raise over_record(f"the record ending on line {self.line} of {self.label}", self.limit)
        text = raw.decode("utf-8", errors="surrogateescape")
        return text.removeprefix("\ufeff") if self.line == 1 else text  # a BOM (Excel writes one) is not data


def _csv_rows(
    handle: IO[bytes], limits: Limits, label: str, stored_bytes: int | None = None
) -> Iterator[tuple[int, Any]]:
    # Row 1 is the first data row after the header. The csv module's own cell limit (128 KiB by default,
    # process-wide) is raised to ours and never lowered; ours is checked on each record.
    if csv.field_size_limit() < limits.cell_bytes:
        csv.field_size_limit(limits.cell_bytes)
    lines = _RecordLines(handle, limits, label, stored_bytes)
    reader = csv.DictReader(lines)
    number = 0
    while True:
        lines.record_bytes = 0
        try:
            record = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            if "field larger than field limit" in str(exc):
                raise over_cell(f"a cell on line {lines.line} of {label}", limits.cell_bytes) from None
            raise DataCheckError(f"{label}: line {lines.line} is not valid CSV ({exc})") from None
        number += 1
        cells = [*record.values(), *(record.get(None) or [])]
        if any(isinstance(v, str) and len(v) > limits.cell_bytes for v in cells):
            raise over_cell(f"a cell in row {number} of {label}", limits.cell_bytes)
        if None in record:
            yield number, RowError("broken", f"more cells than the {len(reader.fieldnames or [])} header columns")
        elif any(v is None for v in record.values()):
            yield number, RowError("broken", f"fewer cells than the {len(reader.fieldnames or [])} header columns")
        else:  # not UTF-8, or more than MAX_VALUES cells
            yield number, _row_problem(record) or dict(record)


# --- Parquet --------------------------------------------------------------------------------------

# Rows are turned into Python objects this many bytes at a time, and a record batch aims at this size.
_PARQUET_SLICE_BYTES = 16 * 2**20
_PARQUET_BATCH_ROWS = 4096
# pyarrow reads a column chunk through a buffer of this size, page by page, instead of all at once
# (ParquetFile buffer_size; 0, the default, reads the whole chunk).
_PARQUET_BUFFER_BYTES = 1 << 20


def _arrow() -> tuple[Any, Any, Any]:
    try:
        return (
            importlib.import_module("pyarrow"),
            importlib.import_module("pyarrow.compute"),
            importlib.import_module("pyarrow.parquet"),
        )
    except ImportError as exc:
        raise DataCheckError("path: Parquet needs the optional package pyarrow (pip install pyarrow)") from exc


def _cell_sizes(pa: Any, pc: Any, array: Any) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Per row of an Arrow array: the bytes its values decode to (at least 1) and its longest string.
    A dictionary column is measured through its dictionary, without expanding it."""
    kind = array.type
    rows = len(array)
    if pa.types.is_dictionary(kind):
        valid = array.is_valid().to_numpy(zero_copy_only=False)
        if not len(array.dictionary):  # every value null: index 0 would be out of range (was an IndexError)
            return np.ones(rows, dtype=np.int64), np.zeros(rows, dtype=np.int64)
        total, longest = _cell_sizes(pa, pc, array.dictionary)
        index = pc.fill_null(array.indices, 0).to_numpy(zero_copy_only=False).astype(np.int64)
        return np.where(valid, total[index], 1), np.where(valid, longest[index], 0)
    if (
        pa.types.is_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_string(kind)
        or (pa.types.is_large_binary(kind))
    ):
        lengths = pc.fill_null(pc.binary_length(array), 0).to_numpy(zero_copy_only=False).astype(np.int64)
        return np.maximum(lengths, 1), lengths
    if pa.types.is_struct(kind):
        total, longest = np.ones(rows, dtype=np.int64), np.zeros(rows, dtype=np.int64)
        for field in array.flatten():
            t, m = _cell_sizes(pa, pc, field)
            total += t
            np.maximum(longest, m, out=longest)
        return total, longest
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        values = array.flatten()
        parents = pc.list_parent_indices(array).to_numpy(zero_copy_only=False).astype(np.int64)
        t, m = _cell_sizes(pa, pc, values)
        total = np.ones(rows, dtype=np.int64)
        np.add.at(total, parents, t)
        longest = np.zeros(rows, dtype=np.int64)
        np.maximum.at(longest, parents, m)
        return total, longest
    width = getattr(kind, "bit_width", 64)
    return np.full(rows, max(1, width // 8), dtype=np.int64), np.zeros(rows, dtype=np.int64)


def _nested_values(pa: Any, pc: Any, array: Any) -> npt.NDArray[np.int64]:
    """Per row of an Arrow array: the values inside each cell as ``_row_problem`` counts them (a list's items, a
    struct's keys and values, and theirs in turn), from the offsets alone: no cell becomes a Python object."""
    kind = array.type
    rows = len(array)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        parents = pc.list_parent_indices(array).to_numpy(zero_copy_only=False).astype(np.int64)
        inside = np.bincount(parents, minlength=rows).astype(np.int64)
        np.add.at(inside, parents, _nested_values(pa, pc, array.flatten()))
        return inside
    if pa.types.is_struct(kind):
        inside = np.full(rows, 2 * kind.num_fields, dtype=np.int64)
        for field in array.flatten():
            inside += _nested_values(pa, pc, field)
        return inside
    return np.zeros(rows, dtype=np.int64)


def _parquet_file(pq: Any, source: IO[bytes], label: str, limits: Limits) -> Any:
    """The ParquetFile after checking its footer and its row-group and column-chunk sizes, all from the
    metadata, before any data page is read; string columns are read as dictionaries (not expanded)."""
    source.seek(0, io.SEEK_END)
    stored = source.tell()
    if stored >= 12:
        source.seek(-8, io.SEEK_END)
        tail = source.read(8)
        footer = int.from_bytes(tail[:4], "little")
        # A footer longer than the file is no Parquet file (pyarrow says so below), not one over the record limit:
        # 15 bytes of "PAR1garbagePAR1" were refused as a 1.6 GiB footer.
        if tail[4:] == b"PAR1" and limits.record_bytes < footer <= stored - 12:
            raise over_record(f"the Parquet footer of {label} ({size_text(footer)})", limits.record_bytes)
    source.seek(0)
    try:
        meta = pq.ParquetFile(source).metadata
    except Exception as exc:  # pyarrow raises its own error types for files that are not Parquet
        raise _NotParquet(str(exc)) from None
    for group in range(meta.num_row_groups):
        row_group = meta.row_group(group)
        if row_group.total_byte_size > limits.row_group_bytes:
            raise DataLimitError(
                f"row group {group + 1} of {label} is {size_text(row_group.total_byte_size)} uncompressed, over "
                f"the {size_text(limits.row_group_bytes)} row-group limit (GPUPLAN_DATACHECK_MAX_ROW_GROUP_BYTES); "
                "write it with smaller row groups (pyarrow: row_group_size)"
            )
        for column in range(row_group.num_columns):
            chunk = row_group.column(column)
            if chunk.total_uncompressed_size > limits.column_chunk_bytes:
                raise DataLimitError(
                    f"row group {group + 1}, column {chunk.path_in_schema!r} of {label} is "
                    f"{size_text(chunk.total_uncompressed_size)} uncompressed, over the "
                    f"{size_text(limits.column_chunk_bytes)} column-chunk limit "
                    "(GPUPLAN_DATACHECK_MAX_COLUMN_CHUNK_BYTES); write it with smaller row groups "
                    "(pyarrow: row_group_size)"
                )
    columns = [meta.schema.column(i) for i in range(meta.num_columns)]
    strings = [column.path for column in columns if column.physical_type == "BYTE_ARRAY"]
    source.seek(0)
    return pq.ParquetFile(source, buffer_size=_PARQUET_BUFFER_BYTES, read_dictionary=strings or None), stored


class _NotParquet(Exception):
    pass


def _parquet_rows(
    source: IO[bytes], limits: Limits, label: str, stored_bytes: int | None = None
) -> Iterator[tuple[int, Any]]:
    """Rows of a Parquet file (a seekable binary file), read row group by row group in record batches.

    Each row is measured in Arrow before it becomes Python objects: a row over the record limit, a
    string over the cell limit, or a file decoding past the expansion limit is refused."""
    pa, pc, pq = _arrow()
    try:
        reader, stored = _parquet_file(pq, source, label, limits)
    except _NotParquet as exc:
        yield 1, RowError("broken", f"not a readable Parquet file: {exc}")
        return
    stored = stored_bytes if stored_bytes is not None else stored
    decoded_limit = limits.decoded_limit(stored)
    decoded, number = 0, 0
    meta = reader.metadata
    if meta.num_rows > limits.line_limit(stored):  # from the footer, before any row is read
        raise over_lines(label, limits, stored, "rows")
    for group in range(meta.num_row_groups):
        row_group = meta.row_group(group)
        per_row = max(1, row_group.total_byte_size // max(1, row_group.num_rows))
        batch_rows = int(min(_PARQUET_BATCH_ROWS, max(1, _PARQUET_SLICE_BYTES // per_row)))
        for batch in reader.iter_batches(batch_size=batch_rows, row_groups=[group], use_threads=False):
            total = np.zeros(batch.num_rows, dtype=np.int64)
            longest = np.zeros(batch.num_rows, dtype=np.int64)
            longest_column = np.zeros(batch.num_rows, dtype=np.int64)
            # The row's object, its keys and its cells, then what the cells hold (``_row_problem``'s count).
            values = np.full(batch.num_rows, 1 + 2 * batch.num_columns, dtype=np.int64)
            for at, column in enumerate(batch.columns):
                t, m = _cell_sizes(pa, pc, column)
                total += t
                longer = m > longest
                longest_column[longer] = at
                np.maximum(longest, m, out=longest)
                values += _nested_values(pa, pc, column)
            # Rows of too many values are refused as JSON Lines rows are, before they become Python objects: ten
            # million one-byte list items in a 10 MB row took half a minute to check.
            crowded = set(np.flatnonzero(values > MAX_VALUES).tolist())
            ends = decoded + np.cumsum(total)
            bad = np.flatnonzero((total > limits.record_bytes) | (longest > limits.cell_bytes))
            stop = int(bad[0]) if bad.size else batch.num_rows
            if decoded_limit is not None:
                stop = min(stop, int(np.searchsorted(ends, decoded_limit, side="right")))
            start = 0
            while start < stop:  # to Python in slices of about _PARQUET_SLICE_BYTES
                if start in crowded:
                    number += 1
                    yield number, _too_many_values()
                    start += 1
                    continue
                base = ends[start - 1] if start else decoded
                end = max(start + 1, int(np.searchsorted(ends, base + _PARQUET_SLICE_BYTES, side="right")))
                end = min(end, stop, min((r for r in crowded if r > start), default=stop))
                for row in batch.slice(start, end - start).to_pylist():
                    number += 1
                    yield number, _row_problem(row) or row
                start = end
            if stop < batch.num_rows:
                row_number = number + 1
                if bad.size and int(bad[0]) == stop:
                    if total[stop] > limits.record_bytes:
                        raise over_record(f"row {row_number} of {label}", limits.record_bytes)
                    name = batch.schema.names[int(longest_column[stop])]
                    raise over_cell(f"a value in column {name!r}, row {row_number} of {label},", limits.cell_bytes)
                raise over_expansion(label, limits, stored)
            decoded = int(ends[-1]) if batch.num_rows else decoded


# --- compression ----------------------------------------------------------------------------------


def sniff_compression(head: bytes) -> str | None:
    """The compression a stream starts with (magic numbers), or None for plain data."""
    if head.startswith(_GZIP_MAGIC):
        return "gzip"
    # "BZh", a block size 1-9, then a block or end-of-stream magic: a CSV header cannot start so.
    if head[:3] == b"BZh" and head[3:4].isdigit() and head[4:10] in (b"1AY&SY", b"\x17rE8P\x90"):
        return "bz2"
    if head.startswith(_ZSTD_MAGIC):
        return "zstd"
    return None


def _decompressor(codec: str, handle: IO[bytes]) -> IO[bytes]:
    if codec == "gzip":
        return cast(IO[bytes], gzip.GzipFile(fileobj=handle, mode="rb"))
    if codec == "bz2":
        return cast(IO[bytes], bz2.BZ2File(handle, mode="rb"))
    try:
        zstandard: Any = importlib.import_module("zstandard")
    except ImportError as exc:
        raise DataCheckError("file: zstd-compressed; reading it needs the optional package zstandard") from exc
    reader = zstandard.ZstdDecompressor().stream_reader(handle, read_across_frames=True)
    return cast(IO[bytes], _Renamed(reader, zstandard.ZstdError))


class _Renamed(io.RawIOBase):
    """A stream whose decoding errors of type `errors` become OSError, as gzip's and bz2's are."""

    def __init__(self, inner: Any, errors: type[Exception]) -> None:
        self._inner, self._errors = inner, errors

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        try:
            data = self._inner.read(len(view))
        except self._errors as exc:
            raise OSError(f"not a valid zstd stream: {exc}") from exc
        view[: len(data)] = data
        return len(data)


class _Counted(io.RawIOBase):
    """A decompressed stream that refuses to give more than `limit` bytes (the expansion limit)."""

    def __init__(self, inner: IO[bytes], limit: int | None, refuse: Any) -> None:
        self._inner, self._limit, self._refuse = inner, limit, refuse
        self.bytes_out = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self._inner.read(len(view))
        view[: len(data)] = data
        self.bytes_out += len(data)
        if self._limit is not None and self.bytes_out > self._limit:
            raise self._refuse()
        return len(data)


def _spooled(stream: IO[bytes]) -> IO[bytes]:
    """A compressed Parquet file decompressed into a temporary file (Parquet is read from its end)."""
    spool = tempfile.TemporaryFile(prefix="gpuplan-datacheck-")  # noqa: SIM115 (the caller closes it)
    try:
        shutil.copyfileobj(stream, spool, _READ_CHUNK_BYTES)
    except BaseException:
        spool.close()
        raise
    spool.seek(0)
    return cast(IO[bytes], spool)


def iter_rows(
    handle: IO[bytes],
    kind: str,
    *,
    gzipped: bool = False,
    limits: Limits | None = None,
    label: str = "the file",
    stored_bytes: int | None = None,
) -> Iterator[tuple[int, Any]]:
    """Rows of a binary stream in file format `kind` (one of FILE_FORMATS), read as they arrive.

    Yields (row_number, row) with 1-based numbers; a row that cannot be read is a RowError. gzip, bz2
    and zstd are recognised by their magic numbers (`gzipped` insists on gzip). Memory stays bounded by
    `limits` (a record, a cell, the expansion of `stored_bytes`, the file's size when known); a file past
    one raises DataLimitError naming it. Parquet needs a seekable `handle` unless compressed."""
    if kind not in FILE_FORMATS:
        raise DataCheckError(f"format: unsupported file type {kind!r}; allowed: {', '.join(FILE_FORMATS)}")
    limits = limits or Limits()
    spool: IO[bytes] | None = None
    try:
        head = handle.read(16)
        codec = "gzip" if gzipped else sniff_compression(head)
        if kind == "parquet" and codec is None:
            if not handle.seekable():
                raise DataCheckError(f"{label}: a Parquet file must be read from a seekable source")
            yield from _parquet_rows(handle, limits, label, stored_bytes)
            return
        stream: IO[bytes] = cast(IO[bytes], _Chained(head, handle))
        if codec is not None:
            limit = limits.decoded_limit(stored_bytes)
            stream = cast(
                IO[bytes],
                _Counted(
                    _decompressor(codec, stream),
                    limit,
                    lambda: over_expansion(label, limits, stored_bytes or 0),
                ),
            )
        if kind == "parquet":
            spool = _spooled(stream)
            yield from _parquet_rows(spool, limits, label, stored_bytes)
            return
        buffered = io.BufferedReader(cast(io.RawIOBase, stream), _READ_CHUNK_BYTES)
        if kind == "jsonl":
            yield from _jsonl_rows(buffered, limits, label, stored_bytes)
        elif kind == "csv":
            yield from _csv_rows(buffered, limits, label, stored_bytes)
        else:
            start = buffered.peek(_READ_CHUNK_BYTES)[:_READ_CHUNK_BYTES]
            if start.lstrip(b" \t\r\n").removeprefix(b"\xef\xbb\xbf").lstrip(b" \t\r\n").startswith(b"["):
                yield from _json_array_rows(buffered, limits, label, stored_bytes)
            else:
                # Many ".json" files are really JSON Lines.
                yield from _jsonl_rows(buffered, limits, label, stored_bytes)
    except (OSError, EOFError, zlib.error) as exc:
        # A truncated or corrupt compressed stream: the rows before it were read; the rest cannot be.
        raise DataCheckError(f"file: cannot be read to the end ({exc})") from exc
    finally:
        if spool is not None:
            spool.close()


def missing_file_words(path: Path) -> str:
    """Why ``path`` cannot be read as a data file: not there, or there but no regular file (a directory named
    data.jsonl was "no such file")."""
    return "not a regular file" if path.exists() else "no such file"


def load_rows(path: str | Path, limits: Limits | None = None) -> Iterator[tuple[int, Any]]:
    """Yield (row_number, row) with 1-based numbers; a row that cannot be read is a RowError with its reason."""
    source = Path(path)
    kind = file_format(source)
    if not source.is_file():
        raise DataCheckError(f"path: {missing_file_words(source)} {str(source)!r}")
    with source.open("rb") as handle:
        yield from iter_rows(
            handle,
            kind,
            gzipped=source.name.lower().endswith(".gz"),
            limits=limits,
            label=source.name,
            stored_bytes=source.stat().st_size,
        )
