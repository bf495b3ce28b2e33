"""The checkpoint schedule of a run (pure): how often to checkpoint, what to keep, where it goes.

The interval is Young's first-order optimum sqrt(2 x C x M) (Young 1974, CACM 17(9); Daly 2006 agrees
to first order while C << M), where C is the time to make a checkpoint durable (its size over the
measured upload bandwidth) and M is the mean time between interruptions of the whole job. On spot,
M comes from the preemption rate; on demand, from hardware failures: Meta's Llama 3 paper (Dubey et al.
2024, section 3.3.4) reports 419 unexpected interruptions in 54 days on 16,384 H100s, about 2e-5 per
GPU-hour. Without preemptions that optimum is days, so the interval is capped (``max_interval_s``):
a run should not lose hours to a bug, an operator error or a disk that dies.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny

from services.estimator.architecture import Architecture
from services.estimator.plan import Plan
from services.planner.spot import AWS_GPU_PREEMPTIONS_PER_NODE_HOUR, checkpoint_bytes, young_daly_interval_seconds

# Hardware interruptions per GPU-hour on demand (Llama 3 paper, see the module docstring).
FAILURES_PER_GPU_HOUR = 419 / (54 * 24 * 16_384)
# ASSUMPTION until the node measures it: sustained upload to object storage, 100 MB/s (10^6 B).
DEFAULT_UPLOAD_BYTES_PER_S = 100e6
DEFAULT_MAX_INTERVAL_S = 3600.0
MIN_INTERVAL_S = 60.0


class ScheduleInputs(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    upload_bytes_per_s: float = Field(default=DEFAULT_UPLOAD_BYTES_PER_S, gt=0)
    upload_measured: bool = False
    spot: bool = False
    # The sourced GPU-spot rate of services.planner.spot (SkyPilot's spot traces) when the run gives none.
    preemptions_per_node_hour: float = Field(default=AWS_GPU_PREEMPTIONS_PER_NODE_HOUR, ge=0.0, le=60.0)
    nodes: int = Field(default=1, ge=1)
    gpus: int = Field(default=1, ge=1)
    step_seconds: float | None = Field(default=None, gt=0)
    max_interval_s: float = Field(default=DEFAULT_MAX_INTERVAL_S, ge=MIN_INTERVAL_S)


class CheckpointSchedule(BaseModel):
    model_config = ConfigDict(frozen=True)

    checkpoint_bytes: float
    contents: str
    upload_bytes_per_s: float
    upload_measured: bool
    durable_seconds: float  # C: size / upload bandwidth
    interruptions_per_hour: float  # of the whole job
    mtbf_hours: float
    young_daly_interval_s: float
    interval_s: float
    interval_steps: int | None
    capped: bool
    formula: str
    # The run's retention policy (services.runs.retention.RetentionPolicy) and bucket layout
    # (services.runs.manifest.checkpoint_layout), handed in by the runs domain and carried as they are:
    # the planner sits below runs, so it names no runs type. SerializeAsAny dumps the policy's own fields.
    retention: SerializeAsAny[BaseModel]
    layout: str


def checkpoint_schedule(
    plan: Plan, arch: Architecture, inputs: ScheduleInputs, retention: BaseModel, layout: str
) -> CheckpointSchedule:
    size = checkpoint_bytes(plan, arch)
    durable_s = size / inputs.upload_bytes_per_s
    spot_rate = inputs.preemptions_per_node_hour * inputs.nodes
    rate = spot_rate if inputs.spot else FAILURES_PER_GPU_HOUR * inputs.gpus
    mtbf_s = 3600.0 / rate if rate > 0 else math.inf
    optimum = young_daly_interval_seconds(durable_s, mtbf_s) if math.isfinite(mtbf_s) else math.inf
    interval = min(max(optimum, MIN_INTERVAL_S), inputs.max_interval_s)
    capped = optimum > inputs.max_interval_s
    steps = max(1, round(interval / inputs.step_seconds)) if inputs.step_seconds else None
    contents = (
        "the full weights, fp32 master weights if any, and optimizer states"
        if plan.method == "full"
        else "the adapter in 16-bit and its optimizer states (the frozen base is not saved)"
    )
    formula = (
        f"Young/Daly: sqrt(2 x C x M) = sqrt(2 x {durable_s:.1f} s x {mtbf_s / 3600:.1f} h) = {optimum / 60:.1f} min"
        if math.isfinite(optimum)
        else "no interruptions expected: the interval is the cap"
    )
    if capped:
        formula += f"; capped at {inputs.max_interval_s / 60:.0f} min"
    elif optimum < MIN_INTERVAL_S:
        formula += f"; raised to the {MIN_INTERVAL_S:.0f} s minimum"
    return CheckpointSchedule(
        checkpoint_bytes=size,
        contents=contents,
        upload_bytes_per_s=inputs.upload_bytes_per_s,
        upload_measured=inputs.upload_measured,
        durable_seconds=durable_s,
        interruptions_per_hour=rate,
        mtbf_hours=mtbf_s / 3600.0,
        young_daly_interval_s=optimum,
        interval_s=interval,
        interval_steps=steps,
        capped=capped,
        formula=formula,
        retention=retention,
        layout=layout,
    )
