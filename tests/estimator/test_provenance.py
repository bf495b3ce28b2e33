"""Every numeric constant of the estimator, the planner and the communication model has its provenance.

The modules are read with ``ast``: every module-level UPPER_CASE name bound to a number (a literal, arithmetic,
or a tuple/dict of numbers; its value read from the imported module), every numeric default of a class field
(``x: float = 0.15`` or ``Field(default=0.15)``), every numeric keyword argument in a module-level constant's
constructor call (``_DEFAULTS["torchtune"] = FrameworkDefaults(loss_chunks=8)``) and the numbers each function
uses beyond STRUCTURAL ones (as ``module.function()`` with the list of them) must be listed in
services/estimator/constants.toml with the same value, and each entry must carry what its kind requires.
"""

from __future__ import annotations

import ast
import importlib
import math
import operator
import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
REGISTRY = ROOT / "services" / "estimator" / "constants.toml"
PACKAGES = ("services/estimator", "services/planner")
MEASURING_SCRIPTS = ROOT / "benchmarks" / "mechanisms"

# What each kind must say besides name, value, unit, quantity and kind.
REQUIRED: dict[str, tuple[str, ...]] = {
    "cited": ("source", "source_states"),  # the source and the number it gives
    "measured": ("script",),  # a re-runnable script under benchmarks/mechanisms
    "fitted": ("script", "cases", "held_out_effect"),
    "derived": ("formula", "inputs"),  # computed from other registered constants
    "tuned": ("statement",),  # set by hand while a benchmark was read: how, and what it rests on
    "assumed": ("statement",),  # no source: the assumption, as the code states it
    "policy": ("statement",),  # a choice that is no physical quantity (limits, tolerances, defaults of inputs)
    "definition": ("statement",),  # a unit or a dtype's size
    "neutral": ("statement",),  # a field default meaning "absent" or "none yet"
}
COMMON = ("name", "value", "unit", "quantity", "kind")


def _is_upper(name: str) -> bool:
    bare = name.lstrip("_")
    return bool(bare) and bare[0].isalpha() and bare.upper() == bare


def _numeric(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int | float):
        return True
    if isinstance(value, tuple | list):
        return bool(value) and all(_numeric(v) for v in value)
    if isinstance(value, dict):
        return bool(value) and all(isinstance(k, str) and _numeric(v) for k, v in value.items())
    return False


_OPERATORS: dict[type[ast.operator], Any] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Pow: operator.pow,
    ast.LShift: operator.lshift,
}


