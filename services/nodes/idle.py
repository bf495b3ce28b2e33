"""When a node may be stopped (pure): the busy signals, the idle timer and the sweep's decision.

A node is busy while any of these holds: a training job runs (whatever its GPU does: a long setup or
a data download keeps the GPU idle), a GPU is above the utilisation threshold or its state could not be
read, an upload is in progress, an interactive session was active within the idle window, or
checkpoints on its disk are not yet durable. The idle timer starts at the first heartbeat that shows
none of them, and again after a gap in the heartbeats longer than the agent's cadence allows
(``cadence_gap_s``). A node whose heartbeats stop is *lost*, never stopped: the control plane cannot
know it is idle, and the node-side guard (services/agent/node.py NodeGuard) stops it if it is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# The agent's default seconds between heartbeats (`gpuplan agent --interval`); assumed for an agent that declares none.
HEARTBEAT_INTERVAL_S = 15.0


class IdlePolicy(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    idle_minutes: float = Field(default=15.0, ge=1.0, le=7 * 24 * 60, description="idle time before a stop")
    gpu_busy_pct: float = Field(default=10.0, ge=0.0, le=100.0, description="GPU utilisation that counts as busy")
    lost_after_s: float = Field(default=300.0, ge=30.0, le=86_400, description="no heartbeat this long: lost")


@dataclass(frozen=True)
class Signals:
    """What a heartbeat said about the node."""

    job_running: bool = False
    gpu_utilisation_pct: float = 0.0  # the busiest GPU read
    gpu_readable: bool = True  # False: NVML could not read a GPU of the node, whose state is then unknown
    uploading: bool = False
    interactive_idle_s: float | None = None  # the most recently active interactive session; None: none open
    unsynced_checkpoints: int = 0
    pending_bytes: int = 0  # bytes of local checkpoints the bucket does not hold, as the agent's sync counts them


def gpu_reading(gpus: Sequence[Mapping[str, Any]], registered: int | None = None) -> tuple[float, bool]:
    """(the busiest GPU's utilisation, whether every GPU was read) from a heartbeat's ``gpus``; a null
    ``utilisation_pct`` is a GPU NVML could not read (services/agent/signals.py read_gpus). With ``registered``
    (the node's GPU count), a GPU of the node that a heartbeat reporting GPUs leaves out is not read either: one
    reporting one GPU of four made the other three look idle (a probe of the node lifecycle). A heartbeat with no
    GPUs reports no GPU state at all (a CPU host, or a client of the API that does not read NVML): its other
    signals decide, as they always did."""
    read = [g.get("utilisation_pct", 0.0) for g in gpus]
    known = [float(u) for u in read if u is not None]
    every = len(known) == len(read)
    if registered is not None and every and gpus:
        every = {g.get("index") for g in gpus} >= set(range(registered))
    return max(known, default=0.0), every


def busy_reasons(signals: Signals, policy: IdlePolicy) -> dict[str, str]:
    """Why the node is busy, by signal ('job', 'gpu', 'gpu-unreadable', 'upload', 'interactive', 'unsynced');
    empty: idle."""
    reasons = {}
    if signals.job_running:
        reasons["job"] = "a training job is running"
    if signals.gpu_utilisation_pct > policy.gpu_busy_pct:
        reasons["gpu"] = f"GPU utilisation {signals.gpu_utilisation_pct:.0f}% > {policy.gpu_busy_pct:.0f}%"
    if not signals.gpu_readable:
        # Unknown is not idle: a failed read of a training GPU (a driver hiccup, "GPU is lost") reported 0 % and
        # no processes, and the sweep could stop the node mid-run (a probe of the idle lifecycle).
        reasons["gpu-unreadable"] = "GPU state unreadable (NVML) or not reported"
    if signals.uploading:
        reasons["upload"] = "an upload is in progress"
    if signals.interactive_idle_s is not None and signals.interactive_idle_s < policy.idle_minutes * 60:
        reasons["interactive"] = f"an interactive session was active {signals.interactive_idle_s / 60:.0f} min ago"
    if signals.unsynced_checkpoints > 0 or signals.pending_bytes > 0:
        # Either count says the node holds data the bucket does not (the agent counts both, at two moments).
        reasons["unsynced"] = (
            f"{signals.unsynced_checkpoints} checkpoint(s), {signals.pending_bytes / 2**30:.2f} GiB, not yet durable"
        )
    return reasons


def cadence_gap_s(interval_s: float, policy: IdlePolicy) -> float:
    """The longest gap between two heartbeats across which idle time accrues: three of the agent's intervals plus
    30 s (a missed heartbeat or two and a slow answer; the staleness rule of services/cli/server.py's beat check),
    never more than the lost threshold."""
    return min(3 * interval_s + 30.0, policy.lost_after_s)


def next_idle_since(
    previous: datetime | None,
    signals: Signals,
    policy: IdlePolicy,
    at: datetime,
    last_heartbeat_at: datetime | None = None,
    interval_s: float = HEARTBEAT_INTERVAL_S,
) -> datetime | None:
    """The idle timer after a heartbeat at ``at``: cleared while busy, started at the first idle one, and started
    again after a gap since ``last_heartbeat_at`` (the heartbeat before) longer than ``cadence_gap_s`` of the
    agent's ``interval_s``: what the node did meanwhile is unknown, so that time is not counted as idle (a probe: a node
    silent for 4 of its 15 idle minutes could be stopped having been seen idle for 11)."""
    if busy_reasons(signals, policy):
        return None
    gap_s = (at - last_heartbeat_at).total_seconds() if last_heartbeat_at is not None else 0.0
    return previous if previous is not None and gap_s <= cadence_gap_s(interval_s, policy) else at


Action = Literal["keep", "stop", "lost"]


@dataclass(frozen=True)
class Decision:
    action: Action
    code: str  # what the decision rests on, stable while the situation is ('busy:job+gpu', 'idle', ...)
    reason: str  # the same for people, with the numbers


def decide(
    last_heartbeat_at: datetime | None,
    idle_since: datetime | None,
    signals: Signals,
    policy: IdlePolicy,
    now: datetime,
    interval_s: float = HEARTBEAT_INTERVAL_S,
) -> Decision:
    """The sweep's decision at ``now``. Idle time runs from ``idle_since`` to the last heartbeat plus the gap the
    agent's cadence allows (``cadence_gap_s`` of its ``interval_s``), never further: a node silent since, but not yet
    lost, was seen idle only that long (a probe: a node silent for 4 of its 15 idle minutes was stopped at a sweep)."""
    if last_heartbeat_at is None or now - last_heartbeat_at > timedelta(seconds=policy.lost_after_s):
        seen = "never" if last_heartbeat_at is None else f"{(now - last_heartbeat_at).total_seconds() / 60:.0f} min ago"
        return Decision("lost", "lost", f"no heartbeat since {seen} (lost after {policy.lost_after_s / 60:.0f} min)")
    reasons = busy_reasons(signals, policy)
    if reasons:
        return Decision("keep", "busy:" + "+".join(reasons), "busy: " + "; ".join(reasons.values()))
    if idle_since is None:  # the heartbeat that showed idleness has not been recorded yet
        return Decision("keep", "idle", "idle timer not started")
    seen_until = min(now, last_heartbeat_at + timedelta(seconds=cadence_gap_s(interval_s, policy)))
    idle_min = (seen_until - idle_since).total_seconds() / 60
    if idle_min < policy.idle_minutes:
        silent = f"; no heartbeat for {(now - last_heartbeat_at).total_seconds():.0f} s" if seen_until < now else ""
        return Decision("keep", "idle", f"idle {idle_min:.0f} of {policy.idle_minutes:g} min{silent}")
    return Decision("stop", "idle-past-threshold", f"idle {idle_min:.0f} min >= {policy.idle_minutes:g} min")


@dataclass(frozen=True)
class StopPolicy:
    """How a stop is retried (the GPUPLAN_NODE_STOP_* settings)."""

    max_attempts: int = 5
    backoff_s: float = 60.0
    backoff_max_s: float = 3600.0
    grace_s: float = 300.0  # heartbeats this long after a confirmed stop are the machine shutting down


@dataclass(frozen=True)
class SyncAlertPolicy:
    """When a node's checkpoint sync needs someone (the GPUPLAN_NODE_SYNC_ALERT_S and
    GPUPLAN_NODE_UNSYNCED_ALERT_S settings)."""

    failing_s: float = 600.0
    unsynced_s: float = 3600.0


def stop_backoff_s(attempt: int, policy: StopPolicy) -> float:
    """The wait after failed attempt ``attempt`` (1-based): doubled per attempt, capped. Capped exponential
    backoff as in AWS's "Exponential Backoff and Jitter" (Brooker, 2015); one sweep per node sends, so
    no jitter is needed to spread many clients."""
    return float(min(policy.backoff_s * 2.0 ** max(attempt - 1, 0), policy.backoff_max_s))


def stop_retry_s(policy: StopPolicy) -> float:
    """The wait between retries of a stop already given up (a ``stop_failed`` node still reporting idle): the
    backoff's cap, an hour by default. A provider outage longer than the streak then costs at most that much
    billing once the provider is back, and a provider that refuses for good is asked once per period, not once
    per sweep."""
    return float(policy.backoff_max_s)
