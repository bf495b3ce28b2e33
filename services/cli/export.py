"""`gpuplan export`: ready-to-run training configs for a plan's setup."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from services.catalog.gpus import find_gpu
from services.cli.common import CliError, Subparsers, int_arg, read_plan_file
from services.cli.estimate import with_hub_model
from services.estimator.estimate import estimate
from services.estimator.padding import run_samples
from services.estimator.plan import Plan
from services.estimator.recipe import resolve_recipe
from services.estimator.validation import parse_plan
from services.export import FORMATS, ExportBundle, export_setup
from services.export.dataset import DATA_KINDS, DEFAULT_DATA, DataFormat, data_format
from services.export.replan import (
    describe_setup,
    export_retargeted,
    plan_on_gpus,
    retarget_plan,
    setup_for_format,
)
from services.planner.batching import effective_batch_size
from services.planner.models import Recommendation
from services.planner.rejections import lacks_precision


def register(sub: Subparsers) -> None:
    export = sub.add_parser(
        "export",
        help="ready-to-run training configs for a plan's setup",
        description="Write the training files of the planner's cheapest setup (or of --gpu/--gpus) in a format. A plan "
        "sized for another framework or a sharding the format cannot run is planned again for the format; the "
        "changes are printed.",
    )
    export.add_argument("--plan", metavar="FILE", required=True, help="plan JSON")
    export.add_argument("--format", required=True, choices=list(FORMATS))
    export.add_argument("--gpu", metavar="NAME", help="the card; without it the planner picks the cheapest setup")
    # The plan's own bounds on gpus (services.estimator.plan.Plan): the count is set on an already checked plan, so
    # -1 was exported as "-1 x H100" and 0 fell back to the plan's count, both with exit status 0.
    export.add_argument(
        "--gpus", type=int_arg("--gpus", 1, 65536), metavar="N", help="GPUs of that card (default: the plan's)"
    )
    export.add_argument(
        "--data-format",
        choices=list(DATA_KINDS),
        help="the rows of train.jsonl: chat (messages), sharegpt (conversations), alpaca, dolly, prompt_completion, "
        "text (default)",
    )
    export.add_argument("--out", metavar="DIR", help="write the files into DIR (new or empty) instead of printing")
    export.set_defaults(handler=cmd_export)


def _on_card(plan: Plan, fmt: str, gpu: str, gpus: int | None, data: DataFormat) -> tuple[ExportBundle, str]:
    """The export of ``plan`` on ``gpus`` x ``gpu``, sized again for the format."""
    spec = find_gpu(gpu)
    if lacks_precision(plan, spec):  # the planner rejects such a card; the files failed when the Trainer started
        raise CliError(
            f"--gpu {spec.name}: it has no bf16 support, so the trainers refuse the plan's {plan.precision}; plan "
            "with precision fp16 (or fp16-mixed), or another card"
        )
    count = gpus or plan.gpus
    effective = effective_batch_size(plan)
    # The planner's batch split, micro-batch and sharding for that count on the card (the plan's effective batch
    # kept), validated again.
    moved_plan, moved = plan_on_gpus(plan, count, spec, fmt)
    target, notes = retarget_plan(moved_plan, fmt, effective)
    if gpus is not None:
        _refuse_short_run(plan, target, gpus)
    plan = moved_plan
    report = estimate(target, spec)
    peak = report.memory.peak_device_gib
    if notes:
        before = estimate(plan, spec).memory.peak_device_gib
        notes.append(f"peak on {count} x {spec.name}: {before:.2f} -> {peak:.2f} GiB per GPU")
    notes[:0] = moved
    bundle = export_setup(
        target,
        None,
        fmt,
        peak_gib_per_gpu=peak,
        gpu_memory_gib=spec.memory_gib,
        gpu=spec.name,
        data=data,
        replan_notes=notes,
    )
    # The line describe_setup prints for a planned setup: the micro-batch the files run with it.
    offload = ", CPU offload" if target.cpu_offload else ""
    checkpointing = ", checkpointing" if target.gradient_checkpointing else ""
    return bundle, (
        f"{count} x {spec.name}, {target.sharding}{offload}, micro-batch {target.micro_batch_size}{checkpointing}, "
        f"{peak:.1f} GiB of {spec.memory_gib:.0f} GiB"
    )


def _refuse_short_run(plan: Plan, target: Plan, gpus: int) -> None:
    """``--gpus`` that take the optimizer step (of ``target``, the plan moved to them as the format runs it) past
    every sample the run trains, where the plan's step fit in them, refused: the files would never make a step
    (65,536 GPUs on 10,000 examples were exported)."""
    samples = run_samples(target, resolve_recipe(target))
    step = target.effective_batch_size
    if samples is not None and plan.effective_batch_size <= samples < step:
        raise CliError(
            f"--gpus {gpus}: one optimizer step would take {step:,} samples, more than the {samples:,.0f} the run "
            f"trains in all (the plan's step takes {plan.effective_batch_size:,}); use fewer GPUs"
        )


def _planned(plan: Plan, fmt: str, data: DataFormat) -> tuple[ExportBundle, str]:
    """The export of the planner's cheapest setup, planned again for the format when it needs it."""
    if plan.data is None:
        raise CliError("give --gpu NAME (and --gpus N), or a data set in the plan so the planner can pick the setup")
    from services.cli.catalog import cli_offers
    from services.planner import plan_setups

    offers = cli_offers()

    def replan(p: Plan) -> list[Recommendation]:
        return plan_setups(p, offers=offers).recommendations

    planned = replan(plan)
    if not planned:
        raise CliError("no setup in the catalog fits this plan; see `gpuplan estimate` for its memory")
    chosen = setup_for_format(plan, fmt, planned, replan)
    bundle = export_retargeted(chosen, fmt, data)
    return bundle, f"the planner's cheapest setup: {describe_setup(chosen.setup)}"


