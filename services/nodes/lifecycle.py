"""Idle shutdown on the control plane: heartbeats feed the idle timer, a periodic sweep decides.

Each sweep decides for every active node (services/nodes/idle.py) and stores an event whenever the
decision changes (a keep-alive with a new reason, a stop, a lost node), so the log explains every
state without repeating itself every minute. The node's latest decision is on the node itself.
A stop goes through the provider driver only when the node is idle past its threshold *and* its last
heartbeat reported nothing unsynced; while checkpoints are waiting, the agent is told to sync.
A stop is sent only for a node whose agent proved itself with the node's token and, when it names a
provider instance, for an instance its own organization registered; anything else is refused and the
refusal is an event with its reason.

A stop runs in three steps, so that no lock or connection is held while a provider answers (a slow
provider would otherwise stall every other organization's heartbeats and, on SQLite, every write):
the sweep commits its decision with a lease on the node (status ``stopping``), calls the provider with
a timeout outside any transaction, and records the answer in a new short transaction. Each attempt is
one audit row. A failed attempt, or a confirmed stop after which the node still heartbeats past a grace
period, is retried with capped exponential backoff; after the last attempt the node is ``stop_failed``. A
``stop_failed`` node that keeps heartbeating idle is still retried, once per backoff cap (``stop_retry_s``): a provider
outage longer than the streak left an idle machine billing until someone acted. It stays ``stop_failed`` (given up
once: one audit row, one count of the metric) until a stop succeeds or it reports work; a silent one is never stopped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from services.core.db import unit_of_work, utcnow
from services.core.leases import worker_identity
from services.core.metrics import (
    NODE_STOP_ATTEMPTS,
    NODE_STOPS_GIVEN_UP,
    NODE_STOPS_INEFFECTIVE,
    NODE_SYNC_ALERTS,
    SWEEP_DECISIONS,
)
from services.core.settings import Settings
from services.nodes.drivers import DriverError, NodeTarget, NoDriver, ProviderDriver, UnusableDriver
from services.nodes.idle import (
    HEARTBEAT_INTERVAL_S,
    Decision,
    IdlePolicy,
    Signals,
    StopPolicy,
    SyncAlertPolicy,
    busy_reasons,
    decide,
    gpu_reading,
    next_idle_since,
    stop_backoff_s,
    stop_retry_s,
)
from services.nodes.providers import make_driver
from services.nodes.schemas import SyncHealth
from services.nodes.tables import NodeEventRow, NodeInstanceRow, NodeRow
from services.orgs import audit

log = logging.getLogger("gpuplan.lifecycle")

SWEEP_TASK = "gpuplan.nodes.sweep_idle"
SWEEP_ACTOR = "system:idle-sweep"
SYNC_ACTOR = "system:sync-health"


def policy_of(node: NodeRow, lost_after_s: float) -> IdlePolicy:
    return IdlePolicy(idle_minutes=node.idle_minutes, gpu_busy_pct=node.gpu_busy_pct, lost_after_s=lost_after_s)


def stop_policy(settings: Settings) -> StopPolicy:
    return StopPolicy(
        max_attempts=settings.node_stop_max_attempts,
        backoff_s=settings.node_stop_backoff_s,
        backoff_max_s=settings.node_stop_backoff_max_s,
        grace_s=settings.node_stop_grace_s,
    )


def sync_alert_policy(settings: Settings) -> SyncAlertPolicy:
    return SyncAlertPolicy(failing_s=settings.node_sync_alert_s, unsynced_s=settings.node_unsynced_alert_s)


def call_bound_s(timeout_s: float) -> float:
    """The longest one stop call may take: the driver's timeout bounds each phase (connect, read), so
    twice it, plus a little."""
    return 2 * timeout_s + 5.0


def stop_lease_s(timeout_s: float, position: int, concurrency: int) -> float:
    """How long a sweep holds the stop of its ``position``-th claim (0-based): until its call, queued behind
    ``position // concurrency`` rounds of calls, is bounded, plus slack to record the answer. A sweep that
    dies mid-call loses the lease, and the next sweep counts the attempt as failed."""
    return (position // concurrency + 1) * call_bound_s(timeout_s) + 30.0


def signals_of(node: NodeRow) -> Signals:
    utilisation, readable = gpu_reading(node.gpus or [], node.gpu_count)
    return Signals(
        job_running=node.job_running,
        gpu_utilisation_pct=utilisation,
        gpu_readable=readable,
        uploading=node.uploading,
        interactive_idle_s=node.interactive_idle_s,
        unsynced_checkpoints=node.unsynced_checkpoints,
        pending_bytes=node.sync_pending_bytes,
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


def _duration(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def sync_alert_reason(node: NodeRow, at: datetime, policy: SyncAlertPolicy) -> tuple[str, str] | None:
    """(cause, reason) when the node's sync needs someone: its passes have failed past the threshold, or it
    has held checkpoints that are not durable past the other; None when neither."""
    if node.sync_error and node.sync_failing_since is not None:
        failing_s = (at - node.sync_failing_since).total_seconds()
        if failing_s >= policy.failing_s:
            return "failing", (
                f"checkpoint sync failing for {_duration(failing_s)} (alert after {_duration(policy.failing_s)}): "
                f"{node.sync_error}; {node.sync_pending_bytes / 2**30:.2f} GiB not durable"
            )
    if node.unsynced_since is not None:
        unsynced_s = (at - node.unsynced_since).total_seconds()
        if unsynced_s >= policy.unsynced_s:
            return "unsynced", (
                f"{node.unsynced_checkpoints} checkpoint(s), {node.sync_pending_bytes / 2**30:.2f} GiB, not durable "
                f"for {_duration(unsynced_s)} (alert after {_duration(policy.unsynced_s)})"
            )
    return None


def record_sync_health(
    session: Session, node: NodeRow, sync: SyncHealth | None, at: datetime, policy: SyncAlertPolicy
) -> None:
    """Store what the agent says of its sync and raise (or clear) the node's sync alert: once per streak,
    with an event, an audit row, the metric and a log line; its end is an event too. The streak's start
    is the agent's, clamped to the server's clock and to no earlier than the last heartbeat before it, so an
    agent that failed while the service was unreachable is not forgiven that time, and one whose clock runs
    behind raises no alert at once."""
    if sync is None:
        # No sync on the node (no run attached): nothing of it is pending or failing.
        node.sync_error, node.sync_pending_bytes, node.sync_failing_since = None, 0, None
    else:
        node.sync_error = sync.last_error
        node.sync_pending_bytes = sync.pending_bytes
        if sync.last_error is None:
            node.sync_failing_since = None
        elif node.sync_failing_since is None:
            reported = sync.failing_since if sync.failing_since is not None else at
            if node.last_heartbeat_at is not None:
                # A new streak began after the last heartbeat, which reported none: an agent whose clock runs
                # behind cannot date it earlier (and one that failed while unreachable still is not forgiven).
                reported = max(reported, node.last_heartbeat_at)
            # Dated once per streak: later reports of the same streak carry the agent's clock again, which must
            # not move it (an agent 10 min behind raised the alert on its second report, a probe of stop 50).
            node.sync_failing_since = min(reported, at)
    pending = node.unsynced_checkpoints > 0 or node.sync_pending_bytes > 0
    node.unsynced_since = (node.unsynced_since or at) if pending else None
    alert = sync_alert_reason(node, at, policy)
    if alert is not None and node.sync_alert is None:
        cause, reason = alert
        node.sync_alert = reason  # when it was raised is the sync_alert event's time
        add_event(session, node, "sync_alert", reason, at, {"cause": cause})
        audit.record(
            session, node.organization_id, SYNC_ACTOR, "node.sync_alert", f"node:{node.id}", detail={"reason": reason}
        )
        NODE_SYNC_ALERTS.labels(cause).inc()
        log.warning("node %s: %s", node.id, reason)
    elif alert is None and node.sync_alert is not None:
        add_event(session, node, "sync_ok", "checkpoint sync healthy again", at, {"alert": node.sync_alert})
        node.sync_alert = None
    elif alert is not None:
        node.sync_alert = alert[1]  # the same streak: the reason's figures move on, no new alert


def _reset_stop(node: NodeRow) -> None:
    """The node is busy (or back) again: a later stop starts a new streak of attempts."""
    node.stop_attempts = 0
    node.next_stop_at = None


def after_heartbeat(
    session: Session,
    node: NodeRow,
    at: datetime,
    lost_after_s: float,
    stops: StopPolicy | None = None,
    interval_s: float = HEARTBEAT_INTERVAL_S,
) -> None:
    """Update the idle timer from the signals just stored (``interval_s``: the agent's seconds between
    heartbeats, which bound the gaps idle time accrues across); a lost or stopped node that reports is back.

    A node the provider confirmed stopped may still report while it shuts down (``grace_s``). Past that,
    an idle report means the stop changed nothing: a failed attempt, retried after its backoff. A busy
    report means someone started the machine for work again: it is back, with a fresh streak. A
    ``stop_failed`` node reporting idle stays so; the sweep retries it (``stop_retry_s``)."""
    stops = stops or StopPolicy()
    idle = not busy_reasons(signals_of(node), policy_of(node, lost_after_s))
    since_s = (at - node.stopped_at).total_seconds() if node.stopped_at is not None else stops.grace_s + 1
    if node.status == "stopped" and since_s <= stops.grace_s:
        pass  # the machine shutting down, busy or not (a restarted agent registers a new node): changes nothing
    elif node.status == "stopped" and idle:
        NODE_STOPS_INEFFECTIVE.inc()
        answer = (
            f"the provider confirmed the stop ({node.last_stop_answer or 'no detail'}) but the node still "
            f"heartbeats {since_s:.0f} s later (grace {stops.grace_s:g} s)"
        )
        record_failed_attempt(session, node, answer, at, stops, "stop_ineffective", "stop-ineffective")
    elif node.status in ("lost", "stopped") or (node.status == "stop_failed" and not idle):
        add_event(session, node, "back", f"heartbeat received while {node.status}", at)
        node.status = "active"
        node.last_decision = None
        node.stopped_at = None
        _reset_stop(node)
    previous = node.last_heartbeat_at
    node.last_heartbeat_at = at
    node.heartbeat_interval_s = interval_s
    policy = policy_of(node, lost_after_s)
    node.idle_since = next_idle_since(node.idle_since, signals_of(node), policy, at, previous, interval_s)


@dataclass
class SweepSummary:
    decided: int = 0
    stopped: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)  # stop attempts that failed (each retried or given up)
    given_up: list[str] = field(default_factory=list)  # nodes marked stop_failed
    retried: list[str] = field(default_factory=list)  # stop_failed nodes whose stop this sweep sent again
    events: int = 0


@dataclass(frozen=True)
class StopClaim:
    """A stop the sweep committed to send: the node's lease is ``owner``'s until the answer is recorded."""

    node_id: str
    target: NodeTarget
    attempt: int
    reason: str  # the idle decision's
    code: str
    owner: str
    given_up: bool = False  # claimed from stop_failed: a retry after the streak was given up


@dataclass(frozen=True)
class StopResult:
    claim: StopClaim
    ok: bool
    answer: str  # the driver's detail, or why it failed


def _record(
    session: Session,
    node: NodeRow,
    decision: Decision,
    at: datetime,
    summary: SweepSummary | None,
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
        if summary is not None:
            summary.events += 1


def target_of(node: NodeRow) -> NodeTarget:
    """What a driver may act on: the instance, and only the pid the node's agent proved."""
    return NodeTarget(
        node.id, node.name, node.instance_id, node.hostname, node.verified_pid, node.verified_pid_start_ticks
    )


