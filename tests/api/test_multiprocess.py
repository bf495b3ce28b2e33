"""`gpuplan serve --workers 2` on Postgres as the compose API service runs it: two processes answer on
one port, plans submitted to either are estimated once, and a dashboard session and the metrics hold
across them."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from services.core.db import make_engine, make_sessionmaker, unit_of_work
from services.orgs.service import create_key, create_organization
from tests.api.conftest import QLORA_PLAN
from tests.databases import migrate


def test_two_api_processes_share_the_work(database_url: str, tmp_path: Path) -> None:
    if database_url.startswith("sqlite"):
        return  # the multi-process deployment is the Postgres one (compose); SQLite is the embedded default
    migrate(database_url)
    with unit_of_work(make_sessionmaker(make_engine(database_url))) as session:
        create_organization(session, "acme")
        key = create_key(session, "acme")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPLAN_") and k != "PROMETHEUS_MULTIPROC_DIR"}
    env.update(GPUPLAN_DATABASE_URL=database_url, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    log = open(tmp_path / "serve.log", "wb")  # noqa: SIM115 - closed below
    server = subprocess.Popen(
        [sys.executable, "-m", "services.cli.main", "serve", "--port", str(port), "--workers", "2"],
        cwd=tmp_path,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    headers = {"Authorization": f"Bearer {key}"}
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline and server.poll() is None, (tmp_path / "serve.log").read_text()
            time.sleep(0.3)

        def submit(i: int) -> tuple[str, int]:
            with httpx.Client(base_url=base, headers=headers, timeout=30) as client:  # one connection each
                pid = client.get("/healthz").json()["process_id"]
                plan_id = client.post("/v1/plans", json=QLORA_PLAN, headers={"Idempotency-Key": f"k{i}"}).json()["id"]
                return plan_id, pid

        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(submit, range(24)))
        pids = {pid for _, pid in results}
        plan_ids = {plan_id for plan_id, _ in results}
        assert len(plan_ids) == 24
        deadline = time.monotonic() + 120
        with httpx.Client(base_url=base, headers=headers, timeout=30) as client:
            for plan_id in plan_ids:
                while (body := client.get(f"/v1/plans/{plan_id}").json())["status"] not in ("done", "failed"):
                    assert time.monotonic() < deadline, body
                    time.sleep(0.2)
                assert body["status"] == "done" and body["attempts"] == 1, body  # estimated once
            listed = client.get("/v1/plans", params={"limit": 50}).json()["items"]
            assert {p["id"] for p in listed} == plan_ids
            metrics = client.get("/metrics").text
        children = Path(f"/proc/{server.pid}/task/{server.pid}/children").read_text().split()
        assert len(children) >= 2 and pids <= {int(c) for c in children} | {server.pid}, (pids, children)
        # Counted in whichever process answered, aggregated over both.
        assert 'gpuplan_http_requests_total{method="POST",route="/v1/plans",status="202"} 24.0' in metrics
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)
        log.close()
