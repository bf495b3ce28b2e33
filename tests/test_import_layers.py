"""Imports point one way (issue 24 step 4). The import graph of services/ and workers/ is built from the
source with ast (nothing is imported; imports inside functions and under ``if TYPE_CHECKING:`` count:
a type-only circle is still a circle). It must have no circle between modules, none between packages,
and no import from a lower layer to a higher one outside ``ALLOWED``."""

from __future__ import annotations

import ast
from collections import defaultdict, deque
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("services", "workers")

# Low -> high; a package may import its own layer or a lower one. Packages in one layer may import each
# other one way (the circle checks catch a loop).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("core",),  # settings, database, errors, task runner: no domain knowledge
    ("storage", "datacheck"),  # S3 client; the data checks (pure)
    ("orgs",),  # organizations, keys, principals, audit log
    ("catalog",),  # GPU specs, models, offers, price feeds
    ("estimator",),  # pure memory/throughput model over catalog data
    ("planner",),  # pure search over setups and offers, checkpoint schedule
    ("trace", "hub", "export"),  # the estimator applied: traces, Hub configs, trainer configs
    ("datasets",),  # stored data sets and their checks
    ("nodes",),  # GPU nodes, lifecycle, calibration (the edges hand in the stored plans)
    ("plans",),  # stored plans and the estimate tasks
    ("runs",),  # training runs on nodes, their progress and checkpoints
    ("quotes",),  # priced quotes of a plan
    ("workers",),  # Celery app and task bindings (an edge)
    ("api",),  # HTTP edge: deps, errors, limits, and every domain's endpoints.py
    ("dashboard",),  # server-rendered pages over the API's deps
    ("app",),  # services/api/app.py: the composition root that mounts the API and the dashboard
    ("agent", "sdk"),  # the node agent and the Python client
    ("cli",),  # the command line, over everything
)
RANK = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}

# Upward imports that stay, (importer, imported) by module name, each with its reason. Keep it short.
ALLOWED: dict[tuple[str, str], str] = {}


def unit_of(module: str) -> str:
    """The layer unit of a module: its package, except the HTTP edge files that live in domain folders."""
    parts = module.split(".")
    if parts[0] == "workers":
        return "workers"
    if module == "services.api.app":
        return "app"
    if len(parts) >= 3 and parts[2] == "endpoints":
        # Polar's shape: each domain keeps its routes beside its service, but they are the HTTP edge.
        return "api"
    if module == "services.sdk":
        return "sdk"
    return parts[1] if len(parts) > 1 else "core"


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    path: Path
    line: int

    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def modules() -> dict[str, Path]:
    found = {}
    for root in SOURCES:
        for path in sorted((ROOT / root).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def imports_of(name: str, path: Path, known: dict[str, Path]) -> Iterator[Import]:
    """Every import of a module named in ``known``, at any depth of the file."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            # `from pkg import mod` imports the module; `from pkg import name` the package.
            submodules = [f"{source}.{alias.name}" for alias in node.names if f"{source}.{alias.name}" in known]
            targets = submodules if len(submodules) == len(node.names) else [source, *submodules]
        for target in targets:
            if target in known and target != name:
                yield Import(name, target, path, node.lineno)


def graph() -> list[Import]:
    known = modules()
    return [imp for name, path in known.items() for imp in imports_of(name, path, known)]


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One circle (as a path a -> ... -> a) per strongly connected component of more than one node."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm; the graphs are small enough for recursion
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return [_loop(edges, component) for component in components]


def _loop(edges: dict[str, set[str]], component: set[str]) -> list[str]:
    """The shortest path from the component's first node back to itself, inside the component."""
    start = min(component)
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        v = queue.popleft()
        for w in sorted(edges.get(v, ()) & component):
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [start, *reversed(path[:-1]), start] if len(path) > 1 else [start, v, start]
            if w not in came_from:
                came_from[w] = v
                queue.append(w)
    return sorted(component)


def _describe(loop: list[str], where: dict[tuple[str, str], str]) -> str:
    return " -> ".join(loop) + " (" + ", ".join(where[(a, b)] for a, b in pairwise(loop)) + ")"


def test_every_package_has_a_layer() -> None:
    missing = sorted({unit_of(name) for name in modules()} - set(RANK))
    assert not missing, f"packages without a layer in LAYERS: {missing}"


def test_no_circle_between_modules() -> None:
    edges: dict[str, set[str]] = defaultdict(set)
    where: dict[tuple[str, str], str] = {}
    for imp in graph():
        edges[imp.importer].add(imp.imported)
        where.setdefault((imp.importer, imp.imported), imp.where())
    found = [_describe(loop, where) for loop in circles(edges)]
    assert not found, "import circles between modules:\n" + "\n".join(found)


def test_no_circle_between_packages() -> None:
    edges: dict[str, set[str]] = defaultdict(set)
    where: dict[tuple[str, str], str] = {}
    for imp in graph():
        a, b = unit_of(imp.importer), unit_of(imp.imported)
        if a != b:
            edges[a].add(b)
            where.setdefault((a, b), f"{imp.where()} {imp.importer} -> {imp.imported}")
    found = [_describe(loop, where) for loop in circles(edges)]
    assert not found, "import circles between packages:\n" + "\n".join(found)


def test_imports_point_down() -> None:
    upward = [
        f"{imp.where()}: {imp.importer} ({unit_of(imp.importer)}) imports {imp.imported} ({unit_of(imp.imported)})"
        for imp in graph()
        if RANK[unit_of(imp.imported)] > RANK[unit_of(imp.importer)] and (imp.importer, imp.imported) not in ALLOWED
    ]
    assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(upward)


def test_the_allow_list_is_short_and_current() -> None:
    current = {(imp.importer, imp.imported) for imp in graph()}
    stale = sorted(set(ALLOWED) - current)
    assert not stale, f"ALLOWED entries no import needs any more: {stale}"
    assert len(ALLOWED) <= 5, "ALLOWED is for exceptions; move the code instead"