def _check_ownership(session: Session, node: NodeRow) -> None:
    """Refuse a stop the organization has not earned: no agent proved itself with the node token, or the
    instance is not the organization's (DriverError, recorded by the sweep as a refused stop)."""
    if node.token_hash is None or node.agent_verified_at is None:
        raise DriverError("refused: no agent of this node has proved itself with the node token")
    if node.instance_id:
        claim = session.scalar(select(NodeInstanceRow).where(NodeInstanceRow.instance_id == node.instance_id))
        if claim is None or claim.organization_id != node.organization_id:
            raise DriverError(f"refused: instance {node.instance_id!r} is not registered to this organization")


def record_failed_attempt(
    session: Session,
    node: NodeRow,
    answer: str,
    at: datetime,
    stops: StopPolicy,
    kind: str,
    code: str,
    given_up: bool | None = None,
) -> bool:
    """A stop attempt that failed (or changed nothing): back to active with the next attempt after its
    backoff, or, after the last attempt, ``stop_failed`` with an audit row and the metric, and the next
    retry after ``stop_retry_s``. True: given up by this attempt.

    ``given_up``: the attempt was a retry of a streak already given up (the sweep claimed it from
    ``stop_failed``); it stays ``stop_failed`` with its next retry, and raises no second audit row or count.
    None (an attempt whose claim is not known: a lease that expired, a stop that changed nothing): so when
    the streak's attempts are past the last one."""
    attempt = max(node.stop_attempts, 1)
    if given_up is None:
        given_up = attempt > stops.max_attempts
    node.last_stop_answer = answer[:2000]
    node.stop_lease_owner = node.stop_lease_expires_at = None
    node.last_decision, node.last_decision_at = code, at
    details: dict[str, object] = {"code": code, "attempt": attempt, "max_attempts": stops.max_attempts}
    if given_up or attempt >= stops.max_attempts:
        node.status = "stop_failed"
        # Retried while it reports idle, at the backoff's cap: a provider outage longer than the streak must not leave
        # an idle machine billing until someone acts.
        node.next_stop_at = at + timedelta(seconds=stop_retry_s(stops))
        retry = (
            f"retried every {_duration(stop_retry_s(stops))} while the node reports idle, next after "
            f"{node.next_stop_at:%Y-%m-%d %H:%M:%S} UTC"
        )
        retried = {"retry": True} if given_up else {}
        node.last_reason = (
            f"stop attempt {attempt} failed (given up after {stops.max_attempts}): {answer}; still {retry}"
            if given_up
            else f"stop attempt {attempt} of {stops.max_attempts} failed: {answer}; stop given up, {retry}"
        )
        extra = {"gave_up": True, **retried, "next_stop_at": node.next_stop_at.isoformat()}
        add_event(session, node, kind, node.last_reason, at, {**details, **extra})
        if given_up:  # a retry of a streak given up: no second audit row or count, the alert fired once
            log.warning("node %s: stop retry (attempt %d) failed: %s", node.id, attempt, answer)
            return False
        audit.record(
            session,
            node.organization_id,
            SWEEP_ACTOR,
            "node.stop_failed",
            f"node:{node.id}",
            detail={"attempts": attempt, "answer": node.last_stop_answer},
        )
        NODE_STOPS_GIVEN_UP.inc()
        log.warning("node %s: stop given up after %d attempts: %s", node.id, attempt, answer)
        return True
    wait_s = stop_backoff_s(attempt, stops)
    node.status = "active"
    node.next_stop_at = at + timedelta(seconds=wait_s)
    node.last_reason = (
        f"stop attempt {attempt} of {stops.max_attempts} failed: {answer}; next attempt after "
        f"{node.next_stop_at:%Y-%m-%d %H:%M:%S} UTC"
    )
    add_event(session, node, kind, node.last_reason, at, {**details, "next_stop_at": node.next_stop_at.isoformat()})
    log.warning("node %s: stop attempt %d failed: %s", node.id, attempt, answer)
    return False


