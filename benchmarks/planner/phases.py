"""Where a plan's CPU time goes, phase by phase: what issue 24's remaining planner targets are judged against.

For each of benchmarks/planner/run.py's plans over its generated 5,000-offer catalog (held as a serving process
holds it: a Market whose columns and grouping earlier plans read, in a settled collector), it times the phases of
``services.planner.plan_setups`` by wrapping the functions that make them, for the length of the measurement:

- grouping: the offers grouped by card and node shape, and the cards the plan cannot run rejected
  (``scan._group_offers``);
- search: what fits on each group and how fast (the rest of ``scan.scan_offers``);
- bounds: every (offer, setup, pricing)'s lower bound of its cost as arrays (``scan._bounds``);
- ranking: entries priced in full in bound order and put in rank order (``ranking.rank_entries``);
- rejections: the memory and host RAM rejections (``planner._rejections``);
- results: the rest of the plan (its context, the recommendations' notes, the answer), and freeing what the
  search built when the plan returns (its memos, setups and groups).

Each phase is the median over rounds of its CPU time in one plan (time.process_time), so the phases need not add
up to the plan's median exactly. Run: ``python -m benchmarks.planner.phases`` (prints the table; writes
benchmarks/results/planner_phases.json).
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from benchmarks.planner.run import RESULTS, benchmark_cases, generated_catalog
from services.catalog.market import Market
from services.core import collector
from services.estimator.plan import Plan
from services.planner import planner, scan

ROUNDS = 15
# The functions timed: (module, attribute, phase).
_TIMED: tuple[tuple[Any, str, str], ...] = (
    (scan, "_group_offers", "grouping"),
    (scan, "_bounds", "bounds"),
    (planner, "scan_offers", "scan"),
    (planner, "rank_entries", "ranking"),
    (planner, "_rejections", "rejections"),
)
PHASES = ("grouping", "search", "bounds", "ranking", "rejections", "results")


@contextmanager
def _timed(spent: dict[str, float]) -> Iterator[None]:
    """The functions of ``_TIMED`` adding their CPU seconds to ``spent`` by phase, put back on exit."""

    def wrap(fn: Callable[..., Any], phase: str) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[phase] = spent.get(phase, 0.0) + time.process_time() - start

        return timed

    originals = [(module, name, getattr(module, name)) for module, name, _ in _TIMED]
    try:
        for (module, name, phase), (_, _, fn) in zip(_TIMED, originals, strict=True):
            setattr(module, name, wrap(fn, phase))
        yield
    finally:
        for module, name, fn in originals:
            setattr(module, name, fn)


def plan_phases(plan: Plan, market: Market, rounds: int = ROUNDS) -> dict[str, float]:
    """Median CPU ms of each phase of ``plan`` over ``market`` and of the whole plan (``total``)."""
    planner.plan_setups(plan, market)  # the market's columns and grouping, the plan's cached resolution
    per_round: dict[str, list[float]] = {phase: [] for phase in (*PHASES, "total")}
    for _ in range(rounds):
        spent: dict[str, float] = {}
        with _timed(spent):
            start = time.process_time()
            planner.plan_setups(plan, market)
            total = time.process_time() - start
        scanned = spent.get("scan", 0.0)
        phases = {
            "grouping": spent.get("grouping", 0.0),
            "search": scanned - spent.get("grouping", 0.0) - spent.get("bounds", 0.0),
            "bounds": spent.get("bounds", 0.0),
            "ranking": spent.get("ranking", 0.0),
            "rejections": spent.get("rejections", 0.0),
            "results": total - scanned - spent.get("ranking", 0.0) - spent.get("rejections", 0.0),
            "total": total,
        }
        for phase, seconds in phases.items():
            per_round[phase].append(seconds)
    return {phase: round(statistics.median(values) * 1e3, 3) for phase, values in per_round.items()}


def main() -> int:
    market = Market(generated_catalog())
    collector.settle()
    rows = {name: plan_phases(plan, market) for name, plan in benchmark_cases().items()}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "planner_phases.json").write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    print(f"{'plan (5,000 offers), median CPU ms':36}" + "".join(f"{p:>11}" for p in (*PHASES, "total")))
    for name, row in rows.items():
        print(f"{name:36}" + "".join(f"{row[p]:11.2f}" for p in (*PHASES, "total")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