def _arithmetic(node: ast.expr) -> Any:
    """The value of literals and arithmetic of literals (tuples, lists and dicts of them); raises otherwise."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _arithmetic(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_arithmetic(node.left), _arithmetic(node.right))
    if isinstance(node, ast.Tuple | ast.List):
        return tuple(_arithmetic(e) for e in node.elts)
    if isinstance(node, ast.Dict) and all(k is not None for k in node.keys):
        return {_arithmetic(k): _arithmetic(v) for k, v in zip(node.keys, node.values, strict=True) if k is not None}
    raise ValueError(ast.unparse(node))


def _literal(node: ast.expr) -> Any:
    """The number a node spells with literals and arithmetic alone, else None."""
    try:
        value = _arithmetic(node)
    except (ValueError, TypeError):
        return None
    return value if _numeric(value) else None


def _call_arguments(node: ast.expr, path: str, found: dict[str, Any]) -> None:
    """Numeric keyword arguments of the constructor calls inside a module-level constant, by path."""
    if isinstance(node, ast.Dict):
        for key, value in zip(node.keys, node.values, strict=True):
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                _call_arguments(value, f"{path}.{key.value}", found)
    elif isinstance(node, ast.Call):
        for keyword in node.keywords:
            if keyword.arg is None:
                continue
            value = _literal(keyword.value)
            if value is not None:
                found[f"{path}.{keyword.arg}"] = value
            else:
                _call_arguments(keyword.value, path, found)


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def collect_constants(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, Any]:
    """Every numeric constant the modules of ``packages`` (importable from ``root``) bind, by module.NAME."""
    found: dict[str, Any] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            name = _module_name(path, root)
            tree = ast.parse(path.read_text(encoding="utf-8"))
            module = None
            for node in tree.body:
                if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    for target in targets:
                        if not (isinstance(target, ast.Name) and _is_upper(target.id)):
                            continue
                        module = module or importlib.import_module(name)
                        value = getattr(module, target.id)
                        if _numeric(value):
                            found[f"{name}.{target.id}"] = value
                        else:
                            _call_arguments(node.value, f"{name}.{target.id}", found)
                elif isinstance(node, ast.ClassDef):
                    for field in node.body:
                        if not (isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name)):
                            continue
                        default = field.value
                        if isinstance(default, ast.Call) and getattr(default.func, "id", None) == "Field":
                            default = next((k.value for k in default.keywords if k.arg == "default"), None)
                        value = None if default is None else _literal(default)
                        if value is not None:
                            found[f"{name}.{node.name}.{field.target.id}"] = value
    return found


# Numbers inside function bodies that are structure, not model constants: counts and dtype sizes up to 4 (and
# 8: bits per byte, two fp32 states), a half, a sign, percent, and unit conversions (SI and binary prefixes,
# seconds per minute and hour, hours per day, a float tolerance). Every other number a function uses is a
# constant and is registered under the function's name, "module.function()", with the list of its numbers.
STRUCTURAL: frozenset[float] = frozenset(
    {-1, 0, 0.5, 1, 2, 3, 4, 8, 24, 60, 100, 3600, 1e3, 1e6, 1e9, 1e12, 1024, 2**20, 2**30, 1e-9}
)


def _function_literals(function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[float]:
    """The non-structural numbers a function's body, defaults and decorators spell (arithmetic of literals
    counts as one number), leaving out formatting: f-strings, round()'s digits, slices."""
    found: list[float] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.JoinedStr | ast.Slice | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            return
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "round":
            for argument in node.args[:1]:
                visit(argument)
            return
        if isinstance(node, ast.Constant | ast.BinOp | ast.UnaryOp):
            value = _literal(node)
            if isinstance(value, int | float):
                if value not in STRUCTURAL:
                    found.append(value)
                return
        for child in ast.iter_child_nodes(node):
            visit(child)

    defaults = [d for d in (*function.args.defaults, *function.args.kw_defaults) if d is not None]
    for node in (*function.body, *function.decorator_list, *defaults):
        visit(node)
    return found


