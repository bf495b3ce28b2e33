"""Token counts, length percentiles, the sequence-length bucket and tokens per epoch."""

from __future__ import annotations

import collections
import importlib
import importlib.util
import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict

from services.datacheck.limits import DataCheckError
from services.datacheck.training import TrainingText

# English text through GPT-2/Llama-style BPE averages about 4 characters per token (OpenAI's tokenizer
# guide: "one token generally corresponds to ~4 characters of common English text"). Expect +-20-30% for
# English prose; Turkish and other agglutinative languages, code and numbers often need 1.5-2x more tokens.
CHARS_PER_TOKEN = 4.0
APPROXIMATION_NOTE = (
    "token counts approximated as ceil(characters / 4): typically within 20-30% for English text with a BPE "
    "tokenizer, and an under-count (often by 1.5-2x) for Turkish, other non-English text and code; pass "
    "the data set's model (its tokenizer.json is fetched from the Hub) or a tokenizer.json for exact counts; "
    "a row's special tokens are estimated as 1 BOS (where train.py adds the tokenizer's) and 1 EOS"
)
# The report's tokenizer.source for the estimate and for an uploaded tokenizer.json; a Hub tokenizer is
# "hub:owner/name" (services/hub/tokenizer.py).
ESTIMATE_SOURCE = "estimate: characters/4"
UPLOAD_SOURCE = "upload"
APPROX_METHOD = "approx_4_chars_per_token"
TOKENIZER_METHOD = "tokenizer_json"
# The special tokens the estimate adds where train.py encodes with add_special_tokens=True: one BOS, as the
# tokenizer.json post-processors of Llama 2/3, Mistral and Gemma add ("<|begin_of_text|> $A" in
# huggingface.co/meta-llama/Meta-Llama-3-8B/blob/main/tokenizer.json, "post_processor"); GPT-2's and Qwen's add
# none, so one is the conservative figure.
APPROX_SPECIAL_TOKENS = 1
SEQ_LEN_BUCKETS_TOKENS = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
PERCENTILES = (50, 90, 95, 99)


class TokenStats(BaseModel):
    """Length distribution of the rows in tokens and what one epoch costs at the recommended length."""

    model_config = ConfigDict(frozen=True)

    method: str
    rows_counted: int
    p50_tokens: int
    p90_tokens: int
    p95_tokens: int
    p99_tokens: int
    max_tokens: int
    recommended_seq_len_tokens: int
    truncated_rows: int
    truncated_share: float
    tokens_per_epoch_padded: int
    tokens_per_epoch_packed: int
    padding_assumption: str
    notes: tuple[str, ...]
    # Every token of every row, none cut at a seq_len (None in reports from before it): what a plan trains on one
    # epoch, its own seq_len deciding what is truncated or packed (services.datasets.service.plan_data).
    tokens_per_epoch: int | None = None


def approx_tokens(text: str) -> int:
    """Approximate token count: ceil(len / CHARS_PER_TOKEN)."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)


class Counter:
    """Token counts of a batch of texts: without special tokens, or (special=True) with the ones the tokenizer adds
    when train.py encodes a row's first piece with add_special_tokens=True."""

    def __init__(self, encode: Callable[[Sequence[str], bool], list[int]]) -> None:
        self._encode = encode

    def __call__(self, texts: Sequence[str], special: bool = False) -> list[int]:
        try:
            return self._encode(texts, special)
        except BaseException as exc:
            # The tokenizers package panics (pyo3_runtime.PanicException, a BaseException) where a tokenizer.json's
            # pattern fails on a text: Oniguruma's "retry-limit-in-match over" for a backtracking regex such as
            # (a|aa)+$ on 32 a's. Uncaught it ended the check process with no answer ("most likely out of memory").
            if type(exc).__name__ != "PanicException":
                raise
            raise DataCheckError(
                f"tokenizer: the tokenizer failed on a row of the data set ({str(exc)[:200]}); check the patterns "
                "of its normalizer and pre_tokenizer"
            ) from None


def _approx_encode(texts: Sequence[str], special: bool) -> list[int]:
    added = APPROX_SPECIAL_TOKENS if special else 0
    return [approx_tokens(t) + added for t in texts]


_approx_batch = Counter(_approx_encode)


def trained_lengths(count: Counter, rows: Sequence[TrainingText]) -> list[int]:
    """Tokens train.py trains on per row: each piece counted on its own (the first of a non-chat row with the
    tokenizer's special tokens), plus the tokens it adds around them (training.TrainingText.extra_tokens)."""
    lengths = [row.extra_tokens for row in rows]
    first = [(i, row.pieces[0]) for i, row in enumerate(rows) if row.special_first and row.pieces]
    rest = [(i, p) for i, row in enumerate(rows) for p in row.pieces[1 if row.special_first else 0 :]]
    for batch, special in ((first, True), (rest, False)):
        for (i, _), n in zip(batch, count([text for _, text in batch], special), strict=True):
            lengths[i] += n
    return lengths


