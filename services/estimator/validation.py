"""Readable validation messages: each names the field, what was given and what is allowed."""

from __future__ import annotations

import bisect
import reprlib
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from services.core.errors import MAX_LISTED_PROBLEMS, listed
from services.estimator.plan import Plan


def describe_errors(exc: ValidationError, prefix: str = "") -> list[str]:
    """One line per problem: ``field.path: what is wrong (got VALUE)``."""
    return describe_error_list(exc.errors(), prefix)


MAX_LISTED_ERRORS = MAX_LISTED_PROBLEMS
# Only this many errors are described (about 15 us each); the rest are counted. 65,000 unknown fields
# took 0.7 s to describe in full.
MAX_DESCRIBED_ERRORS = 1000
# A field path or a given value is shown up to this many characters.
_MAX_SHOWN_CHARS = 200


# reprlib bounds the work as well as the text: a list input is shown by its first items, not repr'd whole.
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 3, 200, 200
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 10


def _shown(value: Any) -> str:
    return _REPR.repr(value)[:_MAX_SHOWN_CHARS]


def describe_error_list(
    errors: Sequence[Any], prefix: str = "", limit: int = MAX_LISTED_ERRORS, schema: str = "the plan schema"
) -> list[str]:
    """The same, from pydantic/FastAPI error dicts (FastAPI's start their location with 'body'); ``schema``: where
    an unknown field's spelling is checked (the plan schema; an API body's own, in /docs).

    At most ``limit`` lines, then one line counting the rest; the first MAX_DESCRIBED_ERRORS errors are
    described (in time linear in their number, up to a sort) and the others only counted."""
    found: list[tuple[str, str]] = []
    not_described = max(0, len(errors) - MAX_DESCRIBED_ERRORS)
    for err in errors[:MAX_DESCRIBED_ERRORS]:
        # Drop pydantic's union/validator tags such as "list[literal[...]]", and FastAPI's "body".
        parts = [str(part) for part in err["loc"] if "[" not in str(part) and "-" not in str(part)]
        if parts[:1] == ["body"]:
            parts = parts[1:]
        elif [str(part) for part in err["loc"][:1]] == ["header"] and len(err["loc"]) > 1:
            # A header as the client sends it (X-Node-Token, Idempotency-Key): its hyphens are no validator tag.
            parts = [str(err["loc"][1])]
        loc = ".".join(parts)
        msg = err["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        # Model-level checks name their field first ("quantization: ...").
        head, sep, rest = msg.partition(": ")
        if (
            sep
            and head.replace("_", "").replace(".", "").replace("[", "").replace("]", "").isalnum()
            and " " not in head
        ):
            loc = f"{loc}.{head}" if loc else head
            msg = rest
        field = f"{prefix}{loc}" if loc else (prefix.rstrip(".") or "plan")
        msg = msg[:1].lower() + msg[1:]
        if err["type"] == "extra_forbidden":
            msg = f"unknown field (check its spelling against {schema})"
        shown = err.get("input")
        given = "" if err["type"] in ("missing", "model_type") or isinstance(shown, dict) else f" (got {_shown(shown)})"
        found.append((field, f"{field[:_MAX_SHOWN_CHARS]}: {msg}{given}"))
    # Of the alternatives a union reports for one field, keep the most specific: a field is dropped when
    # another one lies under it. Sorted, the fields under F are the ones right after F + "." (a binary
    # search each, where comparing every pair was quadratic: 5,000 errors took 3.5 s).
    ordered = sorted({field for field, _ in found})
    has_child: dict[str, bool] = {}
    lines: list[str] = []
    seen: set[str] = set()
    for field, line in found:
        if field not in has_child:
            under = field + "."
            at = bisect.bisect_left(ordered, under)
            has_child[field] = at < len(ordered) and ordered[at].startswith(under)
        if has_child[field] or line in seen:
            continue
        seen.add(line)
        lines.append(line)
    return listed(lines, not_described, limit)


class PlanError(ValueError):
    """A plan that failed validation; ``problems`` holds one readable line per field."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def parse_plan(data: Any) -> Plan:
    """Validate plan data (a dict from JSON), raising :class:`PlanError` with readable lines."""
    if not isinstance(data, dict):
        raise PlanError(["plan: must be a JSON object"])
    try:
        return Plan.model_validate(data)
    except ValidationError as exc:
        raise PlanError(describe_errors(exc)) from None
