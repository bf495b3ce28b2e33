"""Check a fine-tuning data set before GPUs are rented: format, lengths, duplicates and personal data.

Pure: stdlib, pydantic and numpy (pyarrow for Parquet and tokenizers for exact counts, when installed).
Reads streams and keeps memory flat in the file size and the row count (see report.check_source): the
duplicate indexes spill past a budget to a temporary SQLite file that is deleted at the end (spill.py).
Every reader works within Limits (limits.py): a line, a cell, a Parquet column chunk and what a
compressed file decodes to are bounded, and a file past one is refused with DataLimitError.
"""

from .dedup import Duplicate, exact_duplicates, minhash, near_duplicates
from .formats import FORMATS, detect_format, format_problem, format_votes
from .limits import DataLimitError, Limits, size_text
from .loading import (
    FILE_FORMATS,
    DataCheckError,
    RowError,
    compressed_name,
    file_format,
    iter_rows,
    load_rows,
    sniff_compression,
)
from .location import data_location_warning
from .pii import PiiFinding, find_pii, iban_valid, luhn_valid, mask_text, phone_valid, tc_kimlik_valid, vkn_valid
from .report import DatasetReport, RowSource, check_dataset, check_source, validation_rows, write_clean, write_masked
from .tokens import (
    SEQ_LEN_BUCKETS_TOKENS,
    TokenStats,
    approx_tokens,
    choose_seq_len,
    counter_from_json,
    make_counter,
    percentile,
    token_stats,
)

__all__ = [
    "FILE_FORMATS",
    "FORMATS",
    "SEQ_LEN_BUCKETS_TOKENS",
    "DataCheckError",
    "DataLimitError",
    "DatasetReport",
    "Duplicate",
    "Limits",
    "PiiFinding",
    "RowError",
    "RowSource",
    "TokenStats",
    "approx_tokens",
    "check_dataset",
    "check_source",
    "choose_seq_len",
    "compressed_name",
    "counter_from_json",
    "data_location_warning",
    "detect_format",
    "exact_duplicates",
    "file_format",
    "find_pii",
    "format_problem",
    "format_votes",
    "iban_valid",
    "iter_rows",
    "load_rows",
    "luhn_valid",
    "make_counter",
    "mask_text",
    "minhash",
    "near_duplicates",
    "percentile",
    "phone_valid",
    "size_text",
    "sniff_compression",
    "tc_kimlik_valid",
    "token_stats",
    "validation_rows",
    "vkn_valid",
    "write_clean",
    "write_masked",
]
