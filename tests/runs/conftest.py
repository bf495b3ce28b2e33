"""A real API (SQLite, in-process tasks) with a done plan, a node and a run on the loopback S3 bucket."""

from __future__ import annotations

import os
import random
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from services.agent.agent import Agent
from services.api.app import create_app
from services.cli.main import main
from services.core.db import make_engine, make_sessionmaker, unit_of_work
from services.core.settings import Settings
from services.orgs.service import create_key, create_organization
from services.runs.client import RunApi
from tests.api.conftest import QLORA_PLAN
from tests.conftest import S3_TEST_CREDENTIALS, bounded_test_client, served_on_loopback
from tests.databases import migrate


@dataclass
class RunEnv:
    client: TestClient
    key: str
    other_key: str
    plan_id: str
    node_id: str
    run_id: str
    s3: Settings

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    @property
    def api(self) -> RunApi:
        return RunApi(self.client, self.key, self.run_id)

    def run(self) -> dict[str, Any]:
        return self.api.run()

    def joined_agent(self, name: str) -> Agent:
        """An agent registered as a node of this organization (an A100 80GB) and joined to the run."""
        agent = Agent(self.client, self.key)
        agent.register(name=name, gpu="A100 80GB")
        join = self.client.post(
            f"/v1/runs/{self.run_id}/nodes",
            json={"node_id": agent.node_id},
            headers={**self.headers, "X-Node-Token": agent.node_token},
        )
        assert join.status_code == 200, join.text
        return agent

    def new_run(self, **fields: Any) -> str:
        body = {"node_ids": [self.node_id], "checkpoint_dir": "/data/ckpt", "bucket": self.s3.s3_bucket, **fields}
        response = self.client.post(f"/v1/plans/{self.plan_id}/runs", json=body, headers=self.headers)
        assert response.status_code == 201, response.text
        return str(response.json()["id"])


@pytest.fixture
def run_env(tmp_path: Path, s3_settings: Settings) -> Iterator[RunEnv]:
    url = f"sqlite:///{tmp_path / 'gpuplan.db'}"
    migrate(url)
    factory = make_sessionmaker(make_engine(url))
    with unit_of_work(factory) as session:
        create_organization(session, "alpha")
        create_organization(session, "beta")
        key, other = create_key(session, "alpha"), create_key(session, "beta")
    app = create_app(Settings(database_url=url, s3_bucket=s3_settings.s3_bucket))
    with bounded_test_client(app) as client:
        headers = {"Authorization": f"Bearer {key}"}
        plan_id = client.post("/v1/plans", json=QLORA_PLAN, headers=headers).json()["id"]
        deadline = time.monotonic() + 60
        while client.get(f"/v1/plans/{plan_id}", headers=headers).json()["status"] not in ("done", "failed"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        node = client.post("/v1/nodes", json={"name": "gpu-1", "gpu": "A100 80GB"}, headers=headers).json()
        env = RunEnv(client, key, other, plan_id, node["id"], "", s3_settings)
        env.run_id = env.new_run()
        yield env


def make_checkpoint(root: Path, step: int, big_bytes: int, seed: int, settled: bool = True) -> Path:
    """An HF-Trainer-like checkpoint: a large sparse safetensors weights file with random blocks (a valid
    header: services/runs/complete.py checks its length), the optimizer and scheduler states, a nested file, and
    ``trainer_state.json`` written last (what makes it complete). Old mtimes make it settled."""
    rng = random.Random(seed)
    directory = root / f"checkpoint-{step}"
    directory.mkdir(parents=True)
    with (directory / "model.safetensors").open("wb") as fh:
        header = b'{"w":{"dtype":"U8","shape":[N],"data_offsets":[0,N]}}'
        data_bytes = big_bytes - 8 - len(header) - 16  # room for the digits, padded below
        header = header.replace(b"N", str(data_bytes).encode())
        header += b" " * (big_bytes - 8 - len(header) - data_bytes)
        fh.write(len(header).to_bytes(8, "little") + header)
        fh.truncate(big_bytes)
        start = 8 + len(header)
        for _ in range(max(4, big_bytes // (8 * 2**20))):
            fh.seek(rng.randrange(start, max(start + 1, big_bytes - 65536)))
            fh.write(rng.randbytes(65536))
        fh.truncate(big_bytes)
    (directory / "optimizer.pt").write_bytes(rng.randbytes(300_000))
    (directory / "scheduler.pt").write_bytes(rng.randbytes(1000))  # the Trainer loads it with optimizer.pt or neither
    (directory / "nested").mkdir()
    (directory / "nested" / "rng_state.bin").write_bytes(rng.randbytes(1000))
    (directory / "trainer_state.json").write_text(f'{{"global_step": {step}, "log_history": []}}')
    if settled:
        old = time.time() - 3600
        for path in [*directory.rglob("*"), directory]:
            os.utime(path, (old, old))
    return directory


@pytest.fixture
def live_api(run_env: RunEnv) -> Iterator[str]:
    """The run_env app served over real HTTP on loopback (the agent is a separate process)."""
    with served_on_loopback(run_env.client.app, "runs-uvicorn", lifespan="off") as url:
        yield url


@pytest.fixture
def connect(run_env: RunEnv, live_api: str, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The `gpuplan sync` arguments that reach the live API and, through the environment, the loopback bucket."""
    monkeypatch.setenv("GPUPLAN_S3_ENDPOINT_URL", run_env.s3.s3_endpoint_url or "")
    monkeypatch.setenv("GPUPLAN_S3_ACCESS_KEY_ID", S3_TEST_CREDENTIALS["s3_access_key_id"])
    monkeypatch.setenv("GPUPLAN_S3_SECRET_ACCESS_KEY", S3_TEST_CREDENTIALS["s3_secret_access_key"])
    return ["--api", live_api, "--key", run_env.key, "--run", run_env.run_id]


@pytest.fixture
def sync(connect: list[str], capsys: pytest.CaptureFixture[str]) -> Callable[[Path], str]:
    """One `gpuplan sync` pass over a folder (no settling wait) that must succeed; returns what it printed."""

    def sync_once(folder: Path) -> str:
        assert main(["sync", *connect, "--dir", str(folder), "--settle-s", "0"]) == 0
        return capsys.readouterr().out

    return sync_once


def free_port() -> int:
    """A loopback port nothing listens on (for an endpoint that is down, or a server of the test's own)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def cli_env(run_env: RunEnv) -> dict[str, str]:
    """The environment a `gpuplan` subprocess needs to reach the loopback bucket."""
    return {
        **os.environ,
        "GPUPLAN_S3_ENDPOINT_URL": run_env.s3.s3_endpoint_url or "",
        "GPUPLAN_S3_ACCESS_KEY_ID": S3_TEST_CREDENTIALS["s3_access_key_id"],
        "GPUPLAN_S3_SECRET_ACCESS_KEY": S3_TEST_CREDENTIALS["s3_secret_access_key"],
    }