def _write_files(out: Path, files: dict[str, str]) -> None:
    """Write the export's files into ``out`` (new or empty); a failure part-way removes what this call wrote, so no
    half-written export (a train.py without its launch.sh) is left."""
    created = not out.exists()
    written: list[Path] = []
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            written.append(out / name)
            written[-1].write_text(text, encoding="utf-8")
        (out / "launch.sh").chmod(0o755)
    except BaseException:
        for path in written:
            path.unlink(missing_ok=True)
        if created and out.is_dir():
            out.rmdir()
        raise


def cmd_export(args: argparse.Namespace) -> int:
    plan, _ = with_hub_model(parse_plan(read_plan_file(args.plan)))
    data = data_format(args.data_format, "--data-format") if args.data_format else DEFAULT_DATA
    if args.gpu is not None:  # --gpu "" is a card name to check, not "let the planner pick"
        bundle, setup = _on_card(plan, args.format, args.gpu, args.gpus, data)
    else:
        if args.gpus:
            raise CliError("--gpus needs --gpu NAME (without --gpu the planner picks the card and the count)")
        bundle, setup = _planned(plan, args.format, data)
    if args.out is not None:
        if not args.out.strip():  # an empty --out printed the files instead, exit 0
            raise CliError(f"--out: no directory named (got {args.out!r})")
        out = Path(args.out)
        try:
            taken = out.exists() and (not out.is_dir() or any(out.iterdir()))
        except OSError as exc:  # a name the system refuses (too long, say): one line, not a traceback
            raise CliError(f"--out {args.out[:200]}: cannot use it ({exc.strerror or exc})") from None
        if taken:
            raise CliError(f"--out {args.out}: must be a new or empty directory (nothing is overwritten)")
        try:
            _write_files(out, bundle.files)
        except OSError as exc:  # a parent that is a file, no permission, a full disk: one line, not a traceback
            raise CliError(f"--out {args.out}: cannot write ({exc.strerror or exc})") from None
        print(f"{bundle.format}: {setup}")
        print(f"wrote {', '.join(sorted(bundle.files))} to {out}; start with: {bundle.command}")
    else:
        for name, text in bundle.files.items():
            print(f"===== {name} =====\n{text.rstrip()}\n")
        print(f"# {bundle.format}: {setup}")
        print(f"# start training with: {bundle.command}")
    for note in bundle.notes:
        print(f"# note: {note}", file=sys.stderr)
    return 0
