"""The setup to export: the plan with the chosen setup applied and checked, its node shape and checkpoint steps.

Rules every format shares:

- A format runs one framework (``FORMAT_FRAMEWORK``). The estimate depends on the plan's framework (its
  loss, adapter dtype, accumulation defaults), so a plan sized for another framework is refused here
  rather than exported with different memory; the CLI and the API size it again for the format first
  (services/export/replan.py).
- Only training plans with an architecture (a catalog name or a config.json) are exported: the LoRA
  module names and the memory checks need the layers.
- A plan setting the format cannot write is accepted only when leaving it to the framework's default
  gives the very same memory breakdown (:func:`require_default`); otherwise it is refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from services.catalog.models import find_model
from services.estimator.architecture import Architecture
from services.estimator.errors import EstimatorError
from services.estimator.estimate import resolve_architecture
from services.estimator.memory import MemoryBreakdown, peak_memory
from services.estimator.plan import Framework, Plan
from services.estimator.recipe import Recipe, resolve_recipe
from services.estimator.resolved import ResolvedPlan
from services.estimator.throughput import GPUS_PER_NODE
from services.export.dataset import DEFAULT_DATA, DataFormat
from services.export.errors import ExportError
from services.export.models import FORMATS, Format
from services.planner.batching import effective_batch_size, samples_per_gpu
from services.planner.models import Recommendation

FORMAT_FRAMEWORK: dict[Format, Framework] = {
    "hf-trainer": "hf-trainer",
    "accelerate": "hf-trainer",  # accelerate launches the generated Trainer script
    "deepspeed": "hf-trainer",  # the ZeRO config drives the generated Trainer script
    "torchtune": "torchtune",
    "axolotl": "axolotl",
}
SHARDINGS = ("none", "zero1", "zero2", "zero3", "fsdp")


@dataclass(frozen=True)
class Target:
    """Everything an exporter needs: the plan as it will run, where, and what it was sized for."""

    fmt: Format
    plan: Plan
    arch: Architecture
    # The applied plan's recipe, resolved once here: every exporter reads the framework's behaviour from it.
    recipe: Recipe
    model_id: str
    gpu: str
    gpus_per_node: int
    nodes: int
    peak_gib_per_gpu: float
    gpu_memory_gib: float
    save_steps: int | None
    checkpoint_interval_s: float | None
    data: DataFormat
    # What re-planning for this format changed (services/export/replan.py); empty when nothing did.
    replan_notes: tuple[str, ...] = ()

    @property
    def headroom_gib(self) -> float:
        return self.gpu_memory_gib - self.peak_gib_per_gpu


def check_format(fmt: str) -> Format:
    """``fmt`` as a known format name, or an ExportError listing them."""
    for known in FORMATS:
        if fmt == known:
            return known
    raise ExportError("format", f"unknown format {fmt!r}; allowed: {', '.join(FORMATS)}")


def apply_setup(plan: Plan, setup: Recommendation | None) -> Plan:
    """The plan with the setup's GPUs, sharding, offload, optimizer, batch split and checkpointing (validated again).

    The optimizer too: with ``constraints.allow_optimizer_change`` the planner fits a setup by switching adamw
    to an 8-bit optimizer (services/planner/search.py), and the setup's memory and price assume that one. A setup
    stored before it named its optimizer (the field then defaults to adamw) keeps the plan's.
    """
    if setup is None:
        return plan
    if setup.sharding not in SHARDINGS:
        raise ExportError("setup.sharding", f"{setup.sharding!r} is not a sharding; allowed: {', '.join(SHARDINGS)}")
    return rebuild(
        plan,
        {
            "gpus": setup.gpus,
            "sharding": setup.sharding,
            "cpu_offload": setup.cpu_offload,
            "optimizer": setup.optimizer if "optimizer" in setup.model_fields_set else plan.optimizer,
            "micro_batch_size": setup.micro_batch_size,
            "gradient_accumulation_steps": setup.gradient_accumulation_steps,
            "gradient_checkpointing": setup.gradient_checkpointing,
        },
        field="setup",
    )


def rebuild(base: Plan, fields: dict[str, Any], *, field: str = "files") -> Plan:
    """``base`` with ``fields`` replaced, through the Plan validators; a rejected combination names ``field``,
    or the plan's own setting that conflicts with the new values (kernels 'unsloth' re-planned for axolotl):
    that is the one the caller can change."""
    data = base.model_dump()
    data.update(fields)
    try:
        return Plan.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'plan'}: {e['msg'].removeprefix('Value error, ')}" for e in errors
        )
        located = errors[0]["loc"][:1]
        named = str(located[0]) if located and located[0] in data and located[0] not in fields else field
        raise ExportError(named, f"the settings do not form a valid plan: {problems}") from exc


def node_shape(plan: Plan, setup: Recommendation | None) -> tuple[int, int]:
    """(GPUs per node, nodes): the setup's, else one node up to 8 GPUs and whole nodes of 8 above."""
    if setup is not None:
        if setup.gpus_per_node * setup.nodes != setup.gpus:
            raise ExportError(
                "setup.nodes",
                f"{setup.nodes} nodes x {setup.gpus_per_node} GPUs is not the setup's {setup.gpus} GPUs",
            )
        return setup.gpus_per_node, setup.nodes
    if plan.gpus <= GPUS_PER_NODE:
        return plan.gpus, 1
    if plan.gpus % GPUS_PER_NODE:
        raise ExportError(
            "gpus",
            f"{plan.gpus} GPUs do not fill whole nodes of {GPUS_PER_NODE}; give a multiple of {GPUS_PER_NODE} "
            "or export a planner Recommendation, which carries its node shape",
        )
    return GPUS_PER_NODE, plan.gpus // GPUS_PER_NODE


