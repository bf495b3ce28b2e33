"""Background work. Tasks are enqueued by name during a unit of work and sent only after it commits,
so a task never starts before the rows it reads exist. Embedded default: a thread pool in this
process; with GPUPLAN_REDIS_URL set, Celery (the workers issue)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from services.core.settings import Settings

log = logging.getLogger("gpuplan.tasks")

TaskFn = Callable[..., None]


class InProcessRunner:
    """Runs tasks, by their stable dotted names, on a small thread pool (the embedded default)."""

    def __init__(self, workers: int, tasks: dict[str, TaskFn]) -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="gpuplan-task")
        self._tasks = tasks
        self.futures: list[Future[None]] = []

    def send(self, name: str, args: tuple[Any, ...]) -> None:
        fn = self._tasks[name]

        def run() -> None:
            try:
                fn(*args)
            except Exception:  # the task records its own failure; this is the last resort log
                log.exception("task %s%r failed", name, args)

        self.futures.append(self._pool.submit(run))

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)


class CeleryRunner:
    """Sends tasks by name to the Celery queues (GPUPLAN_REDIS_URL set)."""

    def __init__(self, settings: Settings) -> None:
        from workers.celery_app import TASK_QUEUES, make_celery

        self._app = make_celery(settings)
        self._queues = TASK_QUEUES

    def send(self, name: str, args: tuple[Any, ...]) -> None:
        self._app.send_task(name, args=list(args), queue=self._queues.get(name, "estimate"))

    def shutdown(self) -> None:
        return None


class PendingTasks:
    """Tasks a request wants to run, sent after its transaction commits."""

    def __init__(self) -> None:
        self.items: list[tuple[str, tuple[Any, ...]]] = []

    def enqueue(self, name: str, *args: Any) -> None:
        self.items.append((name, args))

    def flush(self, runner: InProcessRunner | CeleryRunner) -> None:
        items, self.items = self.items, []
        for name, args in items:
            runner.send(name, args)
