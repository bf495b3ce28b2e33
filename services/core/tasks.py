"""Background work. Tasks are enqueued by name during a unit of work, recorded as lease rows in the
same transaction (services/core/leases.py: the outbox) and sent only after it commits, so a task
never starts before the rows it reads exist and is never lost if the broker is down at that moment.
Embedded default: a thread pool in this process; with GPUPLAN_REDIS_URL set, Celery."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

from sqlalchemy.orm import Session, sessionmaker

from services.core.leases import SweepDecision, run_leased, sweep_expired
from services.core.metrics import LEASE_EXPIRIES, SWEEP_DECISIONS
from services.core.settings import Settings

log = logging.getLogger("gpuplan.tasks")

TaskFn = Callable[..., None]
# Called with each expired lease the sweep dealt with (metrics, giving up on a plan).
SweepHook = Callable[[SweepDecision], None]


class InProcessRunner:
    """Runs tasks, by their stable dotted names, on a small thread pool (the embedded default), each
    holding its lease. ``futures`` holds only the tasks not finished yet."""

    def __init__(
        self,
        workers: int,
        tasks: dict[str, TaskFn],
        factory: sessionmaker[Session] | None = None,
        lease_s: float = 60.0,
    ) -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="gpuplan-task")
        self._tasks = tasks
        self._factory = factory
        self._lease_s = lease_s
        self._lock = threading.Lock()
        self.futures: set[Future[None]] = set()

    def send(self, name: str, args: tuple[Any, ...]) -> None:
        fn = self._tasks[name]
        factory, lease_s = self._factory, self._lease_s

        def run() -> None:
            try:
                if factory is None:
                    fn(*args)
                else:
                    run_leased(factory, name, args, fn, lease_s)
            except Exception:  # the task records its own failure; this is the last resort log
                log.exception("task %s%r failed", name, args)

        future = self._pool.submit(run)
        with self._lock:
            self.futures.add(future)
        future.add_done_callback(self._forget)

    def _forget(self, future: Future[None]) -> None:
        with self._lock:
            self.futures.discard(future)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)


class TaskSender(Protocol):
    """What CeleryRunner needs of a Celery app."""

    def send_task(self, name: str, *args: Any, **options: Any) -> object: ...


class CeleryRunner:
    """Sends tasks by name to the Celery queues (GPUPLAN_REDIS_URL set). A send that fails (the broker
    is down) is logged and left to the lease sweep, which sends it again once its lease expires."""

    # The edges hand in the Celery app and its queue map (workers.celery_app): core imports no edge.
    def __init__(self, app: TaskSender, queues: Mapping[str, str]) -> None:
        self._app = app
        self._queues = queues

    def send(self, name: str, args: tuple[Any, ...]) -> None:
        try:
            self._app.send_task(
                name,
                args=list(args),
                queue=self._queues.get(name, "estimate"),
                # Fail fast: the outbox row keeps the task, so the request need not wait for the broker.
                retry=True,
                retry_policy={"max_retries": 1, "interval_start": 0.0, "interval_step": 0.2, "interval_max": 0.2},
            )
        except Exception as exc:  # kombu/redis connection errors vary by transport
            log.warning("could not send task %s%r (%s); the lease sweep will send it", name, args, exc)

    def shutdown(self) -> None:
        return None


class PendingTasks:
    """Tasks a request wants to run, recorded in its transaction and sent after it commits."""

    def __init__(self) -> None:
        self.items: list[tuple[str, tuple[Any, ...]]] = []

    def enqueue(self, name: str, *args: Any) -> None:
        self.items.append((name, args))

    def flush(self, runner: InProcessRunner | CeleryRunner) -> None:
        items, self.items = self.items, []
        for name, args in items:
            runner.send(name, args)


def sweep_leases(
    factory: sessionmaker[Session],
    runner: InProcessRunner | CeleryRunner,
    settings: Settings,
    hooks: tuple[SweepHook, ...] = (),
) -> list[SweepDecision]:
    """Send again every task whose lease expired (its worker died, or the broker lost or never got
    the message); hooks see each decision, including tasks abandoned after too many deliveries."""
    decisions = sweep_expired(factory, settings.task_lease_s, settings.task_max_deliveries)
    for decision in decisions:
        log.warning(
            "lease of %s %s expired while %s (delivery %d): %s",
            decision.task_name,
            decision.subject_id,
            decision.was_status,
            decision.deliveries,
            decision.action,
        )
        LEASE_EXPIRIES.labels(decision.task_name, decision.was_status).inc()
        SWEEP_DECISIONS.labels("lease", decision.action).inc()
        if decision.action == "resend":
            runner.send(decision.task_name, decision.args)
        for hook in hooks:
            try:
                hook(decision)
            except Exception:
                log.exception("sweep hook failed for %s %s", decision.task_name, decision.subject_id)
    return decisions


class LeaseSweeper:
    """The embedded default's lease sweep: a daemon thread (with Celery, beat runs it)."""

    def __init__(
        self,
        factory: sessionmaker[Session],
        runner: InProcessRunner | CeleryRunner,
        settings: Settings,
        hooks: tuple[SweepHook, ...] = (),
    ) -> None:
        self._args = (factory, runner, settings, hooks)
        self._interval_s = settings.lease_sweep_interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpuplan-lease-sweep", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                sweep_leases(*self._args)
            except Exception:
                log.exception("lease sweep failed")

    def start(self) -> None:
        self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