def optimizer_step_seconds(setup: Recommendation | None, plan: Plan, given: float | None) -> float | None:
    """Seconds per optimizer step: as given, else the setup's tokens per step over its tokens/s."""
    if given is not None:
        if not given > 0:
            raise ExportError("step_seconds", f"must be positive seconds per optimizer step, got {given}")
        return given
    if setup is None or setup.tokens_per_s <= 0:
        return None
    tokens_per_step = plan.micro_batch_size * (plan.gradient_accumulation_steps or 1) * plan.gpus * plan.seq_len
    return tokens_per_step / setup.tokens_per_s


def checkpoint_steps(interval_s: float | None, step_seconds: float | None) -> int | None:
    """Optimizer steps between checkpoints: the interval over the step time, rounded down (at least 1).

    Rounding down keeps checkpoints at least as frequent as the interval the spot cost assumed.
    """
    if interval_s is None:
        return None
    if not interval_s > 0:
        raise ExportError("checkpoint_interval_s", f"must be positive seconds, got {interval_s}")
    if step_seconds is None:
        raise ExportError(
            "step_seconds",
            "needed to turn checkpoint_interval_s into steps: give the seconds per optimizer step "
            "(or export a Recommendation, whose tokens/s gives it)",
        )
    return max(1, math.floor(interval_s / step_seconds))


def model_id_of(plan: Plan) -> str:
    """The HF id the exported files load: the catalog's id for a catalog name, else the name given."""
    spec = plan.model
    if spec.name is not None:
        if spec.config is not None:
            return spec.name
        try:
            return find_model(spec.name).hf_id
        except EstimatorError:
            return spec.name
    name = spec.config.get("_name_or_path") if spec.config is not None else None
    if isinstance(name, str) and name:
        return name
    raise ExportError("model.name", "the exported files load the model by its HF id: give model.name")


def check_plan(plan: Plan, fmt: Format) -> None:
    """Refuse what no format exports: inference plans, generic models, another framework's plan."""
    if not plan.is_training:
        raise ExportError("mode", f"exports start training runs: mode must be 'train', got {plan.mode!r}")
    if plan.model.generic is not None:
        raise ExportError(
            "model.generic",
            "a generic model has no architecture to name LoRA modules or check memory; give model.name or model.config",
        )
    if plan.lora is not None and plan.lora.targets == []:
        # The estimate sizes a frozen base with no adapter (how prompt-tuning cases are modelled); PEFT refuses
        # target_modules=[] when train.py starts, which the files were written with.
        raise ExportError("lora.targets", "no layer is adapted (an empty list); name the roles, or 'all-linear'")
    wanted = FORMAT_FRAMEWORK[fmt]
    if plan.framework != wanted:
        raise ExportError(
            "framework",
            f"the plan was sized with {plan.framework}'s defaults, but the {fmt} export runs {wanted}, whose "
            f"defaults (loss, adapter dtype, accumulation) give different memory; set framework to {wanted!r} "
            "and plan again",
        )


