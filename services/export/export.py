"""Export a planned setup as the files a user runs, and read exported files back into a plan.

``export_setup`` applies the setup (a planner Recommendation, or the plan as it is) and writes the format's
files, each headed by the predicted peak memory per GPU, the headroom and the start command. A plan
setting the format cannot express raises :class:`ExportError` naming it, rather than a config that would
train with different memory. ``read_back`` parses the files (JSON / YAML against pydantic models of the
expected keys, and launch.sh for the process count) into a plan whose memory estimate equals the
exported one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from services.estimator.architecture import Architecture
from services.estimator.estimate import resolve_architecture
from services.estimator.plan import Plan
from services.estimator.resolved import ResolvedPlan
from services.export.axolotl import export_axolotl, read_axolotl
from services.export.dataset import DataFormat
from services.export.models import Built, ExportBundle, Format
from services.export.resume import RESUME_FILE, resume_script
from services.export.target import Target, check_format, rebuild, resolve_target
from services.export.torchtune import export_torchtune, read_torchtune
from services.export.trainer_formats import (
    export_accelerate,
    export_deepspeed,
    export_hf_trainer,
    read_accelerate,
    read_deepspeed,
    read_hf_trainer,
)
from services.export.versions import CHECK_FILE, REQUIREMENTS_FILE, check_script, needs, requirements_text
from services.planner.models import Recommendation

_EXPORTERS: dict[Format, Callable[[Target], Built]] = {
    "hf-trainer": export_hf_trainer,
    "accelerate": export_accelerate,
    "deepspeed": export_deepspeed,
    "torchtune": export_torchtune,
    "axolotl": export_axolotl,
}
_READERS: dict[Format, Callable[[Mapping[str, str], Architecture], dict[str, Any]]] = {
    "hf-trainer": read_hf_trainer,
    "accelerate": read_accelerate,
    "deepspeed": read_deepspeed,
    "torchtune": read_torchtune,
    "axolotl": read_axolotl,
}


def export_setup(
    plan: Plan,
    setup: Recommendation | None,
    fmt: str,
    *,
    peak_gib_per_gpu: float,
    gpu_memory_gib: float,
    gpu: str,
    checkpoint_interval_s: float | None = None,
    step_seconds: float | None = None,
    data: DataFormat | None = None,
    replan_notes: Sequence[str] = (),
    resolved: ResolvedPlan | None = None,
) -> ExportBundle:
    """The files that run ``plan`` on ``setup`` (None: the plan's own GPUs, sharding and batch) in ``fmt``.

    ``step_seconds`` is the time of one optimizer step (all accumulated micro-batches); with
    ``checkpoint_interval_s`` it sets the save/eval steps. A Recommendation supplies both when omitted.
    ``data`` is the row format of the training data (None: plain text); ``replan_notes`` say what
    re-planning for the format changed (services/export/replan.py) and head every file. ``resolved``:
    ``plan`` resolved once by the caller (services.estimator.resolved), not resolved again.
    """
    target = resolve_target(
        plan,
        setup,
        fmt,
        peak_gib_per_gpu=peak_gib_per_gpu,
        gpu_memory_gib=gpu_memory_gib,
        gpu=gpu,
        checkpoint_interval_s=checkpoint_interval_s,
        step_seconds=step_seconds,
        data=data,
        replan_notes=tuple(replan_notes),
        resolved=resolved,
    )
    needs(target)  # refuses a framework_version the files cannot run with before anything is written
    built = _EXPORTERS[target.fmt](target)
    files = {
        **built.files,
        REQUIREMENTS_FILE: requirements_text(target),
        CHECK_FILE: check_script(target),
        RESUME_FILE: resume_script(),
    }
    notes = [*replan_notes, target.data.describe(), *built.notes]
    return ExportBundle(format=target.fmt, files=files, command=built.command, notes=notes)


def read_back(fmt: str, files: Mapping[str, str], base_plan: Plan) -> Plan:
    """The plan the exported ``files`` run; ``base_plan`` supplies what they do not carry (model, data)."""
    known = check_format(fmt)
    _, arch = resolve_architecture(base_plan)
    return rebuild(base_plan, _READERS[known](files, arch))
