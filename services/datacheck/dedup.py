"""Exact and near duplicates: normalised-text hashes and MinHash with LSH banding (Broder 1997).

The near-duplicate index keeps its state in numpy arrays, about 256 bytes per row it keeps, whatever
the row length; rows are signed and looked up in chunks. Given a budget (memory_rows), it moves kept
rows past the budget to a temporary SQLite file (spill.py), so its memory stays bounded.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import random
import re
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from .spill import BitSet, Scratch

SHINGLE_WORDS = 5
NUM_PERMUTATIONS = 64
# 16 bands x 4 rows: a pair at Jaccard s becomes a candidate with probability 1 - (1 - s^4)^16,
# 0.9998 at s = 0.8 and 0.64 at s = 0.5; candidates are then kept only at estimated Jaccard >= 0.8.
LSH_BANDS = 16
LSH_ROWS_PER_BAND = NUM_PERMUTATIONS // LSH_BANDS
NEAR_DUPLICATE_JACCARD = 0.8
# A shingle's hash mixes its five words' CRC-32s with fixed odd multipliers (order matters); each of the
# 64 permutations is then a multiply-add-shift hash (Dietzfelbinger 1996): (a*x + b) mod 2^64, top 32
# bits. numpy's wrapping uint64 arithmetic computes exactly that, with no slow modulo.
_MASK_64 = (1 << 64) - 1
_SHINGLE_MIX = np.array(
    [0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93, 0xFF51AFD7ED558CCD],
    dtype=np.uint64,
)
_VERIFY_MASK = 0xFFFF
_WORD = re.compile(r"\w+", re.UNICODE)
# Fixed seed so the same data set always gives the same report.
_rng = random.Random(13616)
_PERMUTATIONS = tuple((_rng.getrandbits(64) | 1, _rng.getrandbits(64)) for _ in range(NUM_PERMUTATIONS))
_A = np.array([a for a, _ in _PERMUTATIONS], dtype=np.uint64)[:, None]
_B = np.array([b for _, b in _PERMUTATIONS], dtype=np.uint64)[:, None]
# Shingles hashed per numpy step: 64 x this many uint64 values (8 MiB) at a time.
_SHINGLES_PER_STEP = 1 << 14

Signature = npt.NDArray[np.uint64]


@dataclass(frozen=True)
class Duplicate:
    """Row `row_number` repeats row `duplicate_of` (exactly, or at estimated Jaccard `similarity`)."""

    row_number: int
    duplicate_of: int
    similarity: float


def normalise(text: str) -> str:
    """Case-folded, whitespace-collapsed text: what counts as 'the same' for exact duplicates."""
    return " ".join(text.casefold().split())


def text_digest(text: str) -> bytes:
    """SHA-256 of the normalised text."""
    return hashlib.sha256(normalise(text).encode("utf-8", errors="surrogatepass")).digest()


def text_hash(text: str) -> str:
    """SHA-256 of the normalised text, in hex."""
    return text_digest(text).hex()


def exact_duplicates(rows: Sequence[tuple[int, str]]) -> list[Duplicate]:
    """Rows whose normalised text equals an earlier row's; the first occurrence is not listed."""
    first: dict[bytes, int] = {}
    found = []
    for number, text in rows:
        key = text_digest(text)
        if key in first:
            found.append(Duplicate(number, first[key], 1.0))
        else:
            first[key] = number
    return found


# Words repeat (Zipf), so their hashes are remembered; the cache is emptied when it grows past this.
_WORD_CACHE_MAX = 1 << 20
_word_cache: dict[str, int] = {}


def _word_hash(word: str) -> int:
    if len(_word_cache) >= _WORD_CACHE_MAX:
        _word_cache.clear()
    value = _word_cache[word] = zlib.crc32(word.encode("utf-8", errors="surrogatepass"))
    return value


