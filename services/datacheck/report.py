"""check_dataset: one pass over a fine-tuning set before GPUs are rented; write_clean and write_masked."""

from __future__ import annotations

import bisect
import contextlib
import gzip
import heapq
import itertools
import json
import math
from array import array
from collections import Counter as Counter_
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any, Generic, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict

from .dedup import NEAR_DUPLICATE_JACCARD, NearDuplicateIndex, signatures, text_digest, word_hashes
from .formats import (
    FORMATS,
    alpaca_spelling,
    detect_format,
    detect_spelling,
    format_problem,
    format_votes,
    row_text,
    spelling_problem,
)
from .limits import Limits
from .loading import DataCheckError, RowError, file_format, iter_rows, load_rows, missing_file_words
from .pii import PII_KINDS, PiiFinding, find_pii, mask_value
from .spill import ExactIndex, Scratch
from .tokens import (
    ESTIMATE_SOURCE,
    SEQ_LEN_BUCKETS_TOKENS,
    TOKENIZER_METHOD,
    UPLOAD_SOURCE,
    Counter,
    LengthHistogram,
    TokenStats,
    histogram_token_stats,
    make_counter,
    trained_lengths,
)
from .training import TRAINING_NOTE, ChatDefault, TrainingText, chat_default, chat_note, template_tokens, training_text

_T = TypeVar("_T")

SHORT_ROW_TOKENS = 8
PROGRESS_EVERY_ROWS = 1000
# Rows tokenised, signed and checked for near duplicates together (numpy and the tokenizer work in batches),
# up to CHUNK_CHARS of text: the word hashes of a chunk take about 8x its text in memory.
CHUNK_ROWS = 2048
CHUNK_CHARS = 16 * 2**20
# Memory budget: the exact- and near-duplicate indexes (and, without a list limit, the overlong rows) keep
# at most this many rows in memory (near duplicates ~256 bytes each, exact ~100), then move them to a
# temporary SQLite file under SPILL_DIR (None: the system's temporary directory), deleted at the end.
SPILL_ROWS: int | None = 32_768
SPILL_DIR: str | None = None
# No cap on the near-duplicate index: the spill keeps memory flat; its file grows ~0.4 KB per kept row.
# A number here would stop indexing kept rows past it (later rows compared with the indexed ones only).
NEAR_DUPLICATE_INDEX_ROWS: int | None = None
# The row format is guessed from this many rows (at most FORMAT_PROBE_CHARS of their strings, since they
# are held), then confirmed by the whole pass (a second pass if not).
FORMAT_PROBE_ROWS = 1000
FORMAT_PROBE_CHARS = 64 * 2**20
VALIDATION_SHARE = 0.05
VALIDATION_MIN_ROWS = 100
VALIDATION_MAX_ROWS = 1000
VALIDATION_MAX_SHARE = 0.10
PII_EXAMPLES = 5
VALIDATION_RULE = (
    "5% of the rows write_clean keeps, at least 100 and at most 1,000, but never more than 10% of them; "
    "rows chosen by the smallest SHA-256 of their normalised text, so the split is stable under reordering"
)


class RowProblem(BaseModel):
    """A row and what is wrong with it."""

    model_config = ConfigDict(frozen=True)

    row_number: int
    reason: str


class DuplicateRow(BaseModel):
    """A row repeating an earlier one; similarity 1.0 for exact duplicates, else estimated Jaccard."""

    model_config = ConfigDict(frozen=True)

    row_number: int
    duplicate_of: int
    similarity: float


class PiiKindSummary(BaseModel):
    """How often one kind of personal data occurs, with a few masked examples."""

    model_config = ConfigDict(frozen=True)

    kind: str
    count: int
    example_row_numbers: tuple[int, ...]
    masked_examples: tuple[str, ...]


class ValidationSplit(BaseModel):
    """A suggested held-out validation set."""

    model_config = ConfigDict(frozen=True)

    rows: int
    row_numbers: tuple[int, ...]
    rule: str


