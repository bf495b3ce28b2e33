"""What Python's cyclic garbage collector costs a plan, at CPython's default young-generation threshold and at
the one a settled gpuplan process uses (services.core.collector.YOUNG_GENERATION_THRESHOLD).

For each of benchmarks/planner/run.py's plans over its generated 5,000-offer catalog (held as a serving process
holds it: a Market, frozen out of collections), it counts the collections of each generation per plan and the
CPU time spent in them (gc.callbacks), with the median CPU time of a whole plan. The two thresholds alternate
round by round, so drift on a shared machine falls on both alike.

Run: ``python -m benchmarks.planner.collector`` (prints the table; writes benchmarks/results/planner_collector.json).
"""

from __future__ import annotations

import gc
import json
import statistics
import time
from collections import Counter, defaultdict
from typing import Any

from benchmarks.planner.run import RESULTS, benchmark_cases, generated_catalog
from services.catalog.market import Market
from services.core.collector import YOUNG_GENERATION_THRESHOLD
from services.planner import plan_setups

ROUNDS = 5
REPEAT = 5
DEFAULT_YOUNG = 700  # CPython's default (gc.get_threshold()[0] in a fresh interpreter)


class _Clock:
    """Collections per generation and the CPU seconds spent in them, from gc.callbacks."""

    def __init__(self) -> None:
        self.count: Counter[int] = Counter()
        self.seconds: defaultdict[int, float] = defaultdict(float)
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.process_time()
        else:
            self.count[info["generation"]] += 1
            self.seconds[info["generation"]] += time.process_time() - self._start


def main() -> int:
    plans = benchmark_cases()
    market = Market(generated_catalog())
    for plan in plans.values():
        plan_setups(plan, market)
    gc.collect()
    gc.freeze()
    middle, oldest = gc.get_threshold()[1:]
    thresholds = {"default": DEFAULT_YOUNG, "settled": YOUNG_GENERATION_THRESHOLD}
    cpu: dict[tuple[str, str], list[float]] = {}
    clocks = {(name, which): _Clock() for name in plans for which in thresholds}
    for _ in range(ROUNDS):
        for which, young in thresholds.items():
            gc.set_threshold(young, middle, oldest)
            for name, plan in plans.items():
                clock = clocks[(name, which)]
                gc.callbacks.append(clock)
                times = []
                for _ in range(REPEAT):
                    start = time.process_time()
                    plan_setups(plan, market)
                    times.append(time.process_time() - start)
                gc.callbacks.remove(clock)
                cpu.setdefault((name, which), []).append(statistics.median(times))
    runs = ROUNDS * REPEAT
    rows: dict[str, Any] = {}
    for name in plans:
        row: dict[str, Any] = {}
        for which, young in thresholds.items():
            clock = clocks[(name, which)]
            row[which] = {
                "young_threshold": young,
                "collections_per_plan": {str(g): round(clock.count[g] / runs, 2) for g in range(3)},
                "collector_cpu_ms_per_plan": round(sum(clock.seconds.values()) / runs * 1e3, 3),
                "plan_median_cpu_ms": round(statistics.median(cpu[(name, which)]) * 1e3, 3),
            }
        rows[name] = row
        d, s = row["default"], row["settled"]
        print(
            f"{name:20} default: {d['plan_median_cpu_ms']:6.1f} ms, collector {d['collector_cpu_ms_per_plan']:5.2f} ms "
            f"{d['collections_per_plan']} | settled: {s['plan_median_cpu_ms']:6.1f} ms, collector "
            f"{s['collector_cpu_ms_per_plan']:5.2f} ms {s['collections_per_plan']}"
        )
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "planner_collector.json").write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
