"""A real Redis and real Celery worker processes run plan estimation end to end through the API."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from services.api.app import create_app
from services.core.db import make_engine, make_sessionmaker, unit_of_work
from services.core.settings import Settings
from services.orgs.service import create_key, create_organization
from tests.api.conftest import QLORA_PLAN
from tests.conftest import bounded_test_client, require_service
from tests.databases import migrate

REDIS_URL = os.environ.get("GPUPLAN_TEST_REDIS_URL", "redis://127.0.0.1:6379/14")
LEASE_S = 3.0


def _redis_available() -> bool:
    try:
        import redis

        client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1)
        client.flushdb()
        return True
    except Exception:
        return False


class Stack:
    def __init__(self, tmp_path: Path) -> None:
        self.db_url = f"sqlite:///{tmp_path / 'gpuplan.db'}"
        migrate(self.db_url)
        with unit_of_work(make_sessionmaker(make_engine(self.db_url))) as session:
            create_organization(session, "acme")
            self.key = create_key(session, "acme")
        self.workers: list[subprocess.Popen[bytes]] = []
        self.logs = tmp_path

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPLAN_")}
        # The broker's visibility timeout stays at its default (over an hour): a dead worker's task must
        # come back through its lease, within the short lease and sweep interval set here.
        env.update(
            GPUPLAN_DATABASE_URL=self.db_url,
            GPUPLAN_REDIS_URL=REDIS_URL,
            GPUPLAN_TASK_LEASE_S=str(LEASE_S),
            GPUPLAN_LEASE_SWEEP_INTERVAL_S="1",
        )
        env.update(extra)
        return env

    def start_worker(self, **extra: str) -> subprocess.Popen[bytes]:
        log = open(self.logs / f"worker-{len(self.workers)}.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "services.cli.main",
                "worker",
                "--queues",
                "estimate,maintenance",
                "--concurrency",
                "1",
            ],
            env=self.env(**extra),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.workers.append(proc)
        return proc

    def start_beat(self) -> subprocess.Popen[bytes]:
        log = open(self.logs / "beat.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            [sys.executable, "-m", "services.cli.main", "beat"],
            # Beat keeps its schedule file in $XDG_STATE_HOME/gpuplan: this test's own, not the user's.
            env={**self.env(), "PYTHONPATH": os.getcwd(), "XDG_STATE_HOME": str(self.logs)},
            cwd=self.logs,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.workers.append(proc)
        return proc

    def stop(self) -> None:
        for proc in self.workers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    require_service("Redis", _redis_available(), 'redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save ""')
    s = Stack(tmp_path)
    try:
        yield s
    finally:
        s.stop()


def _wait(client: TestClient, key: str, plan_id: str, statuses: tuple[str, ...], timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        body: dict[str, Any] = client.get(f"/v1/plans/{plan_id}", headers={"Authorization": f"Bearer {key}"}).json()
        if body["status"] in statuses or time.monotonic() > deadline:
            return body
        time.sleep(0.1)


@pytest.mark.slow
def test_a_celery_worker_estimates_a_submitted_plan(stack: Stack) -> None:
    import socket

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        metrics_port = s.getsockname()[1]
    stack.start_worker(GPUPLAN_WORKER_METRICS_PORT=str(metrics_port))
    app = create_app(Settings(database_url=stack.db_url, redis_url=REDIS_URL))
    with bounded_test_client(app) as client:
        headers = {"Authorization": f"Bearer {stack.key}"}
        plan_id = client.post("/v1/plans", json=QLORA_PLAN, headers=headers).json()["id"]
        body = _wait(client, stack.key, plan_id, ("done", "failed"), 90)
        queue_metrics = client.get("/metrics").text
    assert body["status"] == "done", body
    assert body["recommendations"] and body["attempts"] == 1
    assert 'gpuplan_queue_depth{queue="estimate"}' in queue_metrics  # read from Redis at scrape time
    # The worker's own /metrics: the task ran in its pool process and was timed there.
    worker_metrics = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
    assert 'gpuplan_task_duration_seconds_count{outcome="ok",task="gpuplan.plans.estimate"} 1.0' in worker_metrics


@pytest.mark.slow
def test_a_sigkilled_worker_s_task_is_resumed_through_its_lease_and_stored_once(stack: Stack) -> None:
    first = stack.start_worker(GPUPLAN_TASK_DEBUG_DELAY_S="60")
    stack.start_beat()
    settings = Settings(database_url=stack.db_url, redis_url=REDIS_URL, task_lease_s=LEASE_S)
    with bounded_test_client(create_app(settings)) as client:
        headers = {"Authorization": f"Bearer {stack.key}"}
        plan_id = client.post("/v1/plans", json=QLORA_PLAN, headers=headers).json()["id"]
        running = _wait(client, stack.key, plan_id, ("running",), 90)
        assert running["status"] == "running", running
        stack.start_worker()  # a healthy worker, idle until the task comes back
        time.sleep(3 * LEASE_S)  # the first worker keeps renewing: nothing is handed over while it lives
        still = client.get(f"/v1/plans/{plan_id}", headers=headers).json()
        assert still["status"] == "running" and still["attempts"] == 1, still
        os.killpg(first.pid, signal.SIGKILL)  # mid-task: computed, not yet stored
        first.wait(timeout=30)
        killed_at = time.monotonic()
        body = _wait(client, stack.key, plan_id, ("done", "failed"), 120)
        resumed_s = time.monotonic() - killed_at
    logs = "".join(p.read_text(errors="replace")[-1500:] for p in sorted(stack.logs.glob("*.log")))
    assert body["status"] == "done", (body, logs)
    # Lease (3 s) + sweep interval (1 s) + the new delivery's work, far below the broker's 3900 s.
    assert resumed_s < 30, (resumed_s, logs)
    assert body["attempts"] == 2  # delivered twice ...
    with unit_of_work(make_sessionmaker(make_engine(stack.db_url))) as session:
        from sqlalchemy import func, select

        from services.core.leases import TaskLease
        from services.plans.tables import PlanRow

        assert session.scalar(select(func.count()).select_from(PlanRow)) == 1  # ... one stored result
        assert session.scalar(select(func.count()).select_from(TaskLease)) == 0  # and the lease released


@pytest.mark.slow
def test_a_celery_worker_checks_an_uploaded_data_set_and_sweeps_idle_nodes(stack: Stack, s3_settings: Settings) -> None:
    import json
    from datetime import UTC, datetime, timedelta

    from services.nodes.tables import NodeRow
    from workers.celery_app import make_celery

    s3_env = {
        "GPUPLAN_S3_ENDPOINT_URL": s3_settings.s3_endpoint_url or "",
        "GPUPLAN_S3_BUCKET": s3_settings.s3_bucket or "",
        "GPUPLAN_S3_ACCESS_KEY_ID": s3_settings.s3_access_key_id or "",
        "GPUPLAN_S3_SECRET_ACCESS_KEY": "gpuplan-test-secret",
    }
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "services.cli.main",
            "worker",
            "--queues",
            "datacheck,maintenance",
            "--concurrency",
            "1",
        ],
        env=stack.env(**s3_env),
        stdout=open(stack.logs / "worker-data.log", "wb"),  # noqa: SIM115 - closed with the process
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    stack.workers.append(worker)
    settings = s3_settings.model_copy(update={"database_url": stack.db_url, "redis_url": REDIS_URL})
    rows = [{"instruction": f"Question {i} about GPUs?", "output": f"Answer number {i}."} for i in range(300)]
    rows.append(rows[0])  # one exact duplicate
    data = "\n".join(json.dumps(r) for r in rows).encode() + b"\n{broken\n"
    with bounded_test_client(create_app(settings)) as client:
        headers = {"Authorization": f"Bearer {stack.key}"}
        created = client.post("/v1/datasets", json={"name": "t.jsonl", "size_bytes": len(data)}, headers=headers)
        assert created.status_code == 201, created.text
        dataset_id = created.json()["id"]
        assert client.put(f"/v1/datasets/{dataset_id}/parts/1", content=data, headers=headers).status_code == 200
        assert client.post(f"/v1/datasets/{dataset_id}/complete", headers=headers).status_code == 200
        deadline = time.monotonic() + 120
        while (body := client.get(f"/v1/datasets/{dataset_id}", headers=headers).json())["status"] not in (
            "done",
            "failed",
        ):
            assert time.monotonic() < deadline, (stack.logs / "worker-data.log").read_text()[-2000:]
            time.sleep(0.2)
        assert body["status"] == "done", body
        counts = body["report"]["counts"]
        assert body["report"]["rows_total"] == 302 and counts["exact_duplicates"] == 1 and counts["broken_rows"] == 1

        # The beat's sweep, run by the worker: a node silent for an hour is marked lost, never stopped.
        node = client.post("/v1/nodes", json={"name": "silent", "gpu": "T4"}, headers=headers).json()
        with unit_of_work(make_sessionmaker(make_engine(stack.db_url))) as session:
            row = session.get(NodeRow, node["id"])
            assert row is not None
            row.last_heartbeat_at = datetime.now(UTC) - timedelta(hours=1)
        make_celery(settings).send_task("gpuplan.nodes.sweep_idle", queue="maintenance")
        deadline = time.monotonic() + 60
        while not (events := client.get(f"/v1/nodes/{node['id']}/events", headers=headers).json()["items"]):
            assert time.monotonic() < deadline, (stack.logs / "worker-data.log").read_text()[-2000:]
            time.sleep(0.2)
        assert events[0]["kind"] == "lost" and "no heartbeat since 60 min ago" in events[0]["reason"]
        assert client.get(f"/v1/nodes/{node['id']}", headers=headers).json()["status"] == "lost"