def word_hashes(text: str) -> list[int]:
    """CRC-32 of each word (case-folded), in order: the input of the MinHash signature."""
    cache = _word_cache
    return [cache[w] if w in cache else _word_hash(w) for w in _WORD.findall(text.casefold())]


def _permuted(shingles: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """The 64 permutations of some shingle hashes, (64, n), in one buffer updated in place."""
    values = _A * shingles
    values += _B
    values >>= np.uint64(32)
    return values


def signatures(word_lists: Sequence[Sequence[int]]) -> list[Signature | None]:
    """MinHash signatures (64 values below 2^32) over word 5-shingles of many texts at once, from their
    word hashes; None for a text shorter than one shingle."""
    sizes = np.array([len(w) for w in word_lists], dtype=np.int64)
    out: list[Signature | None] = [None] * len(word_lists)
    present = np.flatnonzero(sizes >= SHINGLE_WORDS)
    if present.size == 0:
        return out
    words = np.fromiter(
        (h for i in present.tolist() for h in word_lists[i]), dtype=np.uint64, count=int(sizes[present].sum())
    )
    # Shingle j starts at word j; it is whole when its five words lie in one text.
    shingles = words[: words.size - SHINGLE_WORDS + 1] * _SHINGLE_MIX[0]
    for k in range(1, SHINGLE_WORDS):
        shingles += words[k : words.size - SHINGLE_WORDS + 1 + k] * _SHINGLE_MIX[k]
    word_starts = np.concatenate(([0], np.cumsum(sizes[present])[:-1]))
    counts = sizes[present] - SHINGLE_WORDS + 1
    keep = np.ones(shingles.size, dtype=bool)
    for k in range(1, SHINGLE_WORDS):  # drop windows that run into the next text
        cut = word_starts[1:] - k
        keep[cut[cut >= 0]] = False
    shingles = shingles[keep]
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    mins = np.empty((present.size, NUM_PERMUTATIONS), dtype=np.uint64)
    # Walk the texts in groups whose shingles fit one step (a long text is a group of its own).
    first = 0
    while first < present.size:
        last = int(np.searchsorted(starts, starts[first] + _SHINGLES_PER_STEP, side="right"))
        last = max(last, first + 1)
        lo, hi = int(starts[first]), int(starts[last - 1] + counts[last - 1])
        if last == first + 1 and hi - lo > _SHINGLES_PER_STEP:  # one long text: its minimum, slice by slice
            mins[first] = np.min(
                [
                    _permuted(shingles[at : min(hi, at + _SHINGLES_PER_STEP)]).min(axis=1)
                    for at in range(lo, hi, _SHINGLES_PER_STEP)
                ],
                axis=0,
            )
        else:
            mins[first:last] = np.minimum.reduceat(_permuted(shingles[lo:hi]), starts[first:last] - lo, axis=1).T
        first = last
    for row, index in enumerate(present.tolist()):
        out[index] = mins[row]
    return out


def minhash(text: str) -> tuple[int, ...] | None:
    """MinHash signature over word 5-shingles; None for texts shorter than one shingle."""
    (signature,) = signatures([word_hashes(text)])
    return None if signature is None else tuple(int(v) for v in signature)


def minhash_reference(text: str) -> tuple[int, ...] | None:
    """The same signature with Python integers, one shingle at a time (the definition, for tests)."""
    words = word_hashes(text)
    if len(words) < SHINGLE_WORDS:
        return None
    mix = [int(m) for m in _SHINGLE_MIX]
    shingles = {
        sum(m * w for m, w in zip(mix, words[i : i + SHINGLE_WORDS], strict=True)) & _MASK_64
        for i in range(len(words) - SHINGLE_WORDS + 1)
    }
    return tuple(min(((a * x + b) & _MASK_64) >> 32 for x in shingles) for a, b in _PERMUTATIONS)


def estimated_jaccard(left: Sequence[int], right: Sequence[int]) -> float:
    """Share of agreeing MinHash values, an unbiased Jaccard estimate (std. error ~0.05 at 0.8 with 64)."""
    return sum(1 for x, y in zip(left, right, strict=True) if x == y) / len(left)


_BAND_MIX = np.array([0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D, 0x27D4EB2F], dtype=np.uint64)
# Band b's key k is stored on disk as b << 32 | k; rows are written this many at a time.
_INSERT_BATCH = 8192
_BAND_SHIFT = np.arange(LSH_BANDS, dtype=np.uint64) << np.uint64(32)


def _band_keys(sigs: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint32]:
    """One 32-bit key per row and LSH band (a collision only adds a candidate, which is then verified)."""
    bands = sigs.reshape(sigs.shape[0], LSH_BANDS, LSH_ROWS_PER_BAND)
    mixed = (bands * _BAND_MIX).sum(axis=2)
    keys: npt.NDArray[np.uint32] = ((mixed ^ (mixed >> np.uint64(29))) & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    return keys


class NearDuplicateIndex:
    """Finds rows at estimated Jaccard >= threshold with an earlier kept row, fed in chunks in row order.

    State per kept row: 16 band keys with their row index (128 bytes) and the low 16 bits of its
    signature (128 bytes). The result equals checking each row, in order, against every earlier kept row
    that shares a band with it; the first such row (lowest number) at or above the threshold wins.

    With `memory_rows`, once more than that many kept rows are in memory they move to `scratch` (a
    SQLite file, see spill.py) and later rows are looked up there as well: memory stays bounded, the
    answers do not change."""

    def __init__(
        self,
        threshold: float = NEAR_DUPLICATE_JACCARD,
        capacity: int | None = None,
        *,
        memory_rows: int | None = None,
        scratch: Scratch | None = None,
    ) -> None:
        if not 0 < threshold <= 1:
            raise ValueError(f"threshold: {threshold} is outside (0, 1]")
        if memory_rows is not None and scratch is None:
            raise ValueError("memory_rows needs a scratch to spill to")
        self.threshold = threshold
        # With a capacity, kept rows past it are still checked but no longer indexed (the index stops growing).
        self.capacity = capacity
        self.full = False
        self.memory_rows = memory_rows
        self.scratch = scratch
        # Per band, its keys sorted and the slot (kept-row index) of each; replaced one band at a time,
        # so a merge never holds more than one extra band.
        self._keys = [np.empty(0, dtype=np.uint32) for _ in range(LSH_BANDS)]
        self._slots = [np.empty(0, dtype=np.uint32) for _ in range(LSH_BANDS)]
        # Row numbers and verification bits in one block per chunk (appended, never copied).
        self._numbers: list[npt.NDArray[np.uint32]] = []
        self._verify: list[npt.NDArray[np.uint16]] = []
        self._starts: list[int] = []
        self._kept = 0
        # Slots below this one are on disk; the bit set says which band keys may be there.
        self._disk_slots = 0
        self._bits: BitSet | None = None
        self._fetched: dict[int, tuple[int, npt.NDArray[np.uint16]]] = {}

    @property
    def kept_rows(self) -> int:
        return self._kept

    @property
    def spilled_rows(self) -> int:
        """Kept rows moved to the scratch database."""
        return self._disk_slots

    def _slot(self, slot: int) -> tuple[int, npt.NDArray[np.uint16]]:
        """Row number and verification bits of a kept row."""
        if slot < self._disk_slots:
            return self._fetched[slot]
        block = bisect.bisect_right(self._starts, slot) - 1
        at = slot - self._starts[block]
        return int(self._numbers[block][at]), self._verify[block][at]

    def add_chunk(self, rows: Sequence[tuple[int, Signature | None]]) -> list[Duplicate]:
        """Check a chunk of (row_number, signature) in row order; rows without a signature are skipped."""
        signed = [(n, s) for n, s in rows if s is not None]
        if not signed:
            return []
        sigs = np.stack([s for _, s in signed])
        keys = _band_keys(sigs)  # (chunk, bands)
        verify = (sigs & np.uint64(_VERIFY_MASK)).astype(np.uint16)
        earlier = self._earlier_candidates(keys)
        local: dict[tuple[int, int], list[int]] = {}
        kept: list[int] = []
        found = []
        for i, (number, _) in enumerate(signed):
            band_keys = keys[i].tolist()
            match = None
            for slot in sorted(earlier[i]):
                other_number, other = self._slot(slot)
                similarity = float(np.count_nonzero(other == verify[i])) / NUM_PERMUTATIONS
                if similarity >= self.threshold:
                    match = (other_number, similarity)
                    break
            if match is None:
                for j in sorted({j for b, k in enumerate(band_keys) for j in local.get((b, k), ())}):
                    similarity = float(np.count_nonzero(verify[j] == verify[i])) / NUM_PERMUTATIONS
                    if similarity >= self.threshold:
                        match = (signed[j][0], similarity)
                        break
            if match is not None:
                found.append(Duplicate(number, match[0], match[1]))
                continue
            kept.append(i)
            for b, k in enumerate(band_keys):
                local.setdefault((b, k), []).append(i)
        self._fetched = {}
        if self.capacity is not None and self._kept + len(kept) > self.capacity:
            self.full = True
            kept = kept[: max(0, self.capacity - self._kept)]
        self._merge(keys[kept], verify[kept], [signed[i][0] for i in kept])
        if self.memory_rows is not None and self._kept - self._disk_slots > self.memory_rows:
            self._spill()
        return found

    def _earlier_candidates(self, keys: npt.NDArray[np.uint32]) -> list[set[int]]:
        """For each chunk row, the slots of kept rows from earlier chunks sharing a band key."""
        out: list[set[int]] = [set() for _ in range(keys.shape[0])]
        if not self._kept:
            return out
        if self._kept > self._disk_slots:
            for band in range(LSH_BANDS):
                column = self._keys[band]
                left = np.searchsorted(column, keys[:, band], side="left")
                right = np.searchsorted(column, keys[:, band], side="right")
                for i in np.flatnonzero(right > left).tolist():
                    out[i].update(self._slots[band][left[i] : right[i]].tolist())
        if self._bits is not None:
            self._disk_candidates(keys, out)
        # Earlier slots hold lower row numbers in slot order, so sorting slots sorts by row number.
        return out

    def _disk_candidates(self, keys: npt.NDArray[np.uint32], out: list[set[int]]) -> None:
        """Add the on-disk slots sharing a band key, and fetch their row numbers and verification bits."""
        assert self._bits is not None and self.scratch is not None
        combined = _BAND_SHIFT | keys.astype(np.uint64)  # (chunk, bands): band << 32 | key
        maybe = self._bits.maybe(combined.ravel()).reshape(combined.shape)
        if not maybe.any():
            return
        db = self.scratch.db
        wanted = np.unique(combined[maybe]).tolist()
        query = "SELECT b.bk, b.slot FROM json_each(?) AS j CROSS JOIN near_bands AS b ON b.bk = j.value"
        slots_of: dict[int, list[int]] = {}
        for bk, slot in db.execute(query, (json.dumps(wanted),)):
            slots_of.setdefault(bk, []).append(slot)
        if not slots_of:
            return
        needed: set[int] = set()
        for i, band in zip(*np.nonzero(maybe), strict=True):
            slots = slots_of.get(int(combined[i, band]))
            if slots:
                out[int(i)].update(slots)
                needed.update(slots)
        query = "SELECT r.slot, r.number, r.verify FROM json_each(?) AS j CROSS JOIN near_rows AS r ON r.slot = j.value"
        for slot, number, verify in db.execute(query, (json.dumps(sorted(needed)),)):
            self._fetched[slot] = (number, np.frombuffer(verify, dtype=np.uint16))

    def _merge(self, keys: npt.NDArray[np.uint32], verify: npt.NDArray[np.uint16], numbers: list[int]) -> None:
        if not numbers:
            return
        base = self._kept
        slots = np.arange(base, base + len(numbers), dtype=np.uint32)
        for band in range(LSH_BANDS):
            order = np.argsort(keys[:, band], kind="stable")
            band_keys = keys[order, band]
            # side="right" keeps earlier slots first among equal keys.
            at = np.searchsorted(self._keys[band], band_keys, side="right")
            self._keys[band] = np.insert(self._keys[band], at, band_keys)
            self._slots[band] = np.insert(self._slots[band], at, slots[order])
        self._starts.append(base)
        self._numbers.append(np.array(numbers, dtype=np.uint32))
        self._verify.append(np.ascontiguousarray(verify))
        self._kept += len(numbers)

    def _spill(self) -> None:
        """Move the kept rows in memory to the scratch database, sorted by band key."""
        assert self.scratch is not None
        db = self.scratch.db
        if self._bits is None:
            db.execute("CREATE TABLE near_bands (bk INTEGER, slot INTEGER, PRIMARY KEY (bk, slot)) WITHOUT ROWID")
            db.execute("CREATE TABLE near_rows (slot INTEGER PRIMARY KEY, number INTEGER NOT NULL, verify BLOB)")
            self._bits = BitSet(26)
        bits = self._bits
        db.execute("BEGIN")
        # Band by band, a batch at a time (few temporaries, so memory stays flat): each band's keys are
        # sorted with earlier slots first among equal keys, so (band << 32 | key, slot) arrive in order.
        for band in range(LSH_BANDS):
            for at in range(0, self._keys[band].size, _INSERT_BATCH):
                combined = _BAND_SHIFT[band] | self._keys[band][at : at + _INSERT_BATCH].astype(np.uint64)
                bits.add(combined)
                entries = zip(combined.tolist(), self._slots[band][at : at + _INSERT_BATCH].tolist(), strict=True)
                db.executemany("INSERT INTO near_bands VALUES (?, ?)", entries)
        db.executemany(
            "INSERT INTO near_rows VALUES (?, ?, ?)",
            (
                (start + at, int(number), verify.tobytes())
                for start, numbers, block in zip(self._starts, self._numbers, self._verify, strict=True)
                for at, (number, verify) in enumerate(zip(numbers, block, strict=True))
            ),
        )
        db.execute("COMMIT")
        self._keys = [np.empty(0, dtype=np.uint32) for _ in range(LSH_BANDS)]
        self._slots = [np.empty(0, dtype=np.uint32) for _ in range(LSH_BANDS)]
        self._numbers, self._verify, self._starts = [], [], []
        self._disk_slots = self._kept


def near_duplicates(
    rows: Iterable[tuple[int, str]],
    threshold: float = NEAR_DUPLICATE_JACCARD,
    chunk_rows: int = 2048,
    memory_rows: int | None = None,
) -> list[Duplicate]:
    """Rows at estimated Jaccard >= threshold with an earlier kept row; LSH banding finds the candidates.
    With `memory_rows`, kept rows past that many spill to a temporary SQLite file (see spill.py)."""
    found: list[Duplicate] = []
    chunk: list[tuple[int, str]] = []
    with Scratch() as scratch:
        index = NearDuplicateIndex(threshold, memory_rows=memory_rows, scratch=scratch)

        def flush() -> None:
            sigs = signatures([word_hashes(t) for _, t in chunk])
            found.extend(index.add_chunk([(n, s) for (n, _), s in zip(chunk, sigs, strict=True)]))
            chunk.clear()

        for row in rows:
            chunk.append(row)
            if len(chunk) >= chunk_rows:
                flush()
        flush()
    return found
