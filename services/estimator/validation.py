"""Readable validation messages: each names the field, what was given and what is allowed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from services.estimator.plan import Plan


def describe_errors(exc: ValidationError, prefix: str = "") -> list[str]:
    """One line per problem: ``field.path: what is wrong (got VALUE)``."""
    return describe_error_list(exc.errors(), prefix)


def describe_error_list(errors: Sequence[Any], prefix: str = "") -> list[str]:
    """The same, from pydantic/FastAPI error dicts (FastAPI's start their location with 'body')."""
    found: list[tuple[str, str]] = []
    for err in errors:
        # Drop pydantic's union/validator tags such as "list[literal[...]]", and FastAPI's "body".
        parts = [str(part) for part in err["loc"] if "[" not in str(part) and "-" not in str(part)]
        if parts[:1] == ["body"]:
            parts = parts[1:]
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
            msg = "unknown field (check its spelling against the plan schema)"
        shown = err.get("input")
        given = "" if err["type"] in ("missing", "model_type") or isinstance(shown, dict) else f" (got {shown!r:.200})"
        found.append((field, f"{field}: {msg}{given}"))
    # Of the alternatives a union reports for one field, keep the most specific.
    fields = [f for f, _ in found]
    lines = []
    for field, line in found:
        if any(other != field and other.startswith(field + ".") for other in fields):
            continue
        if line not in lines:
            lines.append(line)
    return lines


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
