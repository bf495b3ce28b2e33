"""The trace against the analytic estimate over a generated sweep (benchmarks/sweep/configs.py).

For each config: the trace's allocated peak (MemTracker over one real transformers/PEFT step under fake
tensors), the same step's storages replayed through benchmarks/mechanisms/allocator.py's model of the
caching allocator (its allocated and reserved peaks), and the analytic estimate's allocated peak
(services/estimator, the counter ``torch.cuda.max_memory_allocated`` reads). A config whose trace takes
longer than the per-config limit is skipped and recorded as such.

Run: ``python -m benchmarks.sweep.run`` (traces; needs the trace extra; writes benchmarks/results/sweep.json
and sweep.md); ``python -m benchmarks.sweep.run --report`` rewrites sweep.md from sweep.json;
``--only gemma-2-2b`` re-traces the configs whose id contains it and puts their rows into sweep.json in place
of the cached ones.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from benchmarks.sweep.configs import SweepConfig, sweep_configs
from benchmarks.sweep.report import THRESHOLD_PCT, write_report

RESULTS = Path(__file__).resolve().parents[1] / "results"
PER_CONFIG_SECONDS = 60
GIB = 2**30


class _TimeLimit(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise _TimeLimit


def plan_of(config: SweepConfig) -> Any:
    from services.catalog.models import find_model
    from services.estimator.plan import Plan
    from services.trace.tracer import with_layers

    model = find_model(config.model)
    cut = with_layers(dict(model.config), config.layers)
    name = f"{model.hf_id.split('/')[-1]}-{config.layers}-layers"
    return Plan.model_validate({**config.plan, "model": {"name": name, "config": cut}})


def head_copy_gib(plan: Any) -> float:
    """The output head's 16-bit autocast copy (GiB), for the report's frozen-weight check."""
    from services.estimator.estimate import resolve_architecture
    from services.estimator.recipe import resolve_recipe

    _, arch = resolve_architecture(plan)
    recipe = resolve_recipe(plan)
    if recipe.weight_bytes == recipe.compute_bytes:
        return 0.0
    return round(arch.lm_head_matmul_params * recipe.compute_bytes / GIB, 3)


def run_config(config: SweepConfig, limit_s: int = PER_CONFIG_SECONDS) -> dict[str, Any]:
    """One config's row: the trace's, the replay's and the analytic allocated peaks (GiB), or why none."""
    from benchmarks.mechanisms.allocator import CachingAllocator, _recorder
    from services.estimator.estimate import resolve_architecture
    from services.estimator.memory import peak_memory
    from services.estimator.recipe import resolve_recipe
    from services.trace.tracer import trace_plan

    row: dict[str, Any] = {"id": config.id, "model": config.model, "layers": config.layers, **config.plan}
    plan = plan_of(config)
    recorder = _recorder()
    start = time.perf_counter()
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(limit_s)
    try:
        result = trace_plan(plan, recorder=recorder)
    except _TimeLimit:
        row.update(status="skipped", reason=f"trace over {limit_s} s")
        return row
    except Exception as exc:  # any failure of the real model code is a finding to record
        row.update(status="error", reason=f"{type(exc).__name__}: {str(exc)[:300]}")
        return row
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        row["seconds"] = round(time.perf_counter() - start, 1)
    recorder.poll()
    allocator = CachingAllocator().replay(recorder.events)
    _, arch = resolve_architecture(plan)
    memory = peak_memory(plan, arch, resolve_recipe(plan))
    trace, analytic = result.peak_allocated_gib, result.analytic_peak_allocated_gib
    difference = result.breakdown.get("analytic_difference", 0.0)
    replay = allocator.peak_allocated / GIB + difference
    row.update(
        status="ok",
        trace_gib=trace,
        replay_allocated_gib=round(replay, 3),
        replay_reserved_gib=round(allocator.peak_reserved / GIB + difference, 3),
        analytic_gib=analytic,
        diff_pct=round((trace - analytic) / analytic * 100, 2),
        replay_diff_pct=round((replay - analytic) / analytic * 100, 2),
        trace_breakdown=result.breakdown,
        analytic_moment=memory.peak_moment,
        analytic_components={k: round(v / GIB, 3) for k, v in memory.components.items()},
        head_copy_gib=head_copy_gib(plan),
        notes=result.notes[1:],
    )
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--report", action="store_true", help="rewrite sweep.md from sweep.json, no tracing")
    parser.add_argument("--limit", type=int, default=None, help="trace only the first N configs")
    parser.add_argument("--only", default=None, help="trace only configs whose id contains this")
    parser.add_argument("--per-config-seconds", type=int, default=PER_CONFIG_SECONDS)
    args = parser.parse_args(argv)
    cache = RESULTS / "sweep.json"
    if args.report:
        write_report(json.loads(cache.read_text(encoding="utf-8")), RESULTS / "sweep.md")
        return 0
    warnings.filterwarnings("ignore")
    import logging

    logging.getLogger("transformers").setLevel(logging.ERROR)
    configs = sweep_configs()
    if args.only:
        configs = [c for c in configs if args.only in c.id]
    if args.limit:
        configs = configs[: args.limit]
    rows = []
    start = time.perf_counter()
    for config in configs:
        row = run_config(config, args.per_config_seconds)
        rows.append(row)
        if row["status"] == "ok":
            flag = " <-" if abs(row["diff_pct"]) > THRESHOLD_PCT else ""
            print(
                f"{row['id']:32} trace {row['trace_gib']:7.3f} replay {row['replay_allocated_gib']:7.3f} "
                f"analytic {row['analytic_gib']:7.3f} GiB {row['diff_pct']:+6.1f}% {row['seconds']:5.1f} s{flag}",
                flush=True,
            )
        else:
            print(f"{row['id']:32} {row['status']}: {row['reason']}", flush=True)
    data = {"configs": len(configs), "seconds": round(time.perf_counter() - start), "rows": rows}
    if args.only and not args.limit and cache.exists():
        # A subset re-traced: its rows replace theirs in the cached sweep, the rest stay as they were.
        data = merged_rows(json.loads(cache.read_text(encoding="utf-8")), rows)
    elif args.only or args.limit:
        return 0
    RESULTS.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    write_report(data, RESULTS / "sweep.md")
    return 0


def merged_rows(cached: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The cached sweep with ``rows`` in place of the cached rows of the same config ids (the run time is the
    full sweep's)."""
    fresh = {row["id"]: row for row in rows}
    merged = [fresh.pop(row["id"], row) for row in cached["rows"]]
    return {**cached, "rows": merged + list(fresh.values())}


if __name__ == "__main__":
    sys.exit(main())
