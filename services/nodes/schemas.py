from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, field_validator

from services.core.json_limits import INT32_MAX
from services.core.request_models import ClosedModel, SingleLine, UtcDatetime
from services.nodes.idle import HEARTBEAT_INTERVAL_S


class _In(ClosedModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _node_name(value: Any) -> Any:
    """A node's name without the spaces around it (trimmed before its length is checked); one of spaces alone,
    registered and listed as '   ', names no node (a fuzz)."""
    if isinstance(value, str):
        value = value.strip()
        if not value:
            raise ValueError("must not be blank: give the node a name (the agent's default is the host name)")
    return value


class NodeRegistration(_In):
    name: Annotated[SingleLine, BeforeValidator(_node_name)] = Field(min_length=1, max_length=100)
    gpu: SingleLine = Field(min_length=1, max_length=100, description="GPU model ('A100 80GB', ...) or 'cpu'")
    gpu_count: StrictInt = Field(default=1, ge=0, le=64)
    gpu_memory_gib: StrictFloat = Field(default=0.0, ge=0, le=10_000)
    driver: SingleLine = Field(default="", max_length=50)
    cuda: SingleLine = Field(default="", max_length=50)
    provider: SingleLine = Field(default="", max_length=100)
    usd_per_hour: StrictFloat | None = Field(default=None, ge=0, le=100_000)
    instance_id: SingleLine = Field(default="", max_length=200, description="the provider's id of this machine")
    hostname: SingleLine = Field(default="", max_length=255)
    agent_pid: StrictInt | None = Field(default=None, ge=1, le=2**31 - 1)
    nvml_gpu: SingleLine = Field(
        default="",
        max_length=100,
        description="the GPU name NVML reports ('' when it cannot tell); calibrations are trusted only when it "
        "names the node's GPU",
    )


class GpuStatus(_In):
    """One GPU as NVML reads it; null figures: NVML could not read this GPU, whose state is unknown (busy)."""

    index: StrictInt = Field(ge=0, le=64)
    utilisation_pct: StrictFloat | None = Field(
        ge=0, le=100, description="null: unreadable (NVML failed); the node is kept while any GPU is"
    )
    memory_used_gib: StrictFloat | None = Field(ge=0, le=10_000)
    memory_total_gib: StrictFloat | None = Field(ge=0, le=10_000)


class RunProgress(_In):
    run_id: str = Field(min_length=1, max_length=64)
    step: StrictInt | None = Field(default=None, ge=0, le=INT32_MAX)  # runs.progress_step
    loss: StrictFloat | None = Field(default=None, allow_inf_nan=False)


class SyncHealth(_In):
    """How the agent's checkpoint sync is doing (services/agent/node.py RunSync.health)."""

    last_error: str | None = Field(
        default=None, max_length=2000, description="the last sync pass's error; null when it succeeded"
    )
    pending_bytes: StrictInt = Field(
        default=0, ge=0, le=2**53 - 1, description="bytes of local checkpoints not durable yet"
    )
    failing_since: UtcDatetime | None = Field(
        default=None, description="when the passes began failing (the agent's clock; null when the last succeeded)"
    )


class Heartbeat(_In):
    gpus: list[GpuStatus] = Field(default_factory=list, max_length=64)
    job_running: StrictBool = False
    uploading: StrictBool = Field(default=False, description="a checkpoint upload is in progress")
    interactive_idle_s: StrictFloat | None = Field(
        default=None, ge=0, le=10**9, description="seconds since the most recently active interactive session"
    )
    unsynced_checkpoints: StrictInt = Field(
        default=0, ge=0, le=100_000, description="local checkpoints not yet durable"
    )
    progress: RunProgress | None = None
    sync: SyncHealth | None = Field(default=None, description="the run's checkpoint sync, when the agent syncs one")
    agent_pid: StrictInt | None = Field(
        default=None, ge=1, le=2**31 - 1, description="the agent's process id (the local driver signals it once proven)"
    )
    heartbeat_interval_s: StrictFloat = Field(
        default=HEARTBEAT_INTERVAL_S,
        gt=0,
        le=86_400,
        description="seconds the agent waits between heartbeats; a longer gap restarts the idle timer "
        "(services/nodes/idle.py cadence_gap_s)",
    )

    @field_validator("gpus")
    @classmethod
    def _each_gpu_once(cls, gpus: list[GpuStatus]) -> list[GpuStatus]:
        indices = [g.index for g in gpus]
        if len(set(indices)) != len(indices):
            raise ValueError("each GPU index once: a GPU reported twice hides another's state")
        return gpus


class CalibrationRequest(_In):
    plan_id: str = Field(min_length=1, max_length=64)
    warmup_steps: StrictInt = Field(default=2, ge=0, le=100)
    timed_steps: StrictInt = Field(default=5, ge=1, le=1000)


class CalibrationResult(_In):
    tokens_per_s: StrictFloat = Field(gt=0, le=1e9)
    peak_allocated_gib: StrictFloat | None = Field(default=None, ge=0, le=10_000)
    peak_reserved_gib: StrictFloat | None = Field(default=None, ge=0, le=10_000)
    seconds: StrictFloat = Field(ge=0, le=86_400)
    device: SingleLine = Field(default="", max_length=200)
    notes: list[Annotated[SingleLine, Field(max_length=500)]] = Field(default_factory=list, max_length=20)
    gpus: StrictInt = Field(
        default=1, ge=1, le=64, description="GPUs the measurement ran on (tokens_per_s is their total)"
    )
    comparable: StrictBool = Field(
        default=True,
        description="false: the node could not run the plan as planned (e.g. QLoRA without bitsandbytes); stored, "
        "never used to calibrate",
    )


class CalibrationFailure(_In):
    error: str = Field(min_length=1, max_length=2000)


class NodeOut(BaseModel):
    id: str
    name: str
    gpu: str
    gpu_count: int
    gpu_memory_gib: float
    driver: str
    cuda: str
    provider: str
    usd_per_hour: float | None
    created_at: datetime
    last_heartbeat_at: datetime | None
    gpus: list[dict[str, Any]]
    job_running: bool
    status: str
    instance_id: str
    run_id: str | None
    idle_minutes: float
    gpu_busy_pct: float
    uploading: bool
    interactive_idle_s: float | None
    unsynced_checkpoints: int
    idle_since: datetime | None
    last_decision: str | None
    last_reason: str | None
    last_decision_at: datetime | None
    stopped_at: datetime | None
    # The stop in progress (status stopping, or active and backing off, or stop_failed once given up).
    stop_attempts: int = Field(default=0, description="stop attempts of the current streak (reset when busy again)")
    next_stop_at: datetime | None = Field(default=None, description="a failed stop is not retried before this")
    last_stop_at: datetime | None = Field(default=None, description="when the last stop was sent")
    last_stop_answer: str | None = Field(default=None, description="what the provider (or the sweep) last answered")
    sync_error: str | None = Field(default=None, description="the agent's last sync pass failed with this")
    sync_failing_since: datetime | None = Field(default=None, description="sync passes have failed since then")
    sync_pending_bytes: int = Field(default=0, description="bytes of local checkpoints not durable yet")
    unsynced_since: datetime | None = Field(default=None, description="the node has held non-durable checkpoints since")
    sync_alert: str | None = Field(default=None, description="why the node's sync needs someone; null: healthy")
    agent_verified_at: datetime | None = None
    gpu_nvml: str = Field(default="", description="the GPU NVML reported at registration ('' : named by --gpu)")
    commands: list[str] = Field(default_factory=list, description="for the agent; delivered once")


class NodeRegistered(NodeOut):
    node_token: str = Field(
        description="the node's agent token, shown once: send it as X-Node-Token on every heartbeat and report"
    )


class NodeEventOut(BaseModel):
    id: str
    node_id: str
    run_id: str | None
    kind: str
    reason: str
    details: dict[str, Any]
    created_at: datetime


class CalibrationOut(BaseModel):
    id: str
    node_id: str
    plan_id: str
    status: str
    warmup_steps: int
    timed_steps: int
    error: str | None
    benchmark_id: str | None
    plan: dict[str, Any] | None = None  # the plan to run, for the agent


class BenchmarkOut(BaseModel):
    id: str
    node_id: str
    calibration_id: str
    gpu: str
    model_name: str
    method: str
    tokens_per_s: float
    peak_allocated_gib: float | None
    peak_reserved_gib: float | None
    mfu: float | None
    hardware_utilisation: float | None
    gemm_utilisation: float | None  # the utilisation that replaces the class prior (calibration rule)
    predicted_peak_allocated_gib: float | None
    predicted_tokens_per_s: float | None
    device: str
    measured_gpus: int = 1
    comparable: bool = True
    notes: list[str] = Field(default_factory=list)
    gpu_count: int = Field(default=0, description="the node's GPUs at registration (0: a CPU host)")
    verified: bool = Field(default=False, description="the measured device is the GPU NVML reported for the node")
    used: bool = Field(default=False, description="the organization's estimates use this result")
    unused_reason: str | None = Field(default=None, description="why they do not, when they do not")
    created_at: datetime


class NodeList(BaseModel):
    items: list[NodeOut]
    next_cursor: str | None = Field(default=None, description="pass as ?before= for the next page; null: the last")


class BenchmarkList(BaseModel):
    items: list[BenchmarkOut]
    next_cursor: str | None = Field(default=None, description="pass as ?before= for the next page; null: the last")