def _claim_stop(session: Session, node: NodeRow, now: datetime, owner: str, lease_s: float) -> bool:
    """Take the node's stop lease: a compare-and-set from the status the decision read (active, or stop_failed for
    a retry) and its count of attempts, so of two sweeps (or beat processes) deciding the same node, one sends the
    stop, even when the other's attempt failed meanwhile and put the node back as it was (every claim counts one
    more attempt); and from the heartbeat the decision read, so a heartbeat recorded since (a job started) is decided
    on first. On Postgres the sweep's row lock holds heartbeats back; SQLite takes no row lock, and a busy heartbeat
    committed between the read and the claim was stopped on (a probe)."""
    seen = node.last_heartbeat_at
    same_heartbeat = NodeRow.last_heartbeat_at.is_(None) if seen is None else NodeRow.last_heartbeat_at == seen
    result = session.execute(
        update(NodeRow)
        .where(
            NodeRow.id == node.id,
            NodeRow.status == node.status,
            NodeRow.stop_attempts == node.stop_attempts,
            same_heartbeat,
        )
        .values(
            status="stopping",
            stop_lease_owner=owner,
            stop_lease_expires_at=now + timedelta(seconds=lease_s),
            stop_attempts=NodeRow.stop_attempts + 1,
            last_stop_at=now,
            next_stop_at=None,
        )
        .execution_options(synchronize_session=False)
    )
    session.refresh(node)
    return bool(result.rowcount)  # type: ignore[attr-defined]


