"""Every Celery queue carries a task, every task's queue is one a worker consumes, and
docs/operations.md lists the queues as routed."""

from __future__ import annotations

import re
from pathlib import Path

import workers.tasks  # noqa: F401  (registers the tasks on the app)
from workers.celery_app import QUEUES, TASK_QUEUES, app

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def test_every_queue_carries_a_task_and_every_task_is_routed() -> None:
    assert set(TASK_QUEUES.values()) == set(QUEUES)
    registered = {name for name in app.tasks if name.startswith("gpuplan.")}
    assert registered == set(TASK_QUEUES), "a task without a route runs on the default queue, or a route names no task"


def test_the_operations_page_lists_the_routing() -> None:
    section = OPERATIONS.read_text(encoding="utf-8").split("## PostgreSQL, Redis and Celery", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \| (.*) \|$", section, flags=re.MULTILINE)
    documented = {task: queue for queue, tasks in rows for task in re.findall(r"`(gpuplan\.[\w.]+)`", tasks)}
    assert {queue for queue, _ in rows} == set(QUEUES)
    assert documented == TASK_QUEUES
