from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, Float, ForeignKey, Integer, String, Text
from sqlalchemy import false as sa_false
from sqlalchemy import true as sa_true
from sqlalchemy.orm import Mapped, mapped_column

from services.core.db import Base, IdMixin, TimestampMixin, UtcDateTime


class NodeRow(IdMixin, TimestampMixin, Base):
    """A GPU (or CPU-only) machine running `gpuplan agent`."""

    __tablename__ = "nodes"

    organization_id: Mapped[str] = mapped_column(ForeignKey("organizations.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(100))
    gpu: Mapped[str] = mapped_column(String(100))  # catalog GPU name, or "cpu"
    gpu_count: Mapped[int] = mapped_column(Integer)
    gpu_memory_gib: Mapped[float] = mapped_column(Float)
    driver: Mapped[str] = mapped_column(String(50))
    cuda: Mapped[str] = mapped_column(String(50))
    provider: Mapped[str] = mapped_column(String(100))
    usd_per_hour: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_heartbeat_at: Mapped[datetime | None] = mapped_column(UtcDateTime, default=None)
    gpus: Mapped[list[Any]] = mapped_column(JSON, default=list)  # per-GPU utilisation and memory
    job_running: Mapped[bool] = mapped_column(Boolean, default=False)
    # Lifecycle (services/nodes/lifecycle.py): active, stopping (a stop is with the provider), stopped,
    # stop_failed (the stop was given up after its retries), lost, replaced.
    status: Mapped[str] = mapped_column(String(16), default="active", server_default="active")
    instance_id: Mapped[str] = mapped_column(String(200), default="", server_default="")  # the provider's id
    hostname: Mapped[str] = mapped_column(String(255), default="", server_default="")
    agent_pid: Mapped[int | None] = mapped_column(Integer, default=None)
    run_id: Mapped[str | None] = mapped_column(String(32), default=None)
    # Idle policy, per node (a run sets it on its nodes).
    idle_minutes: Mapped[float] = mapped_column(Float, default=15.0, server_default="15")
    gpu_busy_pct: Mapped[float] = mapped_column(Float, default=10.0, server_default="10")
    # Busy signals from the last heartbeat.
    uploading: Mapped[bool] = mapped_column(Boolean, default=False, server_default=sa_false())
    interactive_idle_s: Mapped[float | None] = mapped_column(Float, default=None)
    unsynced_checkpoints: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    idle_since: Mapped[datetime | None] = mapped_column(UtcDateTime, default=None)
    # The seconds the agent declares between heartbeats: idle time accrues only across gaps its cadence allows.
    heartbeat_interval_s: Mapped[float] = mapped_column(Float, default=15.0, server_default="15")
    # The sweep's latest decision (an event is stored whenever it changes).
    last_decision: Mapped[str | None] = mapped_column(String(64), default=None)
    last_reason: Mapped[str | None] = mapped_column(Text, default=None)
    last_decision_at: Mapped[datetime | None] = mapped_column(UtcDateTime, default=None)
    stopped_at: Mapped[datetime | None] = mapped_column(UtcDateTime, default=None)
    # The stop in progress (services/nodes/lifecycle.py): attempts of the current streak (reset when the
    # node is busy again), when the next may be sent (exponential backoff), what the provider last
    # answered, and the lease of the sweep that holds the stop while the provider is called.
    stop_attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    next_stop_at: Mapped[datetime | None] = mapped_column(UtcDateTime, default=None)
    last_stop_at: Mapped[datetime | None] = mapped_column(UtcDateTime, default=None)
    last_stop_answer: Mapped[str | None] = mapped_column(Text, default=None)
    stop_lease_owner: Mapped[str | None] = mapped_column(String(200), default=None)
    stop_lease_expires_at: Mapped[datetime | None] = mapped_column(UtcDateTime, default=None)
    # The agent's checkpoint sync (services/nodes/lifecycle.py record_sync_health): the last pass's error and
    # since when passes fail, the bytes not durable yet and since when anything is, and the alert raised
    # (once per streak) when either lasts past its threshold.
    sync_error: Mapped[str | None] = mapped_column(Text, default=None)
    sync_failing_since: Mapped[datetime | None] = mapped_column(UtcDateTime, default=None)
    sync_pending_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    unsynced_since: Mapped[datetime | None] = mapped_column(UtcDateTime, default=None)
    sync_alert: Mapped[str | None] = mapped_column(Text, default=None)
    commands: Mapped[list[Any]] = mapped_column(JSON, default=list, server_default="[]")  # for the agent, e.g. ["sync"]
    # The node's agent token (issued once at registration, stored as its SHA-256) and when an agent
    # last proved it holds it. Nodes registered before tokens existed have none and must re-register.
    token_hash: Mapped[str | None] = mapped_column(String(64), default=None)
    agent_verified_at: Mapped[datetime | None] = mapped_column(UtcDateTime, default=None)
    # The agent's process as reported in a heartbeat authenticated with the node token (the pid in the
    # unauthenticated registration is never signalled), with its start time in clock ticks after boot
    # (/proc/<pid>/stat field 22) when the server shares the node's host: a reused pid does not match.
    verified_pid: Mapped[int | None] = mapped_column(Integer, default=None)
    verified_pid_start_ticks: Mapped[int | None] = mapped_column(BigInteger, default=None)

    # --- calibration (services/nodes/calibration.py) ---
    # The GPU NVML reported at registration ("" when it could not tell and the GPU was named by --gpu): a
    # calibration is trusted only when the device it measured is this GPU.
    gpu_nvml: Mapped[str] = mapped_column(String(100), default="", server_default="")


class NodeInstanceRow(IdMixin, TimestampMixin, Base):
    """Which organization a provider instance belongs to: the first to register it.

    The server stops every node through its one provider driver, so instance ids form one namespace (the
    driver's) and are unique across the table; another organization registering the same id gets a 409."""

    __tablename__ = "node_instances"

    organization_id: Mapped[str] = mapped_column(ForeignKey("organizations.id", ondelete="CASCADE"), index=True)
    instance_id: Mapped[str] = mapped_column(String(200), unique=True)
    provider: Mapped[str] = mapped_column(String(100))  # as the first registration named it


class NodeEventRow(IdMixin, TimestampMixin, Base):
    """A keep-alive or shutdown decision about a node, with its reason (the decisions log)."""

    __tablename__ = "node_events"

    organization_id: Mapped[str] = mapped_column(ForeignKey("organizations.id", ondelete="CASCADE"), index=True)
    node_id: Mapped[str] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"), index=True)
    run_id: Mapped[str | None] = mapped_column(String(32), default=None)
    kind: Mapped[str] = mapped_column(String(32))  # keep, stop, stop_failed, lost, back, sync_requested
    reason: Mapped[str] = mapped_column(Text)
    details: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class CalibrationRow(IdMixin, TimestampMixin, Base):
    """A short real training run of a plan on a node, to measure memory and speed."""

    __tablename__ = "calibrations"

    organization_id: Mapped[str] = mapped_column(ForeignKey("organizations.id", ondelete="CASCADE"), index=True)
    node_id: Mapped[str] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"), index=True)
    plan_id: Mapped[str] = mapped_column(ForeignKey("plans.id", ondelete="CASCADE"))
    status: Mapped[str] = mapped_column(String(16), default="queued")  # queued, running, done, failed
    warmup_steps: Mapped[int] = mapped_column(Integer)
    timed_steps: Mapped[int] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text, default=None)
    benchmark_id: Mapped[str | None] = mapped_column(String(32), default=None)
    started_at: Mapped[datetime | None] = mapped_column(UtcDateTime, default=None)
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime, default=None)