def decide_all(
    session: Session,
    now: datetime,
    driver: ProviderDriver,
    lost_after_s: float,
    stops: StopPolicy,
    owner: str,
    timeout_s: float,
    concurrency: int,
) -> tuple[SweepSummary, list[StopClaim]]:
    """The sweep's decisions over every active node, in the caller's (short) transaction; returns the stops
    to send once it commits. Stops whose sweep died before recording an answer count as failed first. A
    ``stop_failed`` node idle past its threshold is sent its stop again once its retry is due; a silent one
    (lost by the heartbeat rule) is never stopped, and stays ``stop_failed``."""
    summary = SweepSummary()
    orphans = session.scalars(
        select(NodeRow)
        .where(NodeRow.status == "stopping", NodeRow.stop_lease_expires_at < now)
        .with_for_update(skip_locked=True)
    ).all()
    for node in orphans:
        answer = "no answer recorded: the sweep that sent the stop did not finish (its lease expired)"
        summary.failed.append(node.id)
        if record_failed_attempt(session, node, answer, now, stops, "stop_failed", f"stop-failed:{driver.name}"):
            summary.given_up.append(node.id)
    nodes = session.scalars(
        select(NodeRow)
        .where(NodeRow.status.in_(("active", "stop_failed")))
        .order_by(NodeRow.id)
        .with_for_update(skip_locked=True)
    ).all()
    claims: list[StopClaim] = []
    for node in nodes:
        policy = policy_of(node, lost_after_s)
        signals = signals_of(node)
        decision = decide(node.last_heartbeat_at, node.idle_since, signals, policy, now, node.heartbeat_interval_s)
        given_up = node.status == "stop_failed"
        if given_up and decision.action != "stop":
            # Not idle past its threshold now (silent: never stopped, as any node whose heartbeats stop; a busy
            # heartbeat made it active already): it stays stop_failed, its reason the given-up stop's.
            continue
        summary.decided += 1
        if decision.action == "lost":
            node.status = "lost"
            _record(session, node, decision, now, summary)
            summary.lost.append(node.id)
            continue
        if decision.action == "keep":
            if decision.code.startswith("busy") and node.stop_attempts:
                _reset_stop(node)
            changed = node.last_decision != decision.code
            _record(session, node, decision, now, summary)
            only_unsynced = decision.code == "busy:unsynced"
            if only_unsynced and "sync" not in (node.commands or []):
                # Nothing else keeps it busy: ask the agent for the final sync before a stop (again each sweep, as
                # a heartbeat takes the command; the event once per streak, not one a minute).
                node.commands = [*(node.commands or []), "sync"]
                if changed:
                    # A microsecond later than the decision it follows, so the log keeps their order.
                    later = now + timedelta(microseconds=1)
                    add_event(
                        session, node, "sync_requested", "idle but checkpoints are not durable: final sync", later
                    )
                    summary.events += 1
            continue
        if node.next_stop_at is not None and now < node.next_stop_at:
            continue  # backing off after a failed attempt; its event said when the next one is due
        try:
            _check_ownership(session, node)
            if isinstance(driver, NoDriver):
                driver.stop(target_of(node))  # raises at once: the decision is recorded, nothing is stopped
        except DriverError as exc:
            refused = Decision("keep", f"stop-failed:{driver.name}", f"{decision.reason}; stop failed: {exc}")
            _record(session, node, refused, now, summary, kind="stop_failed")
            log.warning("node %s: stop not sent: %s", node.id, exc)
            continue
        if _claim_stop(session, node, now, owner, stop_lease_s(timeout_s, len(claims), concurrency)):
            claims.append(
                StopClaim(node.id, target_of(node), node.stop_attempts, decision.reason, decision.code, owner, given_up)
            )
            if given_up:
                summary.retried.append(node.id)
    return summary, claims


