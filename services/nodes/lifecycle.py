"""Idle shutdown on the control plane: heartbeats feed the idle timer, a periodic sweep decides.

Each sweep decides for every active node (services/nodes/idle.py) and stores an event whenever the
decision changes (a keep-alive with a new reason, a stop, a lost node), so the log explains every
state without repeating itself every minute. The node's latest decision is on the node itself.
A stop goes through the provider driver only when the node is idle past its threshold *and* its last
heartbeat reported nothing unsynced; while checkpoints are waiting, the agent is told to sync.
A stop is sent only for a node whose agent proved itself with the node's token and, when it names a
provider instance, for an instance its own organization registered; anything else is refused and the
refusal is an event with its reason.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from services.core.db import unit_of_work, utcnow
from services.core.metrics import SWEEP_DECISIONS
from services.core.settings import Settings
from services.nodes.drivers import DriverError, NodeTarget, ProviderDriver, make_driver
from services.nodes.idle import Decision, IdlePolicy, Signals, decide, next_idle_since
from services.nodes.tables import NodeEventRow, NodeInstanceRow, NodeRow
from services.orgs import audit

log = logging.getLogger("gpuplan.lifecycle")

SWEEP_TASK = "gpuplan.nodes.sweep_idle"


def policy_of(node: NodeRow, lost_after_s: float) -> IdlePolicy:
    return IdlePolicy(idle_minutes=node.idle_minutes, gpu_busy_pct=node.gpu_busy_pct, lost_after_s=lost_after_s)


def signals_of(node: NodeRow) -> Signals:
    utilisation = max((float(g.get("utilisation_pct", 0.0)) for g in node.gpus or []), default=0.0)
    return Signals(
        job_running=node.job_running,
        gpu_utilisation_pct=utilisation,
        uploading=node.uploading,
        interactive_idle_s=node.interactive_idle_s,
        unsynced_checkpoints=node.unsynced_checkpoints,
    )


def add_event(
    session: Session, node: NodeRow, kind: str, reason: str, at: datetime, details: dict[str, object] | None = None
) -> NodeEventRow:
    event = NodeEventRow(
        organization_id=node.organization_id,
        node_id=node.id,
        run_id=node.run_id,
        kind=kind,
        reason=reason,
        details=details or {},
        created_at=at,
    )
    session.add(event)
    return event


def after_heartbeat(session: Session, node: NodeRow, at: datetime, lost_after_s: float) -> None:
    """Update the idle timer from the signals just stored; a lost or stopped node that reports is back."""
    if node.status in ("lost", "stopped"):
        add_event(session, node, "back", f"heartbeat received while {node.status}", at)
        node.status = "active"
        node.last_decision = None
        node.stopped_at = None
    node.last_heartbeat_at = at
    node.idle_since = next_idle_since(node.idle_since, signals_of(node), policy_of(node, lost_after_s), at)


@dataclass
class SweepSummary:
    decided: int = 0
    stopped: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    events: int = 0


def _record(
    session: Session,
    node: NodeRow,
    decision: Decision,
    at: datetime,
    summary: SweepSummary,
    kind: str | None = None,
    details: dict[str, object] | None = None,
) -> None:
    """Store the decision on the node, and an event when it changed."""
    changed = node.last_decision != decision.code
    node.last_decision = decision.code
    node.last_reason = decision.reason
    node.last_decision_at = at
    if changed:
        add_event(
            session, node, kind or decision.action, decision.reason, at, {"code": decision.code, **(details or {})}
        )
        summary.events += 1


def target_of(node: NodeRow) -> NodeTarget:
    """What a driver may act on: the instance, and only the pid the node's agent proved."""
    return NodeTarget(
        node.id, node.name, node.instance_id, node.hostname, node.verified_pid, node.verified_pid_start_ticks
    )