class BenchmarkRow(IdMixin, TimestampMixin, Base):
    """What a calibration measured, beside what gpuplan predicted for the same plan and card."""

    __tablename__ = "benchmark_results"

    organization_id: Mapped[str] = mapped_column(ForeignKey("organizations.id", ondelete="CASCADE"), index=True)
    node_id: Mapped[str] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"), index=True)
    calibration_id: Mapped[str] = mapped_column(String(32))
    gpu: Mapped[str] = mapped_column(String(100), index=True)
    model_name: Mapped[str] = mapped_column(String(200))
    method: Mapped[str] = mapped_column(String(16))
    plan: Mapped[dict[str, Any]] = mapped_column(JSON)
    peak_allocated_gib: Mapped[float | None] = mapped_column(Float, nullable=True)
    peak_reserved_gib: Mapped[float | None] = mapped_column(Float, nullable=True)
    tokens_per_s: Mapped[float] = mapped_column(Float)
    mfu: Mapped[float | None] = mapped_column(Float, nullable=True)
    hardware_utilisation: Mapped[float | None] = mapped_column(Float, nullable=True)
    # The large-GEMM utilisation at which the estimate of the measured plan meets the measured tokens/s (its
    # other terms charged as estimates charge them): what replaces the class prior (services/nodes/calibration.py).
    gemm_utilisation: Mapped[float | None] = mapped_column(Float, nullable=True)
    predicted_peak_allocated_gib: Mapped[float | None] = mapped_column(Float, nullable=True)
    predicted_tokens_per_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    device: Mapped[str] = mapped_column(String(200))
    # The measurement ran on this many GPUs; the predictions above are for the plan on as many.
    measured_gpus: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    # False: the node could not run the plan as planned (QLoRA without bitsandbytes); never calibrates.
    comparable: Mapped[bool] = mapped_column(Boolean, default=True, server_default=sa_true())
    notes: Mapped[list[Any]] = mapped_column(JSON, default=list, server_default="[]")
    # The node's GPU count at registration (0: a CPU host), whether the measured device is the GPU NVML
    # reported, and whether the organization's estimates use the result, with the reason when they do not
    # (services/nodes/calibration.py screen and device_check).
    gpu_count: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    verified: Mapped[bool] = mapped_column(Boolean, default=False, server_default=sa_false())
    used: Mapped[bool] = mapped_column(Boolean, default=False, server_default=sa_false())
    unused_reason: Mapped[str | None] = mapped_column(Text, default=None)
