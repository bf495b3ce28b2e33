"""How much of a data set one check may hold or decode at once, and the error that names a limit passed.

A 400 KB gzip file can hold one 400 MB line and a 741-byte Parquet file 60 copies of an 8 MB string
(issue 21): the readers measure before they keep, and refuse past these bounds instead of buffering.
The service takes the values from its settings (GPUPLAN_DATACHECK_*, docs/datasets.md).
"""

from __future__ import annotations

from dataclasses import dataclass


class DataCheckError(ValueError):
    """A data set or an argument the checker cannot work with; the message names the field."""


class DataLimitError(DataCheckError):
    """A data set passed one of the check's limits; the message names the limit, its value and its setting."""


def size_text(size_bytes: int) -> str:
    """A byte count as people write limits: '64 MiB', '741 bytes'."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size_bytes >= 1 << shift:
            value = size_bytes / (1 << shift)
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{size_bytes:,} bytes"


@dataclass(frozen=True)
class Limits:
    """The bounds one check reads under (bytes unless named otherwise)."""

    # One JSON Lines line, one JSON array element, one CSV record, one Parquet row.
    record_bytes: int = 64 * 2**20
    # One CSV cell or one string in a Parquet row (Python's csv module stops at 128 KiB by default).
    cell_bytes: int = 16 * 2**20
    # Parquet, from the footer before any data is read: one column chunk, and one row group, uncompressed.
    column_chunk_bytes: int = 512 * 2**20
    row_group_bytes: int = 2 * 2**30
    # A compressed file (gzip, bz2, zstd) or a Parquet file may decode to at most
    # max(expansion_floor_bytes, expansion_ratio x its stored size); text compresses 3-10x.
    expansion_ratio: float = 100.0
    expansion_floor_bytes: int = 256 * 2**20
    # Lines read from one file (blank lines counted), JSON array elements or Parquet rows: a product limit. Every
    # line costs the check time whatever it holds (a blank one about 1 microsecond to skip, a row of text 75-130
    # to check), so a 1 MB gzip of 1 GB of newlines held a check for minutes though under the expansion limit
    # (256 MiB: 268 million lines). A file may hold as many lines as a plain file of its stored size could (one
    # byte each, the newline), at least `line_floor` and never more than `max_lines` (twenty million rows: more
    # than the largest instruction sets, and about the most one check gets through in its hour).
    max_lines: int = 20_000_000
    line_floor: int = 100_000

    def line_limit(self, stored_bytes: int | None) -> int:
        """The most lines (or rows) a file of `stored_bytes` may hold (None: size unknown, `max_lines`)."""
        if stored_bytes is None:
            return self.max_lines
        return min(self.max_lines, max(self.line_floor, stored_bytes))

    def decoded_limit(self, stored_bytes: int | None) -> int | None:
        """The most bytes a file of `stored_bytes` may decode to (None: size unknown, no limit)."""
        if stored_bytes is None:
            return None
        return max(self.expansion_floor_bytes, int(self.expansion_ratio * stored_bytes))


# The setting behind each limit, named in every refusal so that an operator knows what to raise.
SETTING = {
    "record_bytes": "GPUPLAN_DATACHECK_MAX_RECORD_BYTES",
    "cell_bytes": "GPUPLAN_DATACHECK_MAX_CELL_BYTES",
    "column_chunk_bytes": "GPUPLAN_DATACHECK_MAX_COLUMN_CHUNK_BYTES",
    "row_group_bytes": "GPUPLAN_DATACHECK_MAX_ROW_GROUP_BYTES",
    "expansion": "GPUPLAN_DATACHECK_EXPANSION_RATIO / GPUPLAN_DATACHECK_EXPANSION_FLOOR_BYTES",
    "lines": "a product limit, services/datacheck/limits.py",
}


def over_record(what: str, limit: int) -> DataLimitError:
    return DataLimitError(f"{what} is over the {size_text(limit)} record limit ({SETTING['record_bytes']})")


def over_cell(what: str, limit: int) -> DataLimitError:
    return DataLimitError(f"{what} is over the {size_text(limit)} cell limit ({SETTING['cell_bytes']})")


def over_expansion(label: str, limits: Limits, stored_bytes: int) -> DataLimitError:
    limit = limits.decoded_limit(stored_bytes) or 0
    return DataLimitError(
        f"{label} decodes to more than {size_text(limit)}, over the expansion limit: at most "
        f"{limits.expansion_ratio:g} times its {size_text(stored_bytes)} stored, and at least "
        f"{size_text(limits.expansion_floor_bytes)} ({SETTING['expansion']})"
    )


def over_lines(
    label: str, limits: Limits, stored_bytes: int | None, unit: str = "lines (blank ones counted)"
) -> DataLimitError:
    limit = limits.line_limit(stored_bytes)
    stored = "" if stored_bytes is None else f"one per byte of its {size_text(stored_bytes)} stored, "
    return DataLimitError(
        f"{label} holds more than {limit:,} {unit}, over the line limit: {stored}at least "
        f"{limits.line_floor:,} and at most {limits.max_lines:,} ({SETTING['lines']})"
    )
