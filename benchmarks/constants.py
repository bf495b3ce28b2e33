"""Render the constants registry (services/estimator/constants.toml) to docs/constants.md.

Run: ``python -m benchmarks.constants`` (rewrites the page) or ``python -m benchmarks.constants --check`` (exits 1
when the page is stale). tests/estimator/test_provenance.py checks the registry against the code and the page
against the registry.
"""

from __future__ import annotations

import sys
import tomllib
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
REGISTRY = ROOT / "services" / "estimator" / "constants.toml"
DOC = ROOT / "docs" / "constants.md"

KINDS = (
    ("cited", "a published source, and the number it gives"),
    ("measured", "measured by a re-runnable script under benchmarks/mechanisms"),
    ("fitted", "fitted by a script on named cases, with its held-out effect"),
    ("derived", "computed from other registered constants"),
    ("tuned", "set by hand while a benchmark was read; no script re-derives it"),
    ("assumed", "no source: an assumption, as the code states it"),
    ("policy", "a choice that is no physical quantity: limits, tolerances, defaults of user inputs"),
    ("definition", "a unit or a dtype's size"),
    ("neutral", "a field default meaning absent, single or none yet"),
)


def load(path: Path = REGISTRY) -> list[dict[str, Any]]:
    """The registry's entries, in file order."""
    entries: list[dict[str, Any]] = tomllib.loads(path.read_text(encoding="utf-8"))["constant"]
    return entries


def _number(value: float) -> str:
    if isinstance(value, bool) or not isinstance(value, float):
        return str(value)
    return f"{value:.6g}"


def _value(value: Any) -> str:
    if isinstance(value, list):
        return "(" + ", ".join(_value(v) for v in value) + ")"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_value(v)}" for k, v in value.items()) + "}"
    return _number(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def provenance(entry: dict[str, Any]) -> str:
    """One line saying where an entry's value comes from."""
    parts: list[str] = []
    if entry.get("source"):
        parts.append(f"{entry['source']}: {entry['source_states']}.")
    if entry.get("script"):
        result = f" ({entry['result']})" if entry.get("result") else ""
        parts.append(f"`python -m {entry['script'].removesuffix('.py').replace('/', '.')}`{result}.")
    if entry.get("cases"):
        parts.append(f"Cases: {entry['cases']}. Held out: {entry['held_out_effect']}.")
    if entry.get("formula"):
        parts.append(f"{entry['formula']}.")
    for field in ("relation", "statement"):
        if entry.get(field):
            text = entry[field]
            first = text.split(" ", 1)[0]
            if first.isalpha() and first.islower():  # a plain word, not a name like modules_called_per_layer()
                text = text[0].upper() + text[1:]
            parts.append(text + ("" if text.endswith(".") else "."))
    return " ".join(parts)


def _short(name: str) -> str:
    return name.removeprefix("services.")


def render(entries: list[dict[str, Any]] | None = None) -> str:
    """docs/constants.md from the registry."""
    entries = load() if entries is None else entries
    counts = Counter(entry["kind"] for entry in entries)
    out = [
        "# Constants and their provenance",
        "",
        "<!-- Generated from services/estimator/constants.toml by `python -m benchmarks.constants`; do not edit. -->",
        "",
        "Every numeric constant of the estimator (`services/estimator`), the planner (`services/planner`) and the",
        "communication model (`services/estimator/communication.py`), with its unit, the quantity it stands for and",
        "where its value comes from. The registry is `services/estimator/constants.toml`;",
        "`tests/estimator/test_provenance.py` reads the modules with `ast` and fails when a constant the code binds",
        "is not listed, when a listed value differs from the code's, when an entry lacks what its kind requires, or",
        "when a measuring or fitting script it names does not exist. A constant is a module-level UPPER_CASE name",
        "bound to a number (or a tuple or dict of numbers), a class field's numeric default, a numeric keyword of a",
        "module-level constructor call, or a number used inside a function (listed as `function()` with all the",
        "numbers it uses; counts and dtype sizes up to 4, bits per byte, a half, a sign, percent and unit",
        "conversions are structure and left out: `STRUCTURAL` in the test). This page is rendered from the registry:",
        "",
        "<!-- not-run: rewrites docs/constants.md; the provenance test checks it is up to date -->",
        "```bash",
        "python -m benchmarks.constants",
        "```",
        "",
        "| kind | meaning | constants |",
        "|---|---|---|",
    ]
    out += [f"| {kind} | {meaning} | {counts.get(kind, 0)} |" for kind, meaning in KINDS]
    out += [
        "",
        "No constant is *fitted* by a script: the ones set while the accuracy benchmark was read are *tuned*, and",
        "their held-out effect is unknown until a script re-derives them (issue 26).",
        "",
        "## Set by hand or assumed",
        "",
        "The values no source or measurement fixes, which a change may move only with a held-out score:",
        "",
    ]
    for entry in entries:
        if entry["kind"] in ("tuned", "assumed"):
            out.append(f"- `{_short(entry['name'])}` = {_value(entry['value'])} ({entry['kind']}): {provenance(entry)}")
    out += ["", "## Every constant, by module"]
    module = None
    for entry in entries:
        if _module(entry["name"]) != module:
            module = _module(entry["name"])
            out += [
                "",
                f"### {module}",
                "",
                "| constant | value | unit | kind | quantity | provenance |",
                "|---|---|---|---|---|---|",
            ]
        row = (
            f"`{_short(entry['name']).removeprefix(module + '.')}`",
            _value(entry["value"]),
            entry["unit"],
            entry["kind"],
            entry["quantity"],
            provenance(entry),
        )
        out.append("| " + " | ".join(_cell(c) for c in row) + " |")
    return "\n".join(out) + "\n"


def _module(name: str) -> str:
    """The module of a registered name: module.NAME, module.Class.field, module.NAME.key.argument or
    module.function() (the numbers a function uses)."""
    parts = _short(name).split(".")
    end = next(i for i, part in enumerate(parts) if not part.islower() or part.startswith("_") or part.endswith("()"))
    return ".".join(parts[:end])


def main(argv: list[str]) -> int:
    text = render()
    if argv == ["--check"]:
        if DOC.read_text(encoding="utf-8") != text:
            print("docs/constants.md is stale: run python -m benchmarks.constants", file=sys.stderr)
            return 1
        print("docs/constants.md is up to date")
        return 0
    if argv:
        print("usage: python -m benchmarks.constants [--check]", file=sys.stderr)
        return 2
    DOC.write_text(text, encoding="utf-8")
    print(f"wrote {DOC.relative_to(ROOT)} ({len(load())} constants)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
