"""Task leases: every background task holds a row in the database while it is queued or running.

The row is written in the same transaction as the work that asks for the task (a transactional
outbox), so a task is never lost between the commit and the broker: if the broker is down, the row
stays and the lease sweep sends it when its lease expires. A worker claims the row when it starts,
renews the lease while it runs (a heartbeat thread) and deletes it when it ends. A worker that dies
stops renewing, the lease expires, and the sweep sends the task again, whatever the broker's
visibility timeout. Task bodies treat "already done" as success, so a second delivery stores nothing
twice; a claim refuses a delivery while another worker holds a live lease, so two workers never run
the same task at once.

The pattern is the transactional outbox (Richardson, microservices.io/patterns/data/transactional-outbox)
with leases as in Gray & Cheriton, "Leases: an efficient fault-tolerant mechanism for distributed file
cache consistency" (SOSP 1989): a holder that stops renewing loses the lease after a bounded time.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import JSON, Integer, String, UniqueConstraint, delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Mapped, Session, mapped_column, sessionmaker

from services.core.db import Base, IdMixin, TimestampMixin, UtcDateTime, unit_of_work, utcnow
from services.core.metrics import TASK_DURATION

log = logging.getLogger("gpuplan.leases")

QUEUED = "queued"
RUNNING = "running"
ABANDONED = "abandoned"


class TaskLease(IdMixin, TimestampMixin, Base):
    """One queued or running task: its name and arguments (to send it again) and its lease."""

    __tablename__ = "task_leases"
    __table_args__ = (UniqueConstraint("task_name", "subject_id", name="uq_task_leases_task_subject"),)

    task_name: Mapped[str] = mapped_column(String(100))
    # The first argument (a plan or data set id): one lease per task and subject.
    subject_id: Mapped[str] = mapped_column(String(64))
    args: Mapped[list[Any]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16), default=QUEUED)  # queued, running, abandoned
    owner: Mapped[str | None] = mapped_column(String(200), default=None)
    lease_expires_at: Mapped[datetime] = mapped_column(UtcDateTime, index=True)
    deliveries: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    expiries: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


def worker_identity() -> str:
    """host:pid:thread, so a lease names the process that holds it."""
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"[:200]


def record_outbox(session: Session, items: Sequence[tuple[str, tuple[Any, ...]]], lease_s: float) -> None:
    """Write (or refresh) the lease row of each task, in the caller's transaction. A task already queued
    or running for the same subject keeps its row: the delivery in flight will do the work."""
    now = utcnow()
    for name, args in items:
        subject = str(args[0]) if args else ""
        row = session.scalar(select(TaskLease).where(TaskLease.task_name == name, TaskLease.subject_id == subject))
        if row is None:
            session.add(
                TaskLease(
                    task_name=name,
                    subject_id=subject,
                    args=list(args),
                    status=QUEUED,
                    lease_expires_at=now + timedelta(seconds=lease_s),
                )
            )
        elif row.status == ABANDONED:
            row.status = QUEUED
            row.args = list(args)
            row.deliveries = 0
            row.lease_expires_at = now + timedelta(seconds=lease_s)
    session.flush()


def claim(factory: sessionmaker[Session], name: str, subject: str, owner: str, lease_s: float) -> bool:
    """Take the lease of a task about to run. False when another worker holds a live lease (this is a
    duplicate delivery: skip it). A task with no row (sent before leases existed, or already finished)
    gets one, so it is still watched."""
    now = utcnow()
    expires = now + timedelta(seconds=lease_s)
    with unit_of_work(factory) as session:
        result = session.execute(
            update(TaskLease)
            .where(
                TaskLease.task_name == name,
                TaskLease.subject_id == subject,
                (TaskLease.status != RUNNING) | (TaskLease.lease_expires_at < now) | (TaskLease.owner == owner),
            )
            .values(status=RUNNING, owner=owner, lease_expires_at=expires, deliveries=TaskLease.deliveries + 1)
            .execution_options(synchronize_session=False)
        )
        if result.rowcount:  # type: ignore[attr-defined]
            return True
        exists = session.scalar(
            select(TaskLease.id).where(TaskLease.task_name == name, TaskLease.subject_id == subject)
        )
        if exists is not None:
            return False
    try:
        with unit_of_work(factory) as session:
            session.add(
                TaskLease(
                    task_name=name,
                    subject_id=subject,
                    args=[subject],
                    status=RUNNING,
                    owner=owner,
                    lease_expires_at=expires,
                    deliveries=1,
                )
            )
    except IntegrityError:  # another delivery made the row between our two statements
        return False
    return True


def renew(factory: sessionmaker[Session], name: str, subject: str, owner: str, lease_s: float) -> bool:
    """Extend a held lease; False when it is no longer ours (it expired and was handed on)."""
    with unit_of_work(factory) as session:
        result = session.execute(
            update(TaskLease)
            .where(
                TaskLease.task_name == name,
                TaskLease.subject_id == subject,
                TaskLease.owner == owner,
                TaskLease.status == RUNNING,
            )
            .values(lease_expires_at=utcnow() + timedelta(seconds=lease_s))
            .execution_options(synchronize_session=False)
        )
        return bool(result.rowcount)  # type: ignore[attr-defined]


def release(factory: sessionmaker[Session], name: str, subject: str, owner: str) -> None:
    """The task ended (done or failed and recorded): drop its lease, if it is still ours."""
    with unit_of_work(factory) as session:
        session.execute(
            delete(TaskLease)
            .where(TaskLease.task_name == name, TaskLease.subject_id == subject, TaskLease.owner == owner)
            .execution_options(synchronize_session=False)
        )


class Heartbeat:
    """Renews a lease every third of its length on a daemon thread while a task runs, so a live worker
    keeps it and a dead one (SIGKILL, lost host) loses it after at most ``lease_s``."""

    def __init__(self, factory: sessionmaker[Session], name: str, subject: str, owner: str, lease_s: float) -> None:
        self._args = (factory, name, subject, owner, lease_s)
        self._interval_s = max(lease_s / 3.0, 0.05)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lease-{name}-{subject}", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                if not renew(*self._args):
                    log.warning("lease of %s %s was lost while the task ran", self._args[1], self._args[2])
                    return
            except Exception:  # a database blip: try again at the next beat, the lease has slack
                log.exception("renewing the lease of %s %s failed", self._args[1], self._args[2])

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def run_leased(
    factory: sessionmaker[Session], name: str, args: tuple[Any, ...], fn: Callable[..., Any], lease_s: float
) -> Any:
    """Run ``fn(*args)`` holding the task's lease; a duplicate delivery while another worker holds it
    does nothing and returns None."""
    subject = str(args[0]) if args else ""
    owner = worker_identity()
    if not claim(factory, name, subject, owner, lease_s):
        log.info("task %s %s is held by a live worker; this delivery is skipped", name, subject)
        return None
    started = time.monotonic()
    outcome = "error"
    try:
        with Heartbeat(factory, name, subject, owner, lease_s):
            result = fn(*args)
        outcome = "ok"
    finally:
        TASK_DURATION.labels(name, outcome).observe(time.monotonic() - started)
    release(factory, name, subject, owner)
    return result


@dataclass(frozen=True)
class SweepDecision:
    """What the sweep did with one expired lease: ``resend`` or ``abandon`` (too many deliveries)."""

    task_name: str
    subject_id: str
    args: tuple[Any, ...]
    action: str
    was_status: str
    deliveries: int


def sweep_expired(
    factory: sessionmaker[Session], lease_s: float, max_deliveries: int, now: datetime | None = None
) -> list[SweepDecision]:
    """Claim every expired lease for a fresh delivery (compare-and-set on its expiry, so two sweeps
    never both send one task) and return what to send; a task delivered ``max_deliveries`` times
    without finishing (it kills its worker) is marked abandoned instead of sent forever."""
    now = now or utcnow()
    decisions: list[SweepDecision] = []
    with unit_of_work(factory) as session:
        expired = session.execute(
            select(
                TaskLease.id,
                TaskLease.task_name,
                TaskLease.subject_id,
                TaskLease.args,
                TaskLease.status,
                TaskLease.deliveries,
                TaskLease.lease_expires_at,
            )
            .where(TaskLease.status.in_((QUEUED, RUNNING)), TaskLease.lease_expires_at < now)
            .order_by(TaskLease.lease_expires_at)
            .limit(1000)
        ).all()
        for lease_id, name, subject, args, status, deliveries, expires_at in expired:
            give_up = deliveries >= max_deliveries
            values: dict[str, Any] = {"expiries": TaskLease.expiries + 1, "owner": None}
            if give_up:
                values["status"] = ABANDONED
            else:
                values["status"] = QUEUED
                values["lease_expires_at"] = now + timedelta(seconds=lease_s)
            result = session.execute(
                update(TaskLease)
                .where(TaskLease.id == lease_id, TaskLease.lease_expires_at == expires_at)
                .values(**values)
                .execution_options(synchronize_session=False)
            )
            if result.rowcount:  # type: ignore[attr-defined]
                decisions.append(
                    SweepDecision(
                        name, subject, tuple(args or [subject]), "abandon" if give_up else "resend", status, deliveries
                    )
                )
    return decisions


def held_after_releasing_dead(session: Session, name: str) -> set[str]:
    """Hands back the leases of task ``name`` whose holder is dead, and returns the subjects a worker may
    be running now: a running lease, not expired, whose holder is not known to be dead. That is another
    process's work in flight, so a process starting up does not resume it (the sweep does, if its holder
    dies). A holder on this host whose process is gone, or that has this process's id but none of its
    threads (an earlier process's, the usual case after a container restart), is dead: its lease is
    handed back (queued, no owner) so the work resumes at once rather than when the lease runs out."""
    rows = session.execute(
        select(TaskLease.id, TaskLease.subject_id, TaskLease.owner).where(
            TaskLease.task_name == name, TaskLease.status == RUNNING, TaskLease.lease_expires_at >= utcnow()
        )
    ).all()
    dead = [(lease_id, owner) for lease_id, _, owner in rows if _holder_is_dead(owner)]
    for lease_id, owner in dead:
        session.execute(
            update(TaskLease)
            .where(TaskLease.id == lease_id, TaskLease.owner == owner)
            .values(status=QUEUED, owner=None)
            .execution_options(synchronize_session=False)
        )
    dead_ids = {lease_id for lease_id, _ in dead}
    return {subject for lease_id, subject, _ in rows if lease_id not in dead_ids}


def _holder_is_dead(owner: str | None) -> bool:
    host, _, rest = (owner or "").partition(":")
    pid, _, thread = rest.partition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False  # another host's (or unknown): only its lease's expiry can tell
    if int(pid) == os.getpid():
        # This process's id: an earlier process's lease unless one of this process's threads holds it
        # (several apps in one process, as in tests).
        return not any(str(t.ident) == thread for t in threading.enumerate())
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # it exists, under another user
        return False
    return False
