"""Re-planning for the format asked for, instead of refusing a plan sized for another framework or sharding.

A format runs one framework (target.FORMAT_FRAMEWORK) and only some sharding modes; the framework's
defaults (loss chunking, adapter dtype, accumulation) and the sharding change the memory. So an export to
another format is sized again:

1. :func:`retarget_plan`: the plan with the format's framework (and, for the deepspeed export, a ZeRO
   stage: ZeRO-2 for an unsharded plan, ZeRO-3 for FSDP, which shards the same states).
2. The caller's planner runs on that plan (:func:`setup_for_format` takes it as a function, so the API
   plans over the live catalog and the CLI over the bundled price lists).
3. :func:`fit_setup`: a setup whose sharding the format cannot run is moved to the nearest one it can
   (deepspeed: none -> zero2, fsdp -> zero3; torchtune: 1 GPU unsharded, several GPUs FSDP), its memory
   estimated again on the same card and checked against the usable memory.

Every step says what it changed; the notes head the exported files.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from services.catalog.gpus import GpuSpec, find_gpu
from services.estimator.estimate import estimate
from services.estimator.fit import usable_card_bytes
from services.estimator.padding import pads_to_longest_of_known_mean
from services.estimator.plan import Plan, Sharding
from services.estimator.recipe import resolve_recipe
from services.estimator.resolved import ResolvedPlan, resolve_plan
from services.estimator.versions import RELEASES
from services.export.dataset import DataFormat
from services.export.errors import ExportError
from services.export.export import export_setup
from services.export.models import ExportBundle, Format
from services.export.target import FORMAT_FRAMEWORK, accumulation_for, apply_setup, check_format, rebuild
from services.planner.batching import BatchSplit, batch_split, effective_batch_size, largest_fitting_micro_batch
from services.planner.constraints import Constraints
from services.planner.evaluator import Evaluator
from services.planner.models import Recommendation

_ZERO = ("zero1", "zero2", "zero3")


@dataclass(frozen=True)
class Retargeted:
    """The plan and setup to export, what re-planning changed (empty: nothing), and the plan as resolved once
    (services.estimator.resolved; None: the export resolves it)."""

    plan: Plan
    setup: Recommendation
    notes: tuple[str, ...]
    resolved: ResolvedPlan | None = None


def format_sharding(fmt: Format, sharding: str, gpus: int) -> Sharding | None:
    """The sharding ``fmt`` runs in place of ``sharding`` on ``gpus`` GPUs (None: keep it)."""
    if fmt == "deepspeed" and sharding not in _ZERO:
        return "zero3" if sharding == "fsdp" else "zero2"
    if fmt == "torchtune":
        wanted: Sharding = "none" if gpus == 1 else "fsdp"
        return wanted if sharding != wanted else None
    return None


def plan_on_gpus(plan: Plan, gpus: int, spec: GpuSpec | None = None, fmt: str | None = None) -> tuple[Plan, list[str]]:
    """``plan`` laid out on ``gpus`` GPUs of the same kind as the planner lays it out there; the changes as sentences.

    The batch: the planner's split for that count (services/planner/batching.py ``batch_split``), which keeps
    the plan's effective batch (micro-batch x accumulation x GPUs) or, where the GPUs cannot split it evenly,
    takes the smallest larger one, as the planner's setups do. Every sharding the plans name (none, ZeRO, FSDP)
    is data parallel over all the GPUs, so the count is the data-parallel size. The micro-batch is the one the
    planner picks for that layout on ``spec`` (:func:`fitting_micro_batch`: the largest of the split that fits
    the card, the plan's sharding, checkpointing and offload kept, sized as ``fmt`` runs it), so the files run
    the setup the planner would price there. Without ``spec``, or where no micro-batch of the split fits, the
    plan's micro-batch is kept where it divides the samples per GPU, else the largest that does below it (the
    export's peak check then decides).

    The sharding: the plan's on several GPUs; none on one, except with ``cpu_offload``, which keeps the plan's
    ZeRO or FSDP: the estimator refuses offload without it (services/estimator/plan.py), the trainers offload
    only through it, and both run on one GPU (DeepSpeed's ZeRO-Offload and FSDP's CPU offload under a
    distributed launch of one process, the launchers' single-GPU sharded case); the planner's one-GPU
    options drop none the same way when offloading (services/planner/layouts.py ``sharding_options``).
    """
    if gpus == plan.gpus:
        return plan, []
    effective = effective_batch_size(plan)
    split = batch_split(effective, gpus)
    kept = max(m for m in split.micro_batch_sizes if m <= plan.micro_batch_size)
    sharding = plan.sharding if gpus > 1 or plan.cpu_offload else "none"
    moved = _split_plan(plan, gpus, sharding, split, kept)
    micro = kept
    fitting = fitting_micro_batch(moved, split, spec, fmt, effective) if spec is not None else None
    if fitting is not None and fitting != kept:
        micro = fitting
        moved = _split_plan(plan, gpus, sharding, split, micro)
    steps = split.accumulation_steps(micro)
    label = "GPU" if gpus == 1 else "GPUs"
    was = f"{plan.micro_batch_size} x {plan.gradient_accumulation_steps or 1} x {plan.gpus}"
    notes = [
        f"--gpus {gpus}: micro-batch {micro} x {steps} accumulation {'step' if steps == 1 else 'steps'} x {gpus} "
        f"{label} = effective batch {split.effective_batch_size} (the plan: {was} = {effective})"
    ]
    if spec is not None and micro != kept:
        notes.append(
            f"--gpus {gpus}: micro-batch {micro}, the largest of the split that fits {gpus} x {spec.name} (as the "
            "planner picks it for this layout)"
        )
    if split.effective_batch_size != effective:
        notes.append(
            f"effective batch {split.effective_batch_size} instead of the plan's {effective}: {effective} "
            f"{'sample does' if effective == 1 else 'samples do'} not split evenly over {gpus} {label} (the "
            "planner takes the smallest larger batch the GPUs reach)"
        )
    if sharding != plan.sharding:
        notes.append(f"--gpus {gpus}: sharding {plan.sharding} -> {sharding} (one GPU has nothing to shard)")
    elif gpus == 1 and sharding != "none":
        notes.append(f"--gpus 1: sharding {sharding} kept: the plan offloads to the CPU, which runs only under it")
    return moved, notes


def _split_plan(plan: Plan, gpus: int, sharding: Sharding, split: BatchSplit, micro: int) -> Plan:
    """``plan`` on ``gpus`` GPUs under ``sharding`` with micro-batch ``micro`` of ``split`` (validated again)."""
    steps = split.accumulation_steps(micro)
    # A null accumulation counts one step (effective_batch_size) and stays null where one step is the split:
    # retarget_plan then writes the framework's default as it would for the plan's own count.
    accumulation = None if plan.gradient_accumulation_steps is None and steps == 1 else steps
    return rebuild(
        plan,
        {"gpus": gpus, "sharding": sharding, "micro_batch_size": micro, "gradient_accumulation_steps": accumulation},
        field="gpus",
    )


def fitting_micro_batch(
    plan: Plan, split: BatchSplit, spec: GpuSpec, fmt: str | None = None, effective_batch: int | None = None
) -> int | None:
    """The micro-batch of ``split`` the planner picks for ``plan``'s layout on ``spec``: the largest whose peak,
    sized with the planner's headroom, fits the card (services/planner/batching.py ``largest_fitting_micro_batch``,
    the rule services/planner/search.py ``fitting_configs`` applies per sharding and checkpointing), with the
    plan's sharding, checkpointing, offload and optimizer. ``fmt``: size it as that format runs the plan (its
    framework and sharding, :func:`retarget_plan`). None where no micro-batch of the split fits, or where the
    plan has no architecture to size (a generic model, which no export writes)."""
    if plan.model.generic is not None:
        return None
    sized = retarget_plan(plan, fmt, effective_batch)[0] if fmt is not None else plan
    resolved = resolve_plan(sized)
    evaluator = Evaluator(resolved.plan, resolved.architecture, recipe=resolved.recipe)
    return largest_fitting_micro_batch(
        evaluator,
        split,
        resolved.plan.sharding,
        resolved.plan.gradient_checkpointing,
        usable_card_bytes(spec.memory_gib, Constraints().safety_margin),
        resolved.plan.cpu_offload,
    )


def retarget_plan(plan: Plan, fmt: str, effective_batch: int | None = None) -> tuple[Plan, list[str]]:
    """``plan`` with the framework ``fmt`` runs (and a sharding it can express); the changes as sentences.

    ``effective_batch`` (default: the plan's) is the batch a derived accumulation keeps, for a caller that
    moved the plan to another GPU count.
    """
    known = check_format(fmt)
    changes: list[str] = []
    fields: dict[str, object] = {}
    framework = FORMAT_FRAMEWORK[known]
    if plan.framework != framework:
        fields["framework"] = framework
        changes.append(
            f"re-planned for {known}: the plan was sized with {plan.framework}'s defaults, the {known} export runs "
            f"{framework} (its loss, adapter dtype and accumulation defaults)"
        )
        if plan.framework_version is not None:
            # The release named is of the old framework's package: it says nothing of the new one's.
            fields["framework_version"] = None
            changes.append(
                f"framework_version {plan.framework_version} -> null: it names a {RELEASES[plan.framework][0]} "
                f"release, the {known} files pin {RELEASES[framework][0]}'s tested release"
            )
    sharding = format_sharding(known, plan.sharding, plan.gpus)
    if sharding == "none" and plan.cpu_offload:
        # torchtune on one GPU: offload needs sharding (the estimator's rule), which its single-device recipes lack.
        raise ExportError(
            "cpu_offload", "torchtune's single-device recipes do not offload to the CPU; plan with more GPUs"
        )
    if sharding is not None:
        fields["sharding"] = sharding
        changes.append(f"re-planned for {known}: sharding {plan.sharding} -> {sharding} (what {known} runs)")
    if plan.padding is None:
        run = plan.model_copy(update=fields)
        if pads_to_longest_of_known_mean(run, resolve_recipe(run)):
            # Every format's files pack the samples into rows of seq_len (train.py, torchtune's packed dataset,
            # axolotl's sample_packing): priced with the framework's default padding to the longest sample, the
            # setup's time and cost counted pad tokens the files never train on (the peak is sized on full rows
            # either way), and the planner's pick could be another card's.
            fields["padding"] = "packed"
            changes.append(
                f"re-planned for {known}: padding null -> packed: the {known} files pack the samples into rows of "
                f"seq_len {plan.seq_len} ({framework}'s default pads each micro-batch to its longest sample), so "
                "time and cost count no pad tokens"
            )
    if plan.gradient_accumulation_steps is None and resolve_recipe(plan.model_copy(update=fields)).grads_persist:
        # Null is the framework's default, which accumulates (the estimate keeps the gradients through the
        # step); the files need a number, so the plan takes the one that keeps its effective batch.
        steps = accumulation_for(plan, effective_batch)
        fields["gradient_accumulation_steps"] = steps
        kept = steps * plan.micro_batch_size * plan.gpus
        wanted = effective_batch if effective_batch is not None else effective_batch_size(plan)
        changes.append(
            f"gradient_accumulation_steps null -> {steps}: the {known} files need a number; micro-batch "
            f"{plan.micro_batch_size} x {steps} x {plan.gpus} GPU(s) = {kept} samples per step"
            + ("" if kept == wanted else f" (the smallest above the plan's {wanted} these GPUs reach)")
        )
    if not fields:
        return plan, []
    return rebuild(plan, fields, field="framework"), changes


def fit_setup(
    plan: Plan, setup: Recommendation, fmt: str, resolved: ResolvedPlan | None = None
) -> tuple[Recommendation, list[str]]:
    """``setup`` with a sharding ``fmt`` runs; its memory estimated again on the same card and checked
    (``resolved``: ``plan`` resolved once by the caller, whose architecture the estimate reuses).

    Raises ExportError when the moved setup no longer fits the card's usable memory. Time and cost stay
    the planner's (the note says so): the sharding change moves memory, the step time only a little.
    """
    known = check_format(fmt)
    sharding = format_sharding(known, setup.sharding, setup.gpus)
    if sharding is None:
        return setup, []
    if known == "torchtune" and setup.gpus == 1 and setup.cpu_offload:
        raise ExportError(
            "cpu_offload", "torchtune's single-device recipes do not offload to the CPU; plan with more GPUs"
        )
    if known == "deepspeed" and setup.cpu_offload and setup.optimizer != "adamw":
        # The writer refuses it too (ZeRO-Offload steps with DeepSpeed's CPU Adam): skip to the next setup. The
        # setup's optimizer is the one exported (the planner may have switched it).
        raise ExportError(
            "optimizer", f"{setup.optimizer!r}: ZeRO-Offload steps on the CPU with DeepSpeed's CPU Adam; only 'adamw'"
        )
    moved = setup.model_copy(update={"sharding": sharding})
    applied = apply_setup(plan, moved)
    peak_gib = estimate(
        resolved.variant(applied) if resolved is not None else applied, find_gpu(setup.gpu)
    ).memory.peak_device_gib
    if peak_gib > setup.usable_gib:
        raise ExportError(
            "sharding",
            f"{setup.gpus} x {setup.gpu} with {sharding} (what {known} runs in place of {setup.sharding}) needs "
            f"{peak_gib:.2f} GiB per GPU, more than the {setup.usable_gib:.2f} GiB usable",
        )
    note = (
        f"setup {setup.gpus} x {setup.gpu}: sharding {setup.sharding} -> {sharding} for {known}; peak "
        f"{setup.peak_gib_per_gpu:.2f} -> {peak_gib:.2f} GiB per GPU (time and cost are the planner's for "
        f"{setup.sharding})"
    )
    updated = moved.model_copy(update={"peak_gib_per_gpu": peak_gib, "headroom_gib": setup.gpu_memory_gib - peak_gib})
    return updated, [note]


def describe_setup(setup: Recommendation) -> str:
    """'1 x A40, zero2, micro-batch 4, checkpointing, 22.3 GiB of 45 GiB': the line the CLI prints."""
    checkpointing = ", checkpointing" if setup.gradient_checkpointing else ""
    offload = ", CPU offload" if setup.cpu_offload else ""
    return (
        f"{setup.gpus} x {setup.gpu}, {setup.sharding}{offload}, micro-batch {setup.micro_batch_size}{checkpointing}, "
        f"{setup.peak_gib_per_gpu:.1f} GiB of {setup.gpu_memory_gib:.0f} GiB"
    )


# Plan options no setup changes (the kernels, the NF4's double quantization, the framework's release, the roles
# adapted).
_SETUP_INDEPENDENT = ("kernels", "double_quant", "framework_version", "lora.targets")


def setup_for_format(
    plan: Plan | ResolvedPlan,
    fmt: str,
    planned: Sequence[Recommendation],
    replan: Callable[[Plan], Sequence[Recommendation]],
    index: int = 0,
) -> Retargeted:
    """The setup to export in ``fmt``: recommendation ``index`` of ``planned``, or of ``replan(plan')``
    when ``fmt`` needs another framework; the first one from there on that the format can run. ``plan`` may
    come resolved (services.estimator.resolved): the re-planned variants then keep its architecture."""
    resolved = plan if isinstance(plan, ResolvedPlan) else None
    plan = plan.plan if isinstance(plan, ResolvedPlan) else plan
    target_plan, notes = retarget_plan(plan, fmt)
    target_resolved = resolved.variant(target_plan) if resolved is not None else None
    # Another framework changes memory and speed, another padding the time and cost: the format's plan is planned again.
    replanned = target_plan.framework != plan.framework or target_plan.padding != plan.padding
    recs = list(replan(target_plan)) if replanned else list(planned)
    if index >= len(recs):
        raise ExportError(
            "recommendation",
            f"the plan has {len(recs)} recommendation(s) for {fmt}; use 0..{max(len(recs) - 1, 0)}",
        )
    reasons: list[str] = []
    refusals: list[ExportError] = []
    for rank, rec in enumerate(recs[index:], start=index):
        try:
            fitted, fit_notes = fit_setup(target_plan, rec, fmt, target_resolved)
            # The format's own checks (e.g. no bitsandbytes optimizer under torchtune's FSDP2 on several
            # GPUs) refuse a setup as surely as memory does: the next recommendation is tried.
            export_retargeted(Retargeted(target_plan, fitted, (), target_resolved), fmt)
        except ExportError as exc:
            reasons.append(f"#{rank} ({rec.gpus} x {rec.gpu}): {exc.message}")
            refusals.append(exc)
            continue
        if replanned and index < len(planned):
            was, now = describe_setup(planned[index]), describe_setup(fitted)
            fit_notes.insert(0, f"setup for {fmt}: {now} (" + ("unchanged)" if now == was else f"was {was})"))
        elif rank != index:
            fit_notes.insert(
                0, f"recommendation #{index} cannot run as {fmt}; exported #{rank}: {describe_setup(fitted)}"
            )
        # The plan's own sharding note is superseded by the setup's.
        kept = [n for n in notes if "sharding" not in n]
        return Retargeted(target_plan, fitted, (*kept, *fit_notes), target_resolved)
    for refusal in refusals:
        if refusal.field in _SETUP_INDEPENDENT:
            # A plan option the format cannot write refuses every setup that gets as far: name it, not sharding.
            raise ExportError(refusal.field, f"no recommended setup can run as {fmt}: {refusal.message}")
    raise ExportError("sharding", f"no recommended setup can run as {fmt}: {'; '.join(reasons)}")


def export_retargeted(chosen: Retargeted, fmt: str, data: DataFormat | None = None) -> ExportBundle:
    """The files of the setup :func:`setup_for_format` chose, headed by what re-planning changed and the
    planner's notes on the setup (offload and host RAM, effective batch, stale prices, spot risk), word for
    word as the plan page and the quote show them."""
    rec = chosen.setup
    notes = (*chosen.notes, *(n for n in rec.notes if n not in chosen.notes))
    return export_setup(
        chosen.plan,
        rec,
        fmt,
        peak_gib_per_gpu=rec.peak_gib_per_gpu,
        gpu_memory_gib=rec.gpu_memory_gib,
        gpu=rec.gpu,
        data=data,
        replan_notes=notes,
        resolved=chosen.resolved,
    )
