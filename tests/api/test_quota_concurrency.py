"""Quotas hold under concurrency (issue 21, row 4: 40 concurrent `POST /v1/plans` at a quota of 5 were all
accepted, and 12 nodes at a quota of 3): a real `gpuplan serve` on loopback, requests from many threads at
once, on SQLite and PostgreSQL; the dashboard's plan form counts against the same quota."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx

from services.core.db import make_engine, make_sessionmaker, unit_of_work
from services.orgs.service import create_key, create_organization
from tests.api.conftest import QLORA_PLAN
from tests.dashboard.conftest import csrf_token
from tests.dashboard.test_routes import FORM
from tests.databases import migrate


@contextmanager
def _serve(database_url: str, tmp_path: Path, **settings: str) -> Iterator[tuple[str, str]]:
    migrate(database_url)
    with unit_of_work(make_sessionmaker(make_engine(database_url))) as session:
        create_organization(session, "acme")
        key = create_key(session, "acme", admin=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPLAN_") and k != "PROMETHEUS_MULTIPROC_DIR"}
    env.update(GPUPLAN_DATABASE_URL=database_url, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    env.update({f"GPUPLAN_{k.upper()}": v for k, v in settings.items()})
    workers = "1" if database_url.startswith("sqlite") else "2"
    log = open(tmp_path / "serve.log", "wb")  # noqa: SIM115 - closed below
    server = subprocess.Popen(
        [sys.executable, "-m", "services.cli.main", "serve", "--port", str(port), "--workers", workers],
        cwd=tmp_path,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
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
        yield base, key
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def _at_once(count: int, send: object) -> list[int]:
    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(send, range(count)))  # type: ignore[call-overload]


def test_concurrent_plans_and_nodes_never_pass_their_quota(database_url: str, tmp_path: Path) -> None:
    with _serve(database_url, tmp_path, quota_plans_per_hour="5", quota_nodes="3") as (base, key):
        headers = {"Authorization": f"Bearer {key}"}

        def plan(i: int) -> int:
            with httpx.Client(base_url=base, headers=headers, timeout=60) as client:
                return client.post("/v1/plans", json=QLORA_PLAN).status_code

        def node(i: int) -> int:
            with httpx.Client(base_url=base, headers=headers, timeout=60) as client:
                return client.post("/v1/nodes", json={"name": f"n{i}", "gpu": "T4"}).status_code

        plans = _at_once(40, plan)
        assert sorted(plans) == [202] * 5 + [429] * 35, plans
        nodes = _at_once(12, node)
        assert sorted(nodes) == [201] * 3 + [429] * 9, nodes

        # The dashboard's plan form is held to the same quota: the form answers with the quota's message.
        with httpx.Client(base_url=base, timeout=60) as browser:
            login = browser.get("/dashboard/login")
            signed_in = browser.post(
                "/dashboard/login",
                data={"csrf_token": csrf_token(login.text), "api_key": key, "next": "/dashboard/plans"},
            )
            assert signed_in.status_code == 303, signed_in.text
            token = csrf_token(browser.get("/dashboard/plans/new").text)
            answer = browser.post("/dashboard/plans", data={**FORM, "csrf_token": token})
            assert "quota: 5 plans per hour" in answer.text, answer.text[:2000]
        with httpx.Client(base_url=base, headers=headers, timeout=60) as client:
            assert len(client.get("/v1/plans").json()["items"]) == 5
