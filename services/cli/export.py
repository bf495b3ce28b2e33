"""`gpuplan export`: ready-to-run training configs for a plan's setup."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from services.catalog.gpus import find_gpu
from services.cli.common import CliError, Subparsers, int_arg, read_plan_file
from services.estimator.estimate import estimate
from services.estimator.validation import parse_plan
from services.export import FORMATS, export_setup


def register(sub: Subparsers) -> None:
    export = sub.add_parser("export", help="ready-to-run training configs for a plan's setup")
    export.add_argument("--plan", metavar="FILE", required=True, help="plan JSON")
    export.add_argument("--format", required=True, choices=list(FORMATS))
    export.add_argument("--gpu", metavar="NAME", help="the card; without it the planner picks the cheapest setup")
    export.add_argument("--gpus", type=int_arg("--gpus"), metavar="N", help="GPUs of that card (default: the plan's)")
    export.add_argument("--out", metavar="DIR", help="write the files into DIR (new or empty) instead of printing")
    export.set_defaults(handler=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    plan = parse_plan(read_plan_file(args.plan))
    if args.gpu:
        spec = find_gpu(args.gpu)
        gpus = args.gpus or plan.gpus
        if gpus != plan.gpus:
            plan = plan.model_copy(update={"gpus": gpus, "sharding": plan.sharding if gpus > 1 else "none"})
        report = estimate(plan, spec)
        bundle = export_setup(
            plan,
            None,
            args.format,
            peak_gib_per_gpu=report.memory.peak_device_gib,
            gpu_memory_gib=spec.memory_gib,
            gpu=spec.name,
        )
    else:
        if plan.data is None:
            raise CliError(
                "give --gpu NAME (and --gpus N), or a data set in the plan so the planner can pick the setup"
            )
        from services.cli.catalog import cli_offers
        from services.planner import plan_setups

        result = plan_setups(plan, offers=cli_offers())
        if not result.recommendations:
            raise CliError("no setup in the catalog fits this plan; see `gpuplan estimate` for its memory")
        rec = result.recommendations[0]
        bundle = export_setup(
            plan,
            rec,
            args.format,
            peak_gib_per_gpu=rec.peak_gib_per_gpu,
            gpu_memory_gib=rec.gpu_memory_gib,
            gpu=rec.gpu,
        )
    if args.out:
        out = Path(args.out)
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise CliError(f"--out {args.out}: must be a new or empty directory (nothing is overwritten)")
        out.mkdir(parents=True, exist_ok=True)
        for name, text in bundle.files.items():
            (out / name).write_text(text, encoding="utf-8")
        print(f"wrote {', '.join(sorted(bundle.files))} to {out}; start with: {bundle.command}")
    else:
        for name, text in bundle.files.items():
            print(f"===== {name} =====\n{text.rstrip()}\n")
        print(f"# start training with: {bundle.command}")
    for note in bundle.notes:
        print(f"# note: {note}", file=sys.stderr)
    return 0
