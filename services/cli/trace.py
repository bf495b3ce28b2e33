"""`gpuplan trace`: one training step of the real model code under fake tensors (the trace extra)."""

from __future__ import annotations

import argparse
import dataclasses
import json

from services.cli.common import CliError, Subparsers, read_plan_file
from services.estimator.validation import parse_plan
from services.trace import INSTALL_HINT


def register(sub: Subparsers) -> None:
    trace = sub.add_parser(
        "trace", help="run one training step of the real model code under fake tensors (needs the trace extra)"
    )
    trace.add_argument("--plan", metavar="FILE", required=True, help="plan JSON")
    trace.add_argument("--json", action="store_true")
    trace.set_defaults(handler=cmd_trace)


def cmd_trace(args: argparse.Namespace) -> int:
    plan = parse_plan(read_plan_file(args.plan))
    try:
        from services.trace.tracer import TraceUnavailable, trace_plan
    except ImportError:
        raise CliError(f"the trace needs the trace extra: {INSTALL_HINT}") from None
    try:
        result = trace_plan(plan)
    except TraceUnavailable as exc:
        raise CliError(str(exc)) from None
    if args.json:
        print(json.dumps(dataclasses.asdict(result), indent=2))
    else:
        print(
            f"traced peak allocated {result.peak_allocated_gib:.2f} GiB, "
            f"analytic {result.analytic_peak_allocated_gib:.2f} GiB ({result.disagreement_pct:+.1f}%), "
            f"{result.seconds:.1f} s"
        )
        for key, value in sorted(result.breakdown.items(), key=lambda kv: -kv[1]):
            print(f"  {key:19} {value:8.2f} GiB")
        for note in result.notes:
            print(f"  - {note}")
    return 0