def _check_ownership(session: Session, node: NodeRow) -> None:
    """Refuse a stop the organization has not earned: no agent proved itself with the node token, or the
    instance is not the organization's (DriverError, recorded by the sweep as a failed stop)."""
    if node.token_hash is None or node.agent_verified_at is None:
        raise DriverError("refused: no agent of this node has proved itself with the node token")
    if node.instance_id:
        claim = session.scalar(select(NodeInstanceRow).where(NodeInstanceRow.instance_id == node.instance_id))
        if claim is None or claim.organization_id != node.organization_id:
            raise DriverError(f"refused: instance {node.instance_id!r} is not registered to this organization")


def sweep(session: Session, now: datetime, driver: ProviderDriver, lost_after_s: float) -> SweepSummary:
    """One sweep over every active node of every organization (the beat task; also the embedded loop)."""
    summary = SweepSummary()
    nodes = session.scalars(
        select(NodeRow).where(NodeRow.status == "active").order_by(NodeRow.id).with_for_update(skip_locked=True)
    ).all()
    for node in nodes:
        summary.decided += 1
        policy = policy_of(node, lost_after_s)
        signals = signals_of(node)
        decision = decide(node.last_heartbeat_at, node.idle_since, signals, policy, now)
        if decision.action == "lost":
            node.status = "lost"
            _record(session, node, decision, now, summary)
            summary.lost.append(node.id)
            continue
        if decision.action == "keep":
            _record(session, node, decision, now, summary)
            only_unsynced = decision.code == "busy:unsynced"
            if only_unsynced and "sync" not in (node.commands or []):
                # Nothing else keeps it busy: ask the agent for the final sync before a stop.
                node.commands = [*(node.commands or []), "sync"]
                # A microsecond later than the decision it follows, so the log keeps their order.
                later = now + timedelta(microseconds=1)
                add_event(session, node, "sync_requested", "idle but checkpoints are not durable: final sync", later)
                summary.events += 1
            continue
        target = target_of(node)
        try:
            _check_ownership(session, node)
            detail = driver.stop(target)
        except DriverError as exc:
            failed = Decision("keep", f"stop-failed:{driver.name}", f"{decision.reason}; stop failed: {exc}")
            _record(session, node, failed, now, summary, kind="stop_failed")
            log.warning("node %s: stop failed: %s", node.id, exc)
            continue
        node.status = "stopped"
        node.stopped_at = now
        _record(session, node, decision, now, summary, details={"driver": driver.name, "result": detail})
        summary.stopped.append(node.id)
    return summary


def list_events(session: Session, node: NodeRow, limit: int) -> list[NodeEventRow]:
    return list(
        session.scalars(
            select(NodeEventRow)
            .where(NodeEventRow.node_id == node.id)
            .order_by(NodeEventRow.created_at.desc(), NodeEventRow.id.desc())
            .limit(limit)
        ).all()
    )


def run_sweep(factory: sessionmaker[Session], settings: Settings) -> SweepSummary:
    """One sweep in its own transaction (the beat task and the embedded loop call this)."""
    driver = make_driver(settings)
    with unit_of_work(factory) as session:
        summary = sweep(session, utcnow(), driver, settings.node_lost_after_s)
        for node_id in summary.stopped:  # a shutdown is an audited action (by the system)
            node = session.get(NodeRow, node_id)
            if node is not None:
                audit.record(
                    session,
                    node.organization_id,
                    "system:idle-sweep",
                    "node.stop",
                    f"node:{node_id}",
                    detail={"driver": driver.name, "reason": node.last_reason},
                )
    kept = summary.decided - len(summary.stopped) - len(summary.lost)
    for decision, count in (("keep", kept), ("stop", len(summary.stopped)), ("lost", len(summary.lost))):
        if count:
            SWEEP_DECISIONS.labels("idle", decision).inc(count)
    return summary


class EmbeddedSweeper:
    """The embedded default's beat: a daemon thread sweeping every ``idle_sweep_interval_s``."""

    def __init__(self, factory: sessionmaker[Session], settings: Settings) -> None:
        self._factory, self._settings = factory, settings
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gpuplan-idle-sweep", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self._settings.idle_sweep_interval_s):
            try:
                run_sweep(self._factory, self._settings)
            except Exception:  # a failed sweep is logged and retried at the next interval
                log.exception("idle sweep failed")

    def shutdown(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
