"""Limits on JSON input that every reader of a request body applies: depth, numbers, strings.

Pure (standard library only), so the estimator's schema, the API's middleware and the dashboard's form
share one definition. Each problem names the JSON path of the value, e.g. ``model.config.vocab_size``.
"""

from __future__ import annotations

import json
import math
from typing import Any

# Real config.json files nest 3 levels (gemma3: text_config.rope_scaling.factor); API bodies add 2
# (model.config). 32 leaves a wide margin and keeps every recursive reader (pydantic, json.dumps,
# the database drivers) far from Python's recursion limit of 1000.
MAX_DEPTH = 32
# The largest integer every JSON reader represents exactly (RFC 8259 section 6: IEEE 754 doubles have
# 53 bits); no real config or plan field comes near it.
MAX_SAFE_INTEGER = 2**53 - 1


class JsonInputError(ValueError):
    """JSON that cannot be accepted; ``field`` is the dotted path of the offending value."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def join_path(prefix: str, part: str | int) -> str:
    """``model.config`` + ``vocab_size`` -> ``model.config.vocab_size``; list items as ``[3]``."""
    if isinstance(part, int):
        return f"{prefix}[{part}]"
    return f"{prefix}.{part}" if prefix else part


def _string_problem(text: str) -> str | None:
    if "\x00" in text:
        return "contains a NUL character (\\u0000), which no database text column stores"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone UTF-16 surrogate (such as \\ud800), which is not valid Unicode text"
    return None


def check_text(field: str, text: str) -> None:
    """Raise :class:`JsonInputError` for text no database column or UTF-8 response can hold."""
    problem = _string_problem(text)
    if problem is not None:
        raise JsonInputError(field, problem)


def check_value(value: Any, field: str = "", max_depth: int = MAX_DEPTH) -> None:
    """Walk a parsed JSON value (iteratively: no recursion limit to hit) and raise
    :class:`JsonInputError` for the first value nested over ``max_depth`` levels, a non-finite number
    (``Infinity``, ``NaN``, ``1e400``), an integer beyond +-(2**53 - 1), or a string or key with a NUL
    character or a lone surrogate."""
    stack: list[tuple[Any, str, int]] = [(value, field, 0)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth >= max_depth:
                raise JsonInputError(path or "body", f"nested more than {max_depth} levels deep")
            if isinstance(item, dict):
                for key, child in item.items():
                    key_text = str(key)
                    problem = _string_problem(key_text)
                    if problem is not None:
                        raise JsonInputError(path or "body", f"a key {problem}")
                    stack.append((child, join_path(path, key_text), depth + 1))
            else:
                stack.extend((child, join_path(path, i), depth + 1) for i, child in enumerate(item))
        elif isinstance(item, bool) or item is None:
            continue
        elif isinstance(item, int):
            if abs(item) > MAX_SAFE_INTEGER:
                raise JsonInputError(path or "body", f"integer too large (at most {MAX_SAFE_INTEGER:,} in magnitude)")
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise JsonInputError(
                    path or "body", f"must be a finite number, got {item!r} (JSON has no Infinity or NaN)"
                )
        elif isinstance(item, str):
            check_text(path or "body", item)


def _position(text: str, pos: int) -> tuple[int, int]:
    line = text.count("\n", 0, pos) + 1
    column = pos - (text.rfind("\n", 0, pos) + 1) + 1
    return line, column


def loads(data: bytes | str, field: str = "body", max_depth: int = MAX_DEPTH) -> Any:
    """Parse JSON text and check it with :func:`check_value`; every failure is a
    :class:`JsonInputError` with a readable message (a syntax error names its line and column)."""
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise JsonInputError(field, f"not UTF-8 text (invalid byte at offset {exc.start})") from None
    else:
        text = data
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        line, column = _position(text, exc.pos)
        raise JsonInputError(
            field, f"not valid JSON at line {line}, column {column} (character {exc.pos}): {exc.msg}"
        ) from None
    except RecursionError:
        raise JsonInputError(field, f"nested more than {max_depth} levels deep") from None
    except ValueError as exc:  # e.g. an integer literal over Python's 4,300-digit limit
        raise JsonInputError(field, f"not acceptable JSON: {exc}") from None
    check_value(value, "" if field == "body" else field, max_depth)
    return value
