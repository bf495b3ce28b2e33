"""The Idempotency-Key header of a retried POST (plans, quotes): one reading of it for every endpoint."""

from __future__ import annotations

from services.core.errors import Unprocessable

MAX_KEY_CHARS = 200  # the endpoints' Header(max_length=...) and the tables' column width


def idempotency_key(value: str | None) -> str | None:
    """The key as stored: surrounding spaces and tabs are no part of a header's value (RFC 9110 section 5.5; uvicorn's
    parsers drop them, an in-process client does not), so " k1 " is the key "k1" whatever carried the request; a key
    of blanks alone, or one too long, is a 422 naming the header."""
    if value is None:
        return None
    key = value.strip(" \t")
    if not 1 <= len(key) <= MAX_KEY_CHARS:
        raise Unprocessable(f"Idempotency-Key: 1-{MAX_KEY_CHARS} characters, not blank", field="Idempotency-Key")
    return key