class DatasetReport(BaseModel):
    """Everything check_dataset found; JSON-serialisable with model_dump_json()."""

    model_config = ConfigDict(frozen=True)

    path: str
    file_format: str
    rows_total: int
    detected_format: str | None
    # The field names the instruction rows use ('instruction/output' Alpaca, 'instruction/response' Dolly,
    # 'prompt/response'; formats.alpaca_spelling), which an export must read; None for other formats and in reports
    # from before it.
    instruction_spelling: str | None = None
    # The list chat rows hold their turns in: 'messages' (role/content) or 'conversations' (ShareGPT's from/value),
    # the one most chat rows use; None for other formats and in reports from before it.
    chat_field: str | None = None
    format_votes: dict[str, int]
    broken_rows: tuple[RowProblem, ...]
    encoding_problem_rows: tuple[RowProblem, ...]
    mismatched_rows: tuple[RowProblem, ...]
    empty_rows: tuple[int, ...]
    short_rows: tuple[int, ...]
    overlong_rows: tuple[int, ...]
    exact_duplicates: tuple[DuplicateRow, ...]
    near_duplicates: tuple[DuplicateRow, ...]
    rows_kept: int
    tokens: TokenStats
    # The same of the kept rows alone (no empty row, no duplicate): what training sees once the file is cleaned, and
    # what a plan from the data set is priced by (None in reports from before it).
    kept_tokens: TokenStats | None = None
    # Where the file stops being readable (a JSON array whose syntax breaks): a loader reads none of it, and rows
    # after it are not counted. None: the whole file was read.
    file_problem: str | None = None
    validation_split: ValidationSplit
    pii: tuple[PiiKindSummary, ...]
    pii_findings_total: int
    counts: dict[str, int] = {}
    listed_limit: int | None = None
    notes: tuple[str, ...] = ()
    rules: tuple[str, ...]
    # Which tokenizer counted: {"source": "hub:owner/name" | "upload" | "estimate: characters/4", ...}.
    tokenizer: dict[str, str] = {}


RULES = (
    f"format: majority vote over {', '.join(FORMATS)}; ties go to the earlier one",
    "exact duplicate: same SHA-256 of case-folded, whitespace-collapsed text",
    f"near duplicate: MinHash over word 5-shingles (CRC-32), 64 permutations, 16 LSH bands x 4, estimated "
    f"Jaccard (on the low 16 bits of each value) >= {NEAR_DUPLICATE_JACCARD}",
    "empty: no text, or an empty answer (output/completion/assistant turns)",
    f"very short: fewer than {SHORT_ROW_TOKENS} tokens of the row's own text (no prompt template or special tokens)",
    "overlong: more tokens than the recommended seq_len (p99 bucket)",
    "write_clean drops broken, encoding-problem, format-mismatched, empty, exact- and near-duplicate rows",
    VALIDATION_RULE,
)


def validation_rows(kept: int) -> int:
    """How many rows to hold out: see VALIDATION_RULE."""
    wanted = min(VALIDATION_MAX_ROWS, max(VALIDATION_MIN_ROWS, math.ceil(VALIDATION_SHARE * kept)))
    return min(wanted, math.floor(VALIDATION_MAX_SHARE * kept))


class RowSource(Protocol):
    """Where rows come from: each call of rows() is a fresh pass from the start."""

    def rows(self) -> Iterator[tuple[int, Any]]: ...

    def fraction_read(self) -> float | None:
        """Share of the input the current pass has read (None when unknown), to estimate the row total."""