def make_counter(tokenizer_json: str | Path | None) -> tuple[Counter, str, tuple[str, ...]]:
    """A token counter over a batch of texts, its method name and notes: the tokenizer when usable, else
    the approximation. `tokenizer_json` is a path to a tokenizer.json file."""
    if tokenizer_json is None:
        return _approx_batch, APPROX_METHOD, (APPROXIMATION_NOTE,)
    if importlib.util.find_spec("tokenizers") is None:
        note = "tokenizer_json given but the tokenizers package is not installed; " + APPROXIMATION_NOTE
        return _approx_batch, APPROX_METHOD, (note,)
    # DataCheckError, not a bare ValueError or OSError: the CLI prints it as one line (a directory was a traceback).
    if not Path(tokenizer_json).is_file():
        raise DataCheckError(f"tokenizer_json: no such file {str(tokenizer_json)!r}")
    try:
        text = Path(tokenizer_json).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DataCheckError(f"tokenizer_json: {str(tokenizer_json)!r} is not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise DataCheckError(f"tokenizer_json: cannot read {str(tokenizer_json)!r} ({exc.strerror or exc})") from None
    return counter_from_json(text, str(tokenizer_json))


def counter_from_json(tokenizer_json_text: str, label: str = "tokenizer.json") -> tuple[Counter, str, tuple[str, ...]]:
    """Like make_counter, from the text of a tokenizer.json (as uploaded to the service)."""
    try:
        module: Any = importlib.import_module("tokenizers")
    except ImportError:
        note = "tokenizer_json given but the tokenizers package is not installed; " + APPROXIMATION_NOTE
        return _approx_batch, APPROX_METHOD, (note,)
    try:
        tokenizer = module.Tokenizer.from_str(tokenizer_json_text)
    except Exception as exc:  # the tokenizers package raises its own exception type for bad files
        raise DataCheckError(f"tokenizer_json: not a tokenizer.json the tokenizers package can load ({exc})") from None
    # A tokenizer.json may carry truncation and padding settings (the file's "truncation" and "padding"): counted
    # with them, rows were cut to its max_length or padded to a batch's longest (a probe: a max_length of 16 counted
    # 1,440 tokens of 9,910). What a row is long is the question, so neither applies.
    tokenizer.no_truncation()
    tokenizer.no_padding()

    def encode(texts: Sequence[str], special: bool) -> list[int]:
        # encode_batch tokenizes on the package's own threads; the post-processor adds the special tokens.
        return [len(e.ids) for e in tokenizer.encode_batch(list(texts), add_special_tokens=special)]

    return Counter(encode), TOKENIZER_METHOD, (f"exact counts from {label}",)


def percentile(sorted_values: Sequence[int], pct: float) -> int:
    """Nearest-rank percentile (the smallest value with at least pct% of values at or below it)."""
    if len(sorted_values) == 0:
        return 0
    if not 0 < pct <= 100:
        raise ValueError(f"pct: {pct} is outside (0, 100]")
    rank = math.ceil(pct / 100 * len(sorted_values))
    return int(sorted_values[max(rank, 1) - 1])


def choose_seq_len(p99_tokens: int) -> int:
    """The smallest bucket in SEQ_LEN_BUCKETS_TOKENS that holds p99; the largest bucket when none does."""
    for bucket in SEQ_LEN_BUCKETS_TOKENS:
        if p99_tokens <= bucket:
            return bucket
    return SEQ_LEN_BUCKETS_TOKENS[-1]


PADDING_ASSUMPTION = (
    "unpacked: every row padded (or truncated) to the recommended seq_len, i.e. static padding; dynamic "
    "padding to the longest row in each batch costs less, between the packed and this figure. packed: the sum "
    "of row lengths, a truncated row counted at seq_len"
)


class LengthHistogram:
    """Exact count of rows per token length: percentiles without keeping every length (one entry per
    distinct length, so a few thousand entries for real data sets, whatever their row count)."""

    def __init__(self) -> None:
        self.counts: collections.Counter[int] = collections.Counter()

    def add(self, lengths: Iterable[int]) -> None:
        self.counts.update(lengths)

    @property
    def rows(self) -> int:
        return self.counts.total()

    def arrays(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """The distinct lengths, ascending, and how many rows have each."""
        values = np.array(sorted(self.counts), dtype=np.int64)
        return values, np.array([self.counts[v] for v in values.tolist()], dtype=np.int64)


def token_stats(lengths: Sequence[int] | npt.NDArray[np.uint32], method: str, notes: tuple[str, ...]) -> TokenStats:
    """Percentiles, recommended seq_len, truncation and tokens per epoch padded vs packed."""
    values, counts = np.unique(np.asarray(lengths, dtype=np.int64), return_counts=True)
    return histogram_token_stats(values, counts.astype(np.int64), method, notes)


def histogram_token_stats(
    values: npt.NDArray[np.int64], counts: npt.NDArray[np.int64], method: str, notes: tuple[str, ...]
) -> TokenStats:
    """token_stats from a histogram: the distinct lengths (ascending) and how many rows have each."""
    rows = int(counts.sum())
    cumulative = np.cumsum(counts)

    def nearest_rank(pct: float) -> int:  # as percentile() on the sorted lengths
        if rows == 0:
            return 0
        rank = math.ceil(pct / 100 * rows)
        return int(values[int(np.searchsorted(cumulative, max(rank, 1), side="left"))])

    p = {pct: nearest_rank(pct) for pct in PERCENTILES}
    seq_len = choose_seq_len(p[99])
    truncated = int(counts[values > seq_len].sum())
    extra: tuple[str, ...] = ()
    if rows and p[99] > SEQ_LEN_BUCKETS_TOKENS[-1]:
        extra = (f"p99 ({p[99]} tokens) exceeds the largest bucket {SEQ_LEN_BUCKETS_TOKENS[-1]}",)
    return TokenStats(
        method=method,
        rows_counted=rows,
        p50_tokens=p[50],
        p90_tokens=p[90],
        p95_tokens=p[95],
        p99_tokens=p[99],
        max_tokens=int(values[-1]) if rows else 0,
        recommended_seq_len_tokens=seq_len,
        truncated_rows=truncated,
        truncated_share=truncated / rows if rows else 0.0,
        tokens_per_epoch_padded=rows * seq_len,
        tokens_per_epoch_packed=int((np.minimum(values, seq_len) * counts).sum()),
        tokens_per_epoch=int((values * counts).sum()),
        padding_assumption=PADDING_ASSUMPTION,
        notes=notes + extra,
    )
