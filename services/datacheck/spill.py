"""Bounded memory for a check's per-row state: a scratch SQLite file in a temporary directory.

The duplicate indexes keep their newest rows in memory and, past a budget of rows, move them to a
scratch database and look them up there; the answers are the same either way. The database is a
plain file opened with the stdlib sqlite3 module (no server, no network) in a fresh directory from
tempfile.mkdtemp, journal and fsync off, page cache capped at SQLITE_CACHE_KIB. It is created only
when something is spilled, and Scratch.close() (callers use `with` or try/finally, so errors too)
deletes the directory. A fixed-size bit set in memory records which keys may be on disk, so most
lookups never reach the file.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import numpy as np
import numpy.typing as npt

SQLITE_CACHE_KIB = 8192
SCRATCH_PREFIX = "gpuplan-datacheck-spill-"
_MIX = np.uint64(0x9E3779B97F4A7C15)
_SIGN = 1 << 63
# A scratch file: nothing to recover after a crash, so no journal and no fsync.
_PRAGMAS = ("page_size=16384", "journal_mode=OFF", "synchronous=OFF", "locking_mode=EXCLUSIVE", "temp_store=FILE")


class Scratch:
    """A temporary directory holding one SQLite database, made on first use and removed by close()."""

    def __init__(self, directory: str | Path | None = None) -> None:
        self.directory = directory
        self.path: Path | None = None
        self._db: sqlite3.Connection | None = None

    @property
    def db(self) -> sqlite3.Connection:
        if self._db is None:
            self.path = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=self.directory))
            try:
                db = sqlite3.connect(self.path / "index.sqlite3", isolation_level=None)
                for pragma in _PRAGMAS:
                    db.execute(f"PRAGMA {pragma}")
                db.execute(f"PRAGMA cache_size=-{SQLITE_CACHE_KIB}")
            except BaseException:
                shutil.rmtree(self.path, ignore_errors=True)
                self.path = None
                raise
            self._db = db
        return self._db

    @property
    def used(self) -> bool:
        return self._db is not None

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
        if self.path is not None:
            shutil.rmtree(self.path, ignore_errors=True)
            self.path = None

    def __enter__(self) -> Scratch:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()


class BitSet:
    """2^log2_bits bits: after add(keys), maybe(keys) is True for each of them (and for a few others)."""

    def __init__(self, log2_bits: int) -> None:
        self.shift = np.uint64(64 - log2_bits)
        self.bits = np.zeros(1 << max(0, log2_bits - 3), dtype=np.uint8)

    def _positions(self, keys: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
        positions: npt.NDArray[np.uint64] = (keys * _MIX) >> self.shift
        return positions

    def add(self, keys: npt.NDArray[np.uint64]) -> None:
        at = self._positions(keys)
        np.bitwise_or.at(self.bits, at >> np.uint64(3), (1 << (at & np.uint64(7))).astype(np.uint8))

    def maybe(self, keys: npt.NDArray[np.uint64]) -> npt.NDArray[np.bool_]:
        at = self._positions(keys)
        found: npt.NDArray[np.bool_] = (self.bits[at >> np.uint64(3)] >> (at & np.uint64(7)).astype(np.uint8)) & 1 == 1
        return found


def _signed(value: int) -> int:
    """An unsigned 64-bit value as SQLite's signed INTEGER."""
    return value - (1 << 64) if value >= _SIGN else value


class ExactIndex:
    """The first row of each 64-bit text hash, fed in row order; state past `memory_rows` hashes goes to
    `scratch` (with memory_rows None, everything stays in memory)."""

    def __init__(self, scratch: Scratch | None = None, memory_rows: int | None = None) -> None:
        if memory_rows is not None and scratch is None:
            raise ValueError("memory_rows needs a scratch to spill to")
        self.scratch = scratch
        self.memory_rows = memory_rows
        self._first: dict[int, int] = {}
        self._bits: BitSet | None = None

    def first_rows(self, hashes: Sequence[int], rows: Sequence[int]) -> list[int | None]:
        """For each (hash, row) in order: the earlier row with that hash, or None (the row is then the first)."""
        disk: dict[int, int] = {}
        if self._bits is not None and hashes:
            keys = np.array(hashes, dtype=np.uint64)
            wanted = [_signed(h) for h in np.unique(keys[self._bits.maybe(keys)]).tolist()]
            if wanted and self.scratch is not None:
                query = "SELECT e.hash, e.row FROM json_each(?) AS j CROSS JOIN exact_rows AS e ON e.hash = j.value"
                disk = {h % (1 << 64): r for h, r in self.scratch.db.execute(query, (json.dumps(wanted),))}
        first = self._first
        out: list[int | None] = []
        for value, row in zip(hashes, rows, strict=True):
            earlier = first.get(value)
            if earlier is None:
                earlier = disk.get(value)
            if earlier is None:
                first[value] = row
            out.append(earlier)
        if self.memory_rows is not None and len(first) > self.memory_rows:
            self._spill()
        return out

    def _spill(self) -> None:
        assert self.scratch is not None
        db = self.scratch.db
        if self._bits is None:
            db.execute("CREATE TABLE exact_rows (hash INTEGER PRIMARY KEY, row INTEGER NOT NULL)")
            self._bits = BitSet(24)
        db.execute("BEGIN")
        db.executemany("INSERT INTO exact_rows VALUES (?, ?)", sorted((_signed(h), r) for h, r in self._first.items()))
        db.execute("COMMIT")
        self._bits.add(np.fromiter(self._first, dtype=np.uint64, count=len(self._first)))
        self._first = {}