class _Listed(Generic[_T]):
    """An exact count and the first `limit` items (all of them when limit is None)."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.count = 0
        self.items: list[_T] = []

    def add(self, item: _T) -> None:
        self.count += 1
        if self.limit is None or len(self.items) < self.limit:
            self.items.append(item)


class _Overlong:
    """Rows longer than each seq_len bucket, for the bucket chosen at the end: a row's level is how many
    buckets it exceeds. With a limit, a row is kept only while fewer than `limit` rows of its level or
    higher are kept (so each bucket's first `limit` rows are there); without one, rows past the memory
    budget go to the scratch database."""

    def __init__(self, limit: int | None, scratch: Scratch, memory_rows: int | None) -> None:
        self.limit = limit
        self.scratch = scratch
        self.memory_rows = memory_rows
        self.at_least = [0] * (len(SEQ_LEN_BUCKETS_TOKENS) + 1)
        self.rows = array("I")
        self.levels = array("B")
        self.spilled = False

    def add(self, number: int, length: int) -> None:
        level = bisect.bisect_left(SEQ_LEN_BUCKETS_TOKENS, length)
        if level == 0 or (self.limit is not None and self.at_least[level] >= self.limit):
            return
        for at in range(1, level + 1):
            self.at_least[at] += 1
        self.rows.append(number)
        self.levels.append(level)
        if self.limit is None and self.memory_rows is not None and len(self.rows) > self.memory_rows:
            db = self.scratch.db
            if not self.spilled:
                db.execute("CREATE TABLE overlong (row INTEGER PRIMARY KEY, level INTEGER NOT NULL)")
                self.spilled = True
            db.execute("BEGIN")
            db.executemany("INSERT INTO overlong VALUES (?, ?)", zip(self.rows, self.levels, strict=True))
            db.execute("COMMIT")
            self.rows, self.levels = array("I"), array("B")

    def over(self, seq_len: int) -> list[int]:
        """Rows longer than seq_len (a bucket), in row order; the first `limit` of them with a limit."""
        level = SEQ_LEN_BUCKETS_TOKENS.index(seq_len)
        found: list[int] = []
        if self.spilled:
            query = "SELECT row FROM overlong WHERE level > ? ORDER BY row"
            found = [r for (r,) in self.scratch.db.execute(query, (level,))]
        found += [r for r, v in zip(self.rows, self.levels, strict=True) if v > level]
        return found if self.limit is None else found[: self.limit]


class _Pass:
    """One streaming pass over the rows with a fixed row format. Memory: a chunk of rows, a histogram of
    token lengths, the first `limit` rows of each list, and the duplicate indexes, which keep at most
    SPILL_ROWS rows each in memory and move the rest to a temporary SQLite file (spill.py); never the
    rows themselves. close() deletes that file."""

    def __init__(
        self,
        fmt: str | None,
        counter: Counter,
        names: Sequence[str],
        limit: int | None,
        spelling: str | None = None,
        model: str | None = None,
    ) -> None:
        self.fmt = fmt
        # The model whose chat template renders chat rows, and the default system prompt that template writes.
        self.model = model
        self.chat_default: ChatDefault | None = chat_default(model)
        # For instruction files: the field names the file's rows use; a row spelled otherwise is a mismatch.
        self.spelling = spelling
        self.spelling_votes: Counter_[str] = Counter_()
        self.chat_fields: Counter_[str] = Counter_()  # per chat row, the list its turns are in
        self.count = counter
        self.names = names
        self.limit = limit
        self.rows_total = 0
        self.votes: Counter_[str] = Counter_({f: 0 for f in FORMATS})
        self.problems = {k: _Listed[RowProblem](limit) for k in ("broken", "encoding", "mismatch")}
        self.empty = _Listed[int](limit)
        self.short = _Listed[int](limit)
        self.lengths = LengthHistogram()
        self.kept_lengths = LengthHistogram()  # of the rows kept: neither empty nor a duplicate
        self.scratch = Scratch(SPILL_DIR)
        self.overlong = _Overlong(limit, self.scratch, SPILL_ROWS)
        self.exact_index = ExactIndex(self.scratch, SPILL_ROWS)
        self.exact = _Listed[DuplicateRow](limit)
        self.near = _Listed[DuplicateRow](limit)
        self.index = NearDuplicateIndex(
            capacity=NEAR_DUPLICATE_INDEX_ROWS, memory_rows=SPILL_ROWS, scratch=self.scratch
        )
        # The VALIDATION_MAX_ROWS smallest digests of kept rows, as a max-heap of (-digest, row).
        self.validation: list[tuple[int, int]] = []
        self.validation_digests: set[int] = set()
        self.pii_counts: Counter_[str] = Counter_()
        self.pii_examples: dict[str, list[PiiFinding]] = {}
        self.chunk: list[tuple[int, str, bool, bytes]] = []
        self.training: list[TrainingText] = []  # what train.py encodes for each row of the chunk
        self.template_tokens: int | None = None  # the most tokens a row's template adds (training.template_tokens)
        self.chunk_chars = 0
        self.file_problem: str | None = None  # where the file stopped being readable (RowError.ends_file)

    def close(self) -> None:
        self.scratch.close()

    def feed(self, number: int, row: Any) -> None:
        self.rows_total += 1
        if isinstance(row, RowError):
            self.problems[row.kind].add(RowProblem(row_number=number, reason=row.reason))
            if row.ends_file and self.file_problem is None:
                self.file_problem = f"row {number}: {row.reason}"
            return
        fits = [f for f in FORMATS if format_problem(row, f) is None]
        self.votes.update(fits)
        spelling = alpaca_spelling(row) if "alpaca" in fits else None
        if spelling is not None:
            self.spelling_votes[spelling] += 1
        if "chat" in fits:
            self.chat_fields["messages" if "messages" in row else "conversations"] += 1
        for finding in find_pii(number, row, self.names):
            self.pii_counts[finding.kind] += 1
            examples = self.pii_examples.setdefault(finding.kind, [])
            if len(examples) < PII_EXAMPLES:
                examples.append(finding)
        if self.fmt is None or self.fmt not in fits:
            reason = "no row fits any format" if self.fmt is None else format_problem(row, self.fmt)
            self.problems["mismatch"].add(RowProblem(row_number=number, reason=reason or "no format"))
            return
        if self.fmt == "alpaca" and self.spelling is not None:
            reason = spelling_problem(row, self.spelling)
            if reason is not None:
                self.problems["mismatch"].add(RowProblem(row_number=number, reason=reason))
                return
        text = row_text(row, self.fmt)
        empty = not text.text.strip() or (text.target is not None and not text.target.strip())
        self.chunk.append((number, text.text, empty, b"" if empty else text_digest(text.text)))
        self.training.append(training_text(row, self.fmt, self.chat_default))
        self.chunk_chars += len(text.text)
        if len(self.chunk) >= CHUNK_ROWS or self.chunk_chars >= CHUNK_CHARS:
            self.flush()

    def flush(self) -> None:
        if not self.chunk:
            return
        lengths = trained_lengths(self.count, self.training)
        self.lengths.add(lengths)
        signed: list[tuple[int, list[int]]] = []
        hashed: list[int] = []
        hashes: list[int] = []
        short = self._short_rows(lengths)
        for (number, text, empty, digest), length, is_short in zip(self.chunk, lengths, short, strict=True):
            self.overlong.add(number, length)
            if empty:
                self.empty.add(number)
                continue
            if is_short:
                self.short.add(number)
            hashed.append(number)
            hashes.append(int.from_bytes(digest[:8], "big"))
            signed.append((number, word_hashes(text)))
        exact = {}
        for number, first in zip(hashed, self.exact_index.first_rows(hashes, hashed), strict=True):
            if first is not None:
                exact[number] = first
                self.exact.add(DuplicateRow(row_number=number, duplicate_of=first, similarity=1.0))
        sigs = signatures([h for _, h in signed])
        found = self.index.add_chunk([(n, s) for (n, _), s in zip(signed, sigs, strict=True)])
        for d in found:  # a row that is also an exact duplicate is listed as that only
            if d.row_number not in exact:
                row = DuplicateRow(row_number=d.row_number, duplicate_of=d.duplicate_of, similarity=d.similarity)
                self.near.add(row)
        near = {d.row_number for d in found}
        self.kept_lengths.add(
            length
            for (number, _, empty, _), length in zip(self.chunk, lengths, strict=True)
            if not empty and number not in exact and number not in near
        )
        for number, _, empty, digest in self.chunk:
            if not empty and number not in near:
                self._offer_validation(int.from_bytes(digest, "big"), number)
        self.chunk = []
        self.training = []
        self.chunk_chars = 0

    def _short_rows(self, lengths: list[int]) -> list[bool]:
        """Per row of the chunk, whether its own text is under SHORT_ROW_TOKENS tokens. A row's trained length
        holds the template and special tokens train.py adds (an Alpaca row is never under 8 with its prompt), so
        only the rows within that overhead of the limit are counted again, on their text alone."""
        if self.template_tokens is None:
            self.template_tokens = template_tokens(self.count, self.fmt, self.chat_default)
        maybe = [
            i
            for i, (length, row) in enumerate(zip(lengths, self.training, strict=True))
            if length < SHORT_ROW_TOKENS + row.extra_tokens + self.template_tokens
        ]
        short = [False] * len(lengths)
        own = self.count([self.chunk[i][1] for i in maybe]) if maybe else []
        for i, n in zip(maybe, own, strict=True):
            short[i] = n < SHORT_ROW_TOKENS
        return short

    def _offer_validation(self, digest: int, number: int) -> None:
        if digest in self.validation_digests:
            return  # an exact duplicate of a row already held
        if len(self.validation) < VALIDATION_MAX_ROWS:
            heapq.heappush(self.validation, (-digest, number))
            self.validation_digests.add(digest)
        elif digest < -self.validation[0][0]:
            dropped = heapq.heappushpop(self.validation, (-digest, number))
            self.validation_digests.discard(-dropped[0])
            self.validation_digests.add(digest)


def counting_notes(fmt: str | None, note: str = "") -> tuple[str, ...]:
    """What the token counts include beyond the rows' own text (training.py): the rendering train.py does, and
    for chat rows ``note``: the estimated template overhead and the default system prompt (training.chat_note)."""
    return (TRAINING_NOTE, note) if fmt == "chat" else (TRAINING_NOTE,)


def _report(state: _Pass, label: str, kind: str, method: str, notes: tuple[str, ...]) -> DatasetReport:
    limit = state.limit
    chat = chat_note(state.chat_default, state.model)
    notes = notes + counting_notes(state.fmt, chat)
    stats = histogram_token_stats(*state.lengths.arrays(), method, notes)
    overlong = state.overlong.over(stats.recommended_seq_len_tokens)
    kept = state.lengths.rows - state.empty.count - state.exact.count - state.near.count
    split = validation_rows(kept)
    chosen = sorted(number for _, number in heapq.nlargest(split, state.validation))
    pii = tuple(
        PiiKindSummary(
            kind=k,
            count=state.pii_counts[k],
            example_row_numbers=tuple(f.row_number for f in state.pii_examples[k]),
            masked_examples=tuple(f.masked for f in state.pii_examples[k]),
        )
        for k in PII_KINDS
        if state.pii_counts[k]
    )
    counts = {
        "broken_rows": state.problems["broken"].count,
        "encoding_problem_rows": state.problems["encoding"].count,
        "mismatched_rows": state.problems["mismatch"].count,
        "empty_rows": state.empty.count,
        "short_rows": state.short.count,
        "overlong_rows": stats.truncated_rows,
        "exact_duplicates": state.exact.count,
        "near_duplicates": state.near.count,
    }
    return DatasetReport(
        path=label,
        file_format=kind,
        rows_total=state.rows_total,
        detected_format=state.fmt,
        instruction_spelling=state.spelling if state.fmt == "alpaca" else None,
        chat_field=state.chat_fields.most_common(1)[0][0] if state.fmt == "chat" and state.chat_fields else None,
        format_votes=dict(state.votes),
        broken_rows=tuple(state.problems["broken"].items),
        encoding_problem_rows=tuple(state.problems["encoding"].items),
        mismatched_rows=tuple(state.problems["mismatch"].items),
        empty_rows=tuple(state.empty.items),
        short_rows=tuple(state.short.items),
        overlong_rows=tuple(overlong),
        exact_duplicates=tuple(state.exact.items),
        near_duplicates=tuple(state.near.items),
        rows_kept=kept,
        tokens=stats,
        kept_tokens=histogram_token_stats(*state.kept_lengths.arrays(), method, notes),
        file_problem=state.file_problem,
        validation_split=ValidationSplit(rows=split, row_numbers=tuple(chosen), rule=VALIDATION_RULE),
        pii=pii,
        pii_findings_total=sum(state.pii_counts.values()),
        counts=counts,
        listed_limit=limit,
        notes=(
            (
                f"near duplicates: the index is full at {state.index.kept_rows:,} kept rows; later rows were "
                "compared with those only, not with each other",
            )
            if state.index.full
            else ()
        )
        + ((chat,) if state.fmt == "chat" else ()),
        rules=RULES,
    )


def check_source(
    source: RowSource,
    *,
    label: str,
    file_format: str,
    counter: tuple[Counter, str, tuple[str, ...]] | None = None,
    names: Sequence[str] | None = None,
    progress: Callable[[int, int], None] | None = None,
    max_listed: int | None = None,
    tokenizer: dict[str, str] | None = None,
    model: str | None = None,
) -> DatasetReport:
    """Check the rows of `source` in one streaming pass (two when the format guessed from the first
    FORMAT_PROBE_ROWS rows is not the majority format of the whole set).

    Counts are exact; with `max_listed`, each list of problem rows holds at most that many (the first
    ones). Memory is bounded whatever the row count (see _Pass): past SPILL_ROWS rows the duplicate indexes
    continue in a temporary SQLite file, removed when the pass ends, also on errors. Without `max_listed`
    the report lists every problem row, so those lists (the output) grow with the problems found.
    `progress(rows_done, rows_total)` is called every PROGRESS_EVERY_ROWS rows with the total
    estimated from the share of the input read, and once at the end with the exact total. `tokenizer`
    says which tokenizer counted (default: "upload" for a tokenizer.json counter, else the estimate). `model`
    names the model whose chat template renders chat rows (default: the model of `tokenizer`, "hub:owner/name" or
    its "model"): its template's default system prompt is counted where training.CHAT_DEFAULT_SYSTEM_PROMPTS
    knows it."""
    count, method, notes = counter or make_counter(None)
    if model is None and tokenizer is not None:
        source_name = tokenizer.get("source", "")
        model = tokenizer.get("model") or (source_name.removeprefix("hub:") if source_name.startswith("hub:") else None)
    if tokenizer is None:
        tokenizer = {"source": UPLOAD_SOURCE if method == TOKENIZER_METHOD else ESTIMATE_SOURCE}
    fmt: str | None = None
    spelling: str | None = None
    probed = False
    while True:
        state = _Pass(fmt, count, names or (), max_listed, spelling, model)
        try:  # the pass's scratch files are deleted whatever happens
            rows = source.rows()
            if not probed:
                head = _probe(rows)
                fits = [r for _, r in head if not isinstance(r, RowError)]
                fmt = detect_format(format_votes(fits))
                spelling = detect_spelling(Counter_(s for r in fits if (s := _instruction_spelling(r)) is not None))
                state.fmt, state.spelling = fmt, spelling
                rows = itertools.chain(head, rows)
                probed = True
            for number, row in rows:
                state.feed(number, row)
                if progress is not None and state.rows_total % PROGRESS_EVERY_ROWS == 0:
                    fraction = source.fraction_read()
                    estimate = round(state.rows_total / fraction) if fraction else state.rows_total
                    progress(state.rows_total, max(estimate, state.rows_total))
            state.flush()
            final = detect_format(state.votes)
            final_spelling = detect_spelling(state.spelling_votes)
            if final == fmt and (fmt != "alpaca" or final_spelling == spelling):
                if progress is not None:
                    progress(state.rows_total, state.rows_total)
                return _report(state, label, file_format, method, notes).model_copy(update={"tokenizer": tokenizer})
        finally:
            state.close()
        fmt, spelling = final, final_spelling


def _string_chars(value: Any) -> int:
    """Characters in the strings of a row (keys too), walked without recursion."""
    total, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return total


def _probe(rows: Iterator[tuple[int, Any]]) -> list[tuple[int, Any]]:
    """The first FORMAT_PROBE_ROWS rows, or fewer where their strings pass FORMAT_PROBE_CHARS."""
    head: list[tuple[int, Any]] = []
    chars = 0
    for item in rows:
        head.append(item)
        chars += 0 if isinstance(item[1], RowError) else _string_chars(item[1])
        if len(head) >= FORMAT_PROBE_ROWS or chars >= FORMAT_PROBE_CHARS:
            break
    return head


def _instruction_spelling(row: Any) -> str | None:
    """The field spelling of a row that is a valid instruction row, else None."""
    return alpaca_spelling(row) if format_problem(row, "alpaca") is None else None


class _FileSource:
    def __init__(self, path: Path, limits: Limits | None = None) -> None:
        self.path = path
        self.limits = limits
        self.size = path.stat().st_size if path.is_file() else 0
        self._handle: IO[bytes] | None = None

    def rows(self) -> Iterator[tuple[int, Any]]:
        kind = file_format(self.path)
        if not self.path.is_file():
            raise DataCheckError(f"path: {missing_file_words(self.path)} {str(self.path)!r}")
        with self.path.open("rb") as handle:
            self._handle = handle
            yield from iter_rows(
                handle,
                kind,
                gzipped=self.path.name.lower().endswith(".gz"),
                limits=self.limits,
                label=self.path.name,
                stored_bytes=self.size,
            )
            self._handle = None

    def fraction_read(self) -> float | None:
        if self._handle is None or not self.size:
            return None
        return self._handle.tell() / self.size


def check_dataset(
    path: str | Path,
    *,
    tokenizer_json: str | Path | None = None,
    names: Sequence[str] | None = None,
    progress: Callable[[int, int], None] | None = None,
    max_listed: int | None = None,
    limits: Limits | None = None,
    counter: tuple[Counter, str, tuple[str, ...]] | None = None,
    tokenizer: dict[str, str] | None = None,
    model: str | None = None,
) -> DatasetReport:
    """Check a data set file: readability, format, lengths, duplicates, personal data and a validation split.

    Streams the file (see check_source): memory holds one chunk of rows and bounded state, never the file;
    a file past one of `limits` raises DataLimitError naming it."""
    kind = file_format(path)
    return check_source(
        _FileSource(Path(path), limits),
        label=str(path),
        file_format=kind,
        counter=counter or make_counter(tokenizer_json),
        names=names,
        progress=progress,
        max_listed=max_listed,
        tokenizer=tokenizer,
        model=model,
    )


@contextlib.contextmanager
def _open_new(path: str | Path, out_path: str | Path) -> Iterator[IO[str]]:
    """Open out_path for writing, refusing the source itself or any existing file (mode 'x'). A write that fails
    part-way (a full disk, an interrupt) removes the file: no half-written output is left behind."""
    source, target = Path(path), Path(out_path)
    if target.resolve() == source.resolve():
        raise DataCheckError("out_path: must differ from path; the original is never overwritten")
    if target.exists():
        raise DataCheckError(f"out_path: {str(target)!r} already exists; choose a new file")
    opened = False  # a file that could not be made (mode 'x' lost a race) is not ours to remove
    try:
        with (
            gzip.open(target, "xt", encoding="utf-8")
            if target.name.lower().endswith(".gz")
            else target.open("x", encoding="utf-8")
        ) as handle:
            opened = True
            yield handle
    except BaseException:
        if opened:
            target.unlink(missing_ok=True)
        raise


def _write_jsonl(handle: IO[str], rows: Sequence[Any]) -> None:
    for row in rows:
        handle.write(json.dumps(row, ensure_ascii=False) + "\n")


def write_clean(path: str | Path, out_path: str | Path) -> int:
    """Write the rows kept (see RULES) to a new JSONL file (gzip when it ends .gz); returns the rows written."""
    report = check_dataset(path)
    dropped = {p.row_number for p in report.mismatched_rows}
    dropped.update(report.empty_rows)
    dropped.update(d.row_number for d in (*report.exact_duplicates, *report.near_duplicates))
    written = 0
    with _open_new(path, out_path) as handle:
        for number, row in load_rows(path):
            if not isinstance(row, RowError) and number not in dropped:
                handle.write(json.dumps(row, ensure_ascii=False) + "\n")
                written += 1
    return written


def write_masked(path: str | Path, out_path: str | Path, *, names: Sequence[str] | None = None) -> int:
    """Write every readable row to a new JSONL file with all personal data masked; returns the rows written."""
    written = 0
    with _open_new(path, out_path) as handle:
        for _, row in load_rows(path):
            if not isinstance(row, RowError):
                handle.write(json.dumps(mask_value(row, names or ()), ensure_ascii=False) + "\n")
                written += 1
    return written
