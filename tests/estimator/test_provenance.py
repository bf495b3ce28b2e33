"""Every numeric constant of the estimator, the planner and the communication model has its provenance.

The modules are read with ``ast``: every module-level UPPER_CASE name bound to a number (a literal, arithmetic,
or a tuple/dict of numbers; its value read from the imported module), every numeric default of a class field
(``x: float = 0.15`` or ``Field(default=0.15)``), and every numeric keyword argument in a module-level
constant's constructor call (``_DEFAULTS["torchtune"] = FrameworkDefaults(loss_chunks=8)``) must be listed in
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


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def collect_constants() -> dict[str, Any]:
    """Every numeric constant the estimator and planner modules bind, by module.NAME."""
    found: dict[str, Any] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = _module_name(path)
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


@pytest.fixture(scope="module")
def registry() -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = tomllib.loads(REGISTRY.read_text(encoding="utf-8"))["constant"]
    return entries


@pytest.fixture(scope="module")
def constants() -> dict[str, Any]:
    return collect_constants()


def test_the_collector_finds_known_constants(constants: dict[str, Any]) -> None:
    # The collector itself: a literal, arithmetic of literals, a derived dict, a class default, a call keyword.
    assert constants["services.estimator.memory.allocator.FRAGMENTATION_OF_DYNAMIC"] == 0.15
    assert constants["services.estimator.memory.device.NCCL_LL128_BUFFER_BYTES"] == 120 * 640 * 8 * 8
    assert "hopper" in constants["services.estimator.throughput.rates.UTILISATION_PRIOR"]
    assert constants["services.planner.constraints.Constraints.safety_margin"] == 0.10
    assert constants["services.estimator.recipe._DEFAULTS.torchtune.loss_chunks"] == 8
    assert "services.estimator.counters.COUNTERS" not in constants  # strings are not numbers


def test_every_constant_in_the_code_is_registered(constants: dict[str, Any], registry: list[dict[str, Any]]) -> None:
    listed = {entry["name"] for entry in registry}
    missing = sorted(set(constants) - listed)
    assert not missing, f"constants without provenance in {REGISTRY.relative_to(ROOT)}: {missing}"


def test_every_registered_constant_exists(constants: dict[str, Any], registry: list[dict[str, Any]]) -> None:
    stale = sorted(entry["name"] for entry in registry if entry["name"] not in constants)
    assert not stale, f"registry entries naming no constant in the code: {stale}"
    names = [entry["name"] for entry in registry]
    assert len(names) == len(set(names)), "a constant is registered twice"


def test_registered_values_equal_the_code(constants: dict[str, Any], registry: list[dict[str, Any]]) -> None:
    wrong = [
        f"{e['name']}: registry {e['value']!r}, code {constants[e['name']]!r}"
        for e in registry
        if e["name"] in constants and not _same(e["value"], constants[e["name"]])
    ]
    assert not wrong, "\n".join(wrong)


def test_every_entry_carries_what_its_kind_requires(registry: list[dict[str, Any]]) -> None:
    listed = {entry["name"] for entry in registry}
    problems = []
    for entry in registry:
        name, kind = entry.get("name", "?"), entry.get("kind")
        if kind not in REQUIRED:
            problems.append(f"{name}: kind {kind!r} is not one of {sorted(REQUIRED)}")
            continue
        problems += [f"{name}: no {f}" for f in (*COMMON, *REQUIRED[kind]) if not entry.get(f) and entry.get(f) != 0]
        script = entry.get("script")
        if script is not None and not (ROOT / script).is_file():
            problems.append(f"{name}: script {script} does not exist")
        if kind == "measured" and script and not (ROOT / script).resolve().is_relative_to(MEASURING_SCRIPTS):
            problems.append(f"{name}: a measured constant's script belongs under benchmarks/mechanisms, not {script}")
        problems += [f"{name}: input {i} is not registered" for i in entry.get("inputs", ()) if i not in listed]
    assert not problems, "\n".join(problems)


def test_the_generated_listing_is_up_to_date() -> None:
    from benchmarks.constants import DOC, render

    assert DOC.read_text(encoding="utf-8") == render(), "docs/constants.md is stale: run python -m benchmarks.constants"
