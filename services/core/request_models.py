"""The base of request bodies that refuse unknown fields (pure: pydantic only)."""

from __future__ import annotations

import unicodedata
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, model_validator

# Past this many unknown fields an object is answered with one error naming the first few, where pydantic
# builds one error each: 65,000 of them cost about 1 s of CPU to build and describe (issue 21 item 1).
MAX_UNKNOWN_FIELDS = 20


class ClosedModel(BaseModel):
    """A request body (``extra="forbid"`` in its config): a few unknown fields are an error each, many
    are one error."""

    @model_validator(mode="before")
    @classmethod
    def _few_unknown_fields(cls, data: Any) -> Any:
        if isinstance(data, dict) and len(data) > len(cls.model_fields) + MAX_UNKNOWN_FIELDS:
            unknown = [str(key) for key in data if key not in cls.model_fields]
            if len(unknown) > MAX_UNKNOWN_FIELDS:
                shown = ", ".join(repr(name[:40]) for name in unknown[:5])
                raise ValueError(
                    f"{len(unknown):,} unknown fields ({shown}, ...); check their spelling against the schema"
                )
        return data


def _as_utc(value: datetime) -> datetime:
    try:
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    except OverflowError:  # 9999-12-31T23:59:59-23:59 is past datetime.max in UTC: a 422, not a 500
        raise ValueError("out of range once converted to UTC") from None


# A time in a request: one without a zone (or a date alone) is read as UTC, so it compares with the service's
# clock and stores as the database's timezone-aware UTC (services.core.db.UtcDateTime).
UtcDatetime = Annotated[datetime, AfterValidator(_as_utc)]


def _single_line(value: str) -> str:
    # Control characters (newlines, escapes: "\x1b[31m" recolours a terminal) have no place in a name, a path or an
    # address, and would reach quotes sent to customers, logs and the CLI's output as they are.
    # U+2028 and U+2029 (category Zl and Zp) break a line as a newline does.
    bad = next((c for c in value if unicodedata.category(c) in ("Cc", "Zl", "Zp")), None)
    if bad is not None:
        raise ValueError(f"must not hold control characters (found {bad!r})")
    # Bidi embeddings, overrides and isolates reorder the text around them: a customer name holding U+202E printed
    # the rest of a quote's line backwards (the "Trojan Source" characters, CVE-2021-42574). Other format characters
    # (the joiners of emoji and Persian names) stay.
    override = next((c for c in value if c in _BIDI_CONTROLS), None)
    if override is not None:
        raise ValueError(f"must not hold bidi control characters (found U+{ord(override):04X})")
    return value


_BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


# Text of one line: a name, a path, an address (no control characters, tab and newline included).
SingleLine = Annotated[str, AfterValidator(_single_line)]
