"""A real `gpuplan serve` on a loopback port, in a subprocess (its own event loop, GIL and sockets)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from services.core.db import make_engine, make_sessionmaker, unit_of_work
from services.orgs.service import create_key, create_organization
from tests.databases import migrate


@dataclass(frozen=True)
class Served:
    base: str
    port: int
    key: str
    log: Path

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}


@contextmanager
def serve(
    database_url: str, tmp_path: Path, settings: Mapping[str, str] | None = None, workers: int = 1
) -> Iterator[Served]:
    """Migrate, make an organization with an admin key, start the server (``settings`` as GPUPLAN_*
    variables) and wait for /healthz."""
    migrate(database_url)
    with unit_of_work(make_sessionmaker(make_engine(database_url))) as session:
        create_organization(session, "acme")
        key = create_key(session, "acme", admin=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPLAN_") and k != "PROMETHEUS_MULTIPROC_DIR"}
    env.update(GPUPLAN_DATABASE_URL=database_url, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    env.update(GPUPLAN_ACCESS_LOG="false")
    env.update({f"GPUPLAN_{k.upper()}": v for k, v in (settings or {}).items()})
    log_path = tmp_path / "serve.log"
    log = open(log_path, "wb")  # noqa: SIM115 - closed below
    server = subprocess.Popen(
        [sys.executable, "-m", "services.cli.main", "serve", "--port", str(port), "--workers", str(workers)],
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
            assert time.monotonic() < deadline and server.poll() is None, log_path.read_text()
            time.sleep(0.3)
        yield Served(base=base, port=port, key=key, log=log_path)
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
