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
# Items of one JSON object or array. The longest real config.json lists are ImageNet-22k classifiers'
# id2label maps (about 21,800 labels, e.g. microsoft/beit-base-patch16-224-pt22k-ft22k); a price list is
# at most 10,000 rows (catalog/pricelist.py MAX_ROWS). Past this, a body is work for nothing.
MAX_ITEMS = 65_536
# The largest integer every JSON reader represents exactly (RFC 8259 section 6: IEEE 754 doubles have
# 53 bits); no real config or plan field comes near it.
MAX_SAFE_INTEGER = 2**53 - 1
# The largest value of a 32-bit INTEGER column (PostgreSQL's integer, SQLAlchemy's Integer): a request
# integer stored in one is bounded by it in its schema, or its column is a BigInteger.
INT32_MAX = 2**31 - 1


class JsonInputError(ValueError):
    """JSON that cannot be accepted; ``field`` is the dotted path of the offending value."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class JsonSyntaxError(JsonInputError):
    """Text that is not JSON at all (as opposed to JSON carrying a value gpuplan refuses)."""


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


def _path(field: str, trail: tuple[str | int, ...]) -> str:
    path = field
    for part in trail:
        path = join_path(path, part)
    if not path or path.startswith("["):  # the items of a top-level list
        path = "body" + path
    return path


def _leaf_problem(value: object) -> str | None:
    if isinstance(value, _LongInteger):
        return f"integer too large (at most {MAX_SAFE_INTEGER:,} in magnitude)"
    if isinstance(value, str):
        return _string_problem(value)
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and not -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
        return f"integer too large (at most {MAX_SAFE_INTEGER:,} in magnitude)"
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number, got {value!r} (JSON has no Infinity or NaN)"
    return None


def check_value(value: Any, field: str = "", max_depth: int = MAX_DEPTH, max_items: int = MAX_ITEMS) -> None:
    """Walk a parsed JSON value (iteratively: no recursion limit to hit) and raise
    :class:`JsonInputError` for the first value nested over ``max_depth`` levels, an object or array of
    more than ``max_items`` items, a non-finite number
    (``Infinity``, ``NaN``, ``1e400``), an integer beyond +-(2**53 - 1), or a string or key with a NUL
    character or a lone surrogate. Paths are built only for the value reported, so a large body costs
    one pass of cheap type checks."""
    if not isinstance(value, dict | list):
        problem = _leaf_problem(value)
        if problem is not None:
            raise JsonInputError(field or "body", problem)
        return
    stack: list[tuple[dict[Any, Any] | list[Any], int, tuple[str | int, ...]]] = [(value, 0, ())]
    while stack:
        container, depth, trail = stack.pop()
        if depth >= max_depth:
            raise JsonInputError(_path(field, trail), f"nested more than {max_depth} levels deep")
        if len(container) > max_items:
            kind_name = "keys" if isinstance(container, dict) else "items"
            raise JsonInputError(_path(field, trail), f"has {len(container):,} {kind_name}; at most {max_items:,}")
        pairs = container.items() if isinstance(container, dict) else enumerate(container)
        for key, child in pairs:
            if type(key) is str and not (key.isascii() and "\x00" not in key):
                problem = _string_problem(key)
                if problem is not None:
                    raise JsonInputError(_path(field, trail), f"a key {problem}")
            # Inline fast paths for the common leaves; _leaf_problem only for the suspicious ones.
            kind = type(child)
            if kind is int:
                if -MAX_SAFE_INTEGER <= child <= MAX_SAFE_INTEGER:
                    continue
            elif kind is str:
                if child.isascii() and "\x00" not in child:
                    continue
            elif kind is float:
                if child - child == 0.0:  # false for inf and nan
                    continue
            elif kind is dict or kind is list:
                stack.append((child, depth + 1, (*trail, key)))
                continue
            elif child is None or kind is bool:
                continue
            problem = _leaf_problem(child)
            if problem is not None:
                raise JsonInputError(_path(field, (*trail, key)), problem)


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
            raise JsonSyntaxError(field, f"not UTF-8 text (invalid byte at offset {exc.start})") from None
    else:
        text = data
    # The check of repeated keys triples the parse's time (a 1 MiB object of 65,536 keys: 16 -> 45 ms, all of it
    # holding the GIL the event loop needs), so only text the size of a plan, a quote or a node's report gets it.
    pairs = _unique_keys if len(text) <= REPEATS_CHECKED_UP_TO else None
    try:
        value = json.loads(text, object_pairs_hook=pairs)
    except _RepeatedKey as exc:
        raise JsonInputError(exc.key, "given more than once in one object; give each field once") from None
    except json.JSONDecodeError as exc:
        line, column = _position(text, exc.pos)
        raise JsonSyntaxError(
            field, f"not valid JSON at line {line}, column {column} (character {exc.pos}): {exc.msg}"
        ) from None
    except RecursionError:
        raise JsonInputError(field, f"nested more than {max_depth} levels deep") from None
    except ValueError as exc:  # e.g. an integer literal over Python's 4,300-digit limit
        # Parsed again with such literals kept as text, so the check names the field that holds one (the message
        # was the body's, and Python's own advice: "use sys.set_int_max_str_digits() to increase the limit").
        try:
            value = json.loads(text, parse_int=_integer, object_pairs_hook=pairs)
        except _RepeatedKey as repeated:
            raise JsonInputError(repeated.key, "given more than once in one object; give each field once") from None
        except ValueError:
            raise JsonInputError(field, f"not acceptable JSON: {exc}") from None
    check_value(value, "" if field == "body" else field, max_depth)
    return value


# JSON text of at most this many characters is refused where an object repeats a key (see loads).
REPEATS_CHECKED_UP_TO = 64 * 1024


class _RepeatedKey(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object's members as a dict, refusing a key given twice: json.loads keeps the last one silently, so
    {"model": ..., "model": ...} estimated whichever came last (a probe of the API)."""
    found = dict(pairs)
    if len(found) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _RepeatedKey(key)
            seen.add(key)
    return found


class _LongInteger(str):
    """An integer literal too long to be read as a number (only :func:`loads`' second reading makes these)."""


def _integer(literal: str) -> int | _LongInteger:
    return _LongInteger(literal) if len(literal) > _MAX_INTEGER_DIGITS else int(literal)


# Sign and digits of the longest literal read as a number: MAX_SAFE_INTEGER has 16 digits, so any longer one is
# refused as too large by check_value, and none near Python's 4,300-digit limit is converted.
_MAX_INTEGER_DIGITS = 32