def check_memory_numbers(peak_gib_per_gpu: float, gpu_memory_gib: float, gpu: str) -> None:
    if not gpu.strip():
        raise ExportError("gpu", "give the GPU name the setup was sized for")
    if not gpu_memory_gib > 0:
        raise ExportError("gpu_memory_gib", f"must be positive GiB, got {gpu_memory_gib}")
    if not peak_gib_per_gpu > 0:
        raise ExportError("peak_gib_per_gpu", f"must be positive GiB, got {peak_gib_per_gpu}")
    if peak_gib_per_gpu > gpu_memory_gib:
        raise ExportError(
            "peak_gib_per_gpu",
            f"{peak_gib_per_gpu} GiB exceeds the {gpu_memory_gib} GiB of {gpu}: the setup does not fit",
        )


def resolve_target(
    plan: Plan,
    setup: Recommendation | None,
    fmt: str,
    *,
    peak_gib_per_gpu: float,
    gpu_memory_gib: float,
    gpu: str,
    checkpoint_interval_s: float | None,
    step_seconds: float | None,
    data: DataFormat | None = None,
    replan_notes: tuple[str, ...] = (),
    resolved: ResolvedPlan | None = None,
) -> Target:
    """Apply the setup, check what every format needs, and work out nodes and checkpoint steps.

    ``resolved``: ``plan`` as the caller resolved it already (its architecture and model id are reused)."""
    known = check_format(fmt)
    check_memory_numbers(peak_gib_per_gpu, gpu_memory_gib, gpu)
    if setup is not None and setup.gpu != gpu:
        raise ExportError("gpu", f"{gpu!r} is not the setup's card {setup.gpu!r}")
    applied = apply_setup(plan, setup)
    check_plan(applied, known)
    if resolved is not None:
        arch = resolved.architecture
        # A bundled model's name resolved to its catalog id, which is what model_id_of looks up.
        by_name = applied.model.config is None and applied.model.name is not None
        model_id = resolved.name if by_name else model_id_of(applied)
    else:
        _, arch = resolve_architecture(applied)
        model_id = model_id_of(applied)
    # The caller's recipe holds while the setup changed nothing; GPUs or sharding can change its defaults.
    recipe = resolved.recipe if resolved is not None and applied == resolved.plan else resolve_recipe(applied)
    gpus_per_node, nodes = node_shape(applied, setup)
    interval = checkpoint_interval_s
    if interval is None and setup is not None and setup.checkpoint_interval_minutes is not None:
        interval = setup.checkpoint_interval_minutes * 60.0
    steps = checkpoint_steps(interval, optimizer_step_seconds(setup, applied, step_seconds) if interval else None)
    return Target(
        fmt=known,
        plan=applied,
        arch=arch,
        recipe=recipe,
        model_id=model_id,
        gpu=gpu,
        gpus_per_node=gpus_per_node,
        nodes=nodes,
        peak_gib_per_gpu=peak_gib_per_gpu,
        gpu_memory_gib=gpu_memory_gib,
        save_steps=steps,
        checkpoint_interval_s=interval,
        data=data if data is not None else DEFAULT_DATA,
        replan_notes=replan_notes,
    )


def memory_of(plan: Plan, arch: Architecture) -> MemoryBreakdown:
    """The estimator's memory breakdown of ``plan`` under its framework's defaults."""
    return peak_memory(plan, arch, resolve_recipe(plan))


def require_default(target: Target, field: str, why: str) -> None:
    """Refuse ``field`` unless leaving it to the framework default gives the same memory breakdown."""
    value = getattr(target.plan, field)
    if value is None:
        return
    without = target.plan.model_copy(update={field: None})
    if memory_of(without, target.arch) != memory_of(target.plan, target.arch):
        raise ExportError(
            field,
            f"{value!r}: {why}; leave it null (the framework's default) or pick a format that can set it",
        )


def accumulation_for(plan: Plan, effective_batch: int | None = None) -> int:
    """Micro-batches per optimizer step that keep an effective batch (default: the plan's) on the plan's GPUs.

    The effective batch over micro-batch x GPUs, rounded up as the planner rounds (services/planner/
    batching.py: an uneven split takes the smallest larger batch); a plan without accumulation counts one
    there (``effective_batch_size``). ``effective_batch`` is for a caller that changed the GPU count.
    """
    effective = effective_batch if effective_batch is not None else effective_batch_size(plan)
    per_gpu = samples_per_gpu(effective, plan.gpus)
    return max(1, -(-per_gpu // plan.micro_batch_size))


def require_accumulation(target: Target) -> int:
    """The accumulation steps to write: the plan's, else the ones that keep its effective batch."""
    steps = target.plan.gradient_accumulation_steps
    return steps if steps is not None else accumulation_for(target.plan)