def _stop_one(driver: ProviderDriver, claim: StopClaim) -> StopResult:
    try:
        return StopResult(claim, True, driver.stop(claim.target))
    except DriverError as exc:
        return StopResult(claim, False, str(exc))
    except Exception as exc:  # a driver bug must not lose the lease's answer: recorded as a failed attempt
        log.exception("node %s: the %s driver raised", claim.node_id, driver.name)
        return StopResult(claim, False, f"the {driver.name} driver raised {type(exc).__name__}")


def call_stops(
    driver: ProviderDriver, claims: Sequence[StopClaim], timeout_s: float, concurrency: int
) -> Iterator[StopResult]:
    """Send the claimed stops, ``concurrency`` at once, yielding each answer as it comes (no session is
    open here). The drivers bound each call with ``timeout_s``; a call still running past twice that is
    answered as timed out, and whatever it returns later is dropped."""
    if not claims:
        return
    pool = ThreadPoolExecutor(max_workers=min(concurrency, len(claims)), thread_name_prefix="gpuplan-stop")
    try:
        pending: dict[Future[StopResult], StopClaim] = {pool.submit(_stop_one, driver, c): c for c in claims}
        # Within the leases decide_all took: the last round of calls ends by its bound.
        rounds = -(-len(claims) // concurrency)
        deadline = time.monotonic() + rounds * call_bound_s(timeout_s)
        while pending:
            done, _ = wait(pending, timeout=max(deadline - time.monotonic(), 0.0), return_when=FIRST_COMPLETED)
            if not done:
                bound_s = call_bound_s(timeout_s)
                for claim in pending.values():
                    yield StopResult(claim, False, f"no answer from the provider within {bound_s:.0f} s")
                return
            for future in done:
                pending.pop(future)
                yield future.result()
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def record_stop(
    session: Session, result: StopResult, at: datetime, stops: StopPolicy, driver_name: str, summary: SweepSummary
) -> None:
    """Store one provider answer, if the node's lease is still this sweep's (an audit row per attempt)."""
    claim = result.claim
    node = session.scalar(select(NodeRow).where(NodeRow.id == claim.node_id).with_for_update())
    if node is None or node.status != "stopping" or node.stop_lease_owner != claim.owner:
        log.warning(
            "node %s: the answer to stop attempt %d came after its lease was lost", claim.node_id, claim.attempt
        )
        return
    NODE_STOP_ATTEMPTS.labels(driver_name, "ok" if result.ok else "error").inc()
    audit.record(
        session,
        node.organization_id,
        SWEEP_ACTOR,
        "node.stop",
        f"node:{node.id}",
        detail={
            "driver": driver_name,
            "attempt": claim.attempt,
            "ok": result.ok,
            "answer": result.answer[:500],
            "reason": claim.reason,
        },
    )
    if not result.ok:
        summary.failed.append(node.id)
        code = f"stop-failed:{driver_name}"
        if record_failed_attempt(session, node, result.answer, at, stops, "stop_failed", code, claim.given_up):
            summary.given_up.append(node.id)
        return
    node.status = "stopped"
    node.stopped_at = at
    node.last_stop_answer = result.answer[:2000]
    node.stop_lease_owner = node.stop_lease_expires_at = None
    details: dict[str, object] = {"driver": driver_name, "result": result.answer, "attempt": claim.attempt}
    _record(session, node, Decision("stop", claim.code, claim.reason), at, summary, details=details)
    summary.stopped.append(node.id)


def sweep(
    session: Session, now: datetime, driver: ProviderDriver, lost_after_s: float, stops: StopPolicy | None = None
) -> SweepSummary:
    """One sweep in the caller's transaction, provider calls included: for tests and in-process drivers
    only. The beat task and the embedded loop use ``run_sweep``, which holds no transaction during a call."""
    stops = stops or StopPolicy()
    summary, claims = decide_all(session, now, driver, lost_after_s, stops, worker_identity(), 600.0, 1)
    session.flush()
    for result in call_stops(driver, claims, timeout_s=600.0, concurrency=1):
        record_stop(session, result, now, stops, driver.name, summary)
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


def run_sweep(
    factory: sessionmaker[Session],
    settings: Settings,
    now: datetime | None = None,
    driver: ProviderDriver | None = None,
) -> SweepSummary:
    """One sweep (the beat task and the embedded loop): the decisions and stop leases commit first, the
    provider calls run with no session open, and each answer is recorded in its own short transaction.
    ``now`` fixes the clock of both transactions (tests); unset, each reads the time when it runs."""
    if driver is None:
        try:
            driver = make_driver(settings)
        except DriverError as exc:
            # A driver setting missing made every sweep raise before any decision: no node marked lost, no final sync
            # asked for, nothing on the nodes saying why none stopped. Decide anyway; each stop is refused with why.
            log.error("provider driver %s: %s", settings.provider_driver, exc)
            driver = UnusableDriver(settings.provider_driver, str(exc))
    stops = stop_policy(settings)
    timeout_s, concurrency = settings.node_stop_timeout_s, settings.node_stop_concurrency
    with unit_of_work(factory) as session:
        summary, claims = decide_all(
            session,
            now or utcnow(),
            driver,
            settings.node_lost_after_s,
            stops,
            worker_identity(),
            timeout_s,
            concurrency,
        )
    for result in call_stops(driver, claims, timeout_s, concurrency):
        with unit_of_work(factory) as session:
            record_stop(session, result, now or utcnow(), stops, driver.name, summary)
    kept = summary.decided - len(claims) - len(summary.lost)
    counts = (("keep", kept), ("stop", len(summary.stopped)), ("stop_failed", len(summary.failed)))
    for decision, count in (*counts, ("lost", len(summary.lost))):
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