def collect_function_literals(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, Any]:
    """The numbers each function of the modules uses, by "module.Class.function()": a sorted list per function."""
    found: dict[str, Any] = {}

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                numbers = _function_literals(child)
                if numbers:
                    found[f"{prefix}{child.name}()"] = sorted(set(numbers))
                walk(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                walk(child, f"{prefix}{child.name}.")

    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            walk(ast.parse(path.read_text(encoding="utf-8")), _module_name(path, root) + ".")
    return found


def _plain(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _same(a: Any, b: Any) -> bool:
    a, b = _plain(a), _plain(b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, int | float) and isinstance(b, int | float):
        return math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)
    return False


def registry_problems(entries: list[dict[str, Any]], constants: dict[str, Any], root: Path = ROOT) -> list[str]:
    """What is wrong between the registry's entries and the constants the code binds (nothing: an empty list)."""
    listed = [str(entry.get("name", "?")) for entry in entries]
    problems = [f"{name}: in the code, not in the registry" for name in sorted(set(constants) - set(listed))]
    problems += [f"{name}: in the registry, not in the code" for name in sorted(set(listed) - set(constants))]
    problems += [f"{name}: registered twice" for name in sorted({n for n in listed if listed.count(n) > 1})]
    for entry in entries:
        name, kind = entry.get("name", "?"), entry.get("kind")
        if name in constants and "value" in entry and not _same(entry["value"], constants[name]):
            problems.append(f"{name}: registry value {entry['value']!r}, code value {constants[name]!r}")
        if kind not in REQUIRED:
            problems.append(f"{name}: kind {kind!r} is not one of {sorted(REQUIRED)}")
            continue
        problems += [f"{name}: no {f}" for f in (*COMMON, *REQUIRED[kind]) if entry.get(f) in (None, "", [])]
        script = entry.get("script")
        if script is not None and not (root / script).is_file():
            problems.append(f"{name}: script {script} does not exist")
        if (
            kind == "measured"
            and script
            and not (root / script).parent.resolve().is_relative_to((root / "benchmarks" / "mechanisms").resolve())
        ):
            problems.append(f"{name}: a measured constant's script belongs under benchmarks/mechanisms, not {script}")
        problems += [f"{name}: input {i} is not registered" for i in entry.get("inputs", ()) if i not in listed]
    return problems


@pytest.fixture(scope="module")
def registry() -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = tomllib.loads(REGISTRY.read_text(encoding="utf-8"))["constant"]
    return entries


@pytest.fixture(scope="module")
def constants() -> dict[str, Any]:
    return {**collect_constants(), **collect_function_literals()}


def test_the_collector_finds_known_constants(constants: dict[str, Any]) -> None:
    # A literal, arithmetic of literals, a derived dict, a pydantic Field default and a constructor keyword.
    assert constants["services.estimator.memory.segments.ALLOCATOR_MIN_BLOCK_BYTES"] == 512
    assert constants["services.estimator.memory.device.NCCL_LL128_BUFFER_BYTES"] == 120 * 640 * 8 * 8
    assert "hopper" in constants["services.estimator.throughput.rates.UTILISATION_PRIOR"]
    assert constants["services.planner.constraints.Constraints.prefer_simpler_within"] == 0.10
    assert constants["services.estimator.frameworks._DEFAULTS.torchtune.loss_chunks"] == 8
    assert "services.estimator.counters.COUNTERS" not in constants  # strings are not numbers
    assert constants["services.estimator.throughput.rates.utilisation_or_prior()"] == [0.4]


def test_every_constant_has_its_provenance(constants: dict[str, Any], registry: list[dict[str, Any]]) -> None:
    problems = registry_problems(registry, constants)
    assert not problems, f"{REGISTRY.relative_to(ROOT)}:\n" + "\n".join(problems)


def _entry(name: str, value: Any, kind: str = "assumed", **fields: Any) -> dict[str, Any]:
    return {"name": name, "value": value, "unit": "1", "quantity": "q", "kind": kind, "statement": "s", **fields}


def test_an_unlisted_constant_a_changed_value_and_a_missing_script_fail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "provenance_probe"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "model.py").write_text(
        "from dataclasses import dataclass\n"
        "SHARE = 0.15\n"
        "BYTES = 2 << 20\n"
        "NAME = 'x'\n"
        "@dataclass\n"
        "class Knob:\n"
        "    margin: float = 0.2\n"
        "    def scaled(self, x: float) -> str:\n"
        "        return f'{x / 7:.1f}' if round(x, 5) else str(x * 0.37 + 2**30)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    found = collect_constants(tmp_path, ("provenance_probe",))
    assert found == {
        "provenance_probe.model.SHARE": 0.15,
        "provenance_probe.model.BYTES": 2 << 20,
        "provenance_probe.model.Knob.margin": 0.2,
    }
    assert collect_function_literals(tmp_path, ("provenance_probe",)) == {
        "provenance_probe.model.Knob.scaled()": [0.37]
    }
    entries = [
        _entry("provenance_probe.model.SHARE", 0.16),
        _entry("provenance_probe.model.BYTES", 2 << 20, "measured", script="benchmarks/mechanisms/nowhere.py"),
    ]
    problems = registry_problems(entries, found, tmp_path)
    assert "provenance_probe.model.Knob.margin: in the code, not in the registry" in problems
    assert any(p.startswith("provenance_probe.model.SHARE: registry value 0.16") for p in problems)
    assert "provenance_probe.model.BYTES: script benchmarks/mechanisms/nowhere.py does not exist" in problems
    cited = [_entry(name, value, "cited") for name, value in found.items()]
    assert "provenance_probe.model.SHARE: no source" in registry_problems(cited, found, tmp_path)


def test_the_generated_listing_is_up_to_date() -> None:
    from benchmarks.constants import DOC, render

    assert DOC.read_text(encoding="utf-8") == render(), "docs/constants.md is stale: run python -m benchmarks.constants"
