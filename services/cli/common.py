"""What every command module shares: the one-line user error, the parser that raises it, and small
readers for the files and numbers users pass."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, Protocol

from services.core import json_limits

EXIT_BAD_INPUT = 2


class CliError(Exception):
    """A user error: printed as one line, exit status 2."""


class Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors become a `CliError` (one line, exit 2)."""

    def error(self, message: str) -> NoReturn:
        raise CliError(message)


class Subparsers(Protocol):
    """What `register(subparsers)` receives: the group returned by `add_subparsers`."""

    def add_parser(self, name: str, **kwargs: Any) -> Parser: ...


def read_json(path: str, what: str) -> Any:
    """Parse a JSON file named on the command line; errors name the flag and the position."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise CliError(f"{what} {path}: cannot read ({exc.strerror or exc})") from None
    try:
        return json_limits.loads(text)
    except json_limits.JsonSyntaxError as exc:
        raise CliError(f"{what} {path}: {exc.message}") from None
    except json_limits.JsonInputError as exc:  # too deep, Infinity/NaN, NUL, lone surrogates
        raise CliError(f"{what} {path}: {exc.field}: {exc.message}") from None


def read_plan_file(path: str) -> dict[str, Any]:
    """A plan JSON file; a benchmark case ({"plan": ..., "measured": ...}) is accepted as well."""
    data = read_json(path, "--plan")
    if isinstance(data, dict) and isinstance(data.get("plan"), dict) and "model" not in data:
        data = data["plan"]
    if not isinstance(data, dict):
        raise CliError(f"--plan {path}: must hold a JSON object")
    return dict(data)


def int_arg(name: str) -> Callable[[str], int]:
    """An argparse type for an integer flag whose error names the flag."""

    def parse(value: str) -> int:
        try:
            return int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, got {value!r}") from None

    return parse


def api_error(response: Any) -> str:
    """The service's error message from an HTTP response, or its status."""
    try:
        body = response.json()
        return str(body.get("message") or body)
    except ValueError:
        return f"HTTP {response.status_code}"
