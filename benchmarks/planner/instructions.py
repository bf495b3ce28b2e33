"""Instructions per plan: the planner's work counted by Valgrind instead of timed, for changes too small to see
through a shared machine's noise.

benchmarks/planner/run.py times plans in CPU time, and on these shared 2-core machines its medians move by a
tenth or more from run to run and by up to half from machine to machine, so a change worth a few percent cannot be
judged by it. The instructions a plan executes hardly move: Valgrind's cachegrind tool counts them (its "I refs")
whatever else runs on the machine. For each of run.py's plans over its generated 5,000-offer catalog, a child
process builds the catalog, plans once, settles the collector (as the service and run.py do), then plans
``--plans`` more times; it runs twice under cachegrind, with none and with ``--plans`` plans after the first, and
the difference over ``--plans`` is one plan's instructions. The hash seed is fixed (PYTHONHASHSEED=0), so the
dicts and sets of both runs are laid out alike, and numpy runs one BLAS thread: then two runs of the same code
count the same instructions to a few in a billion.

Instructions are not time (a cache miss costs more than an addition), so the targets stay run.py's; this says
whether a change made a plan do less, and by how much. Run: ``python -m benchmarks.planner.instructions`` (needs
``valgrind``, about two minutes; prints the table, writes benchmarks/results/planner_instructions.json).

Where the work is: ``--functions N`` prints instead, per plan, the N Python functions that execute the most
bytecodes in one plan (traced with ``sys.settrace`` opcode events, no Valgrind): as exact as the count, and unlike
a sampling or timing profiler, not skewed by the machine or by the cost of measuring each call. Bytecodes leave
out the work inside C functions (numpy, dict lookups), so it says where the interpreter spends its steps.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import FrameType
from typing import Any

from benchmarks.planner.run import RESULTS, benchmark_cases, generated_catalog
from services.catalog.market import Market
from services.core import collector
from services.estimator.plan import Plan
from services.planner import plan_setups

PLANS = 10
_REFS = re.compile(r"I\s+refs:\s+([\d,]+)")


def instructions(output: str) -> int:
    """The instruction count cachegrind prints at exit ("I refs"), from its output."""
    found = _REFS.search(output)
    if found is None:
        raise ValueError("cachegrind printed no instruction count")
    return int(found.group(1).replace(",", ""))


def _settled(name: str) -> tuple[Plan, Market]:
    """run.py's plan ``name`` and its generated catalog, planned once (the catalog's columns and grouping, the plan's
    cached resolution), in a settled collector: what every counted plan starts from."""
    plan = benchmark_cases()[name]
    market = Market(generated_catalog())
    plan_setups(plan, market)
    collector.settle()
    return plan, market


def _child(name: str, plans: int) -> None:
    """The counted process: plan ``name`` ``plans`` times after the first."""
    plan, market = _settled(name)
    for _ in range(plans):
        plan_setups(plan, market)


def bytecodes_by_function(name: str) -> tuple[int, list[tuple[str, int, int]]]:
    """Bytecodes one plan of ``name`` executes (after a first plan and a settled collector), and per Python function
    (``file:line name``) its bytecodes and calls (a generator's resumptions count as calls), most first."""
    plan, market = _settled(name)
    ops: collections.Counter[Any] = collections.Counter()
    calls: collections.Counter[Any] = collections.Counter()

    def trace(frame: FrameType, event: str, arg: object) -> Any:
        if event == "opcode":
            ops[frame.f_code] += 1
        elif event == "call":
            frame.f_trace_opcodes = True
            calls[frame.f_code] += 1
        return trace

    previous = sys.gettrace()  # a coverage tracer, say: put back after
    sys.settrace(trace)
    try:
        plan_setups(plan, market)
    finally:
        sys.settrace(previous)
    rows = [
        (f"{Path(code.co_filename).name}:{code.co_firstlineno} {code.co_name}", count, calls[code])
        for code, count in ops.most_common()
    ]
    return sum(ops.values()), rows


def _counted(name: str, plans: int) -> int:
    """Instructions of a child that plans ``name`` ``plans`` times after the first, under cachegrind."""
    command = [
        "valgrind",
        "--tool=cachegrind",
        "--cache-sim=no",
        "--cachegrind-out-file=/dev/null",
        sys.executable,
        "-m",
        "benchmarks.planner.instructions",
        "--child",
        name,
        "--plans",
        str(plans),
    ]
    # One BLAS thread: numpy's idle BLAS threads spin, and Valgrind counts their spinning (with them, one count
    # moved by 3% between identical runs; without, by a few instructions).
    env = {**os.environ, "PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False, timeout=900)
    if done.returncode != 0:
        last = done.stderr.strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"the counted process for {name} failed: {last[0]}")
    return instructions(done.stderr)


def _valgrind_version() -> str:
    done = subprocess.run(["valgrind", "--version"], capture_output=True, text=True, check=False)
    return done.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.planner.instructions", description=__doc__)
    parser.add_argument("--plans", type=int, default=PLANS, help="plans counted after the first (default 10)")
    parser.add_argument("--only", default="", help="comma-separated plan names of run.py (default: all)")
    parser.add_argument(
        "--functions", type=int, default=0, help="print the N functions that execute the most bytecodes instead"
    )
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    names = list(benchmark_cases())
    if args.child:  # the counted process: plans after the first, none for the baseline
        if args.child not in names or args.plans < 0:
            print(f"--child: not a plan of run.py with --plans of 0 or more: {args.child}", file=sys.stderr)
            return 2
        _child(args.child, args.plans)
        return 0
    if args.plans < 1:
        print("--plans: at least 1", file=sys.stderr)
        return 2
    chosen = [n for n in args.only.split(",") if n] or names
    unknown = [n for n in chosen if n not in names]
    if unknown:
        print(f"--only: not plans of run.py: {', '.join(unknown)} (plans: {', '.join(names)})", file=sys.stderr)
        return 2
    if args.functions < 0:
        print("--functions: 0 or more", file=sys.stderr)
        return 2
    if args.functions:
        for name in chosen:
            total, functions = bytecodes_by_function(name)
            print(f"{name}@generated_5000: {total:,} bytecodes in one plan")
            for where, count, called in functions[: args.functions]:
                print(f"{100 * count / total:6.2f}% {count:9,} bytecodes {called:7,} calls  {where}")
        return 0
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (apt-get install -y valgrind)", file=sys.stderr)
        return 2
    rows: dict[str, object] = {}
    for name in chosen:
        try:
            baseline, counted = _counted(name, 0), _counted(name, args.plans)
        except (RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
            print(exc, file=sys.stderr)
            return 1
        per_plan = (counted - baseline) / args.plans
        rows[f"{name}@generated_5000"] = {"instructions_per_plan": round(per_plan), "plans": args.plans}
        print(f"{name + '@generated_5000':38} {per_plan / 1e6:8.1f} M instructions per plan")
    rows["_machine"] = {
        "valgrind": _valgrind_version(),
        "python": platform.python_version(),
        "hash_seed": 0,
        "blas_threads": 1,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "planner_instructions.json").write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
