"""Check a fine-tuning data set before GPUs are rented: format, lengths, duplicates and personal data.

Pure: stdlib and pydantic only (pyarrow for Parquet and tokenizers for exact counts, when installed).
"""

from .dedup import Duplicate, exact_duplicates, minhash, near_duplicates
from .formats import FORMATS, detect_format, format_problem, format_votes
from .loading import DataCheckError, RowError, load_rows
from .location import data_location_warning
from .pii import PiiFinding, find_pii, iban_valid, luhn_valid, mask_text, tc_kimlik_valid
from .report import DatasetReport, check_dataset, validation_rows, write_clean, write_masked
from .tokens import SEQ_LEN_BUCKETS_TOKENS, TokenStats, approx_tokens, choose_seq_len, percentile, token_stats

__all__ = [
    "FORMATS",
    "SEQ_LEN_BUCKETS_TOKENS",
    "DataCheckError",
    "DatasetReport",
    "Duplicate",
    "PiiFinding",
    "RowError",
    "TokenStats",
    "approx_tokens",
    "check_dataset",
    "choose_seq_len",
    "data_location_warning",
    "detect_format",
    "exact_duplicates",
    "find_pii",
    "format_problem",
    "format_votes",
    "iban_valid",
    "load_rows",
    "luhn_valid",
    "mask_text",
    "minhash",
    "near_duplicates",
    "percentile",
    "tc_kimlik_valid",
    "token_stats",
    "validation_rows",
    "write_clean",
    "write_masked",
]
