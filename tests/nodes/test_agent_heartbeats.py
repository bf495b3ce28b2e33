"""The agent's heartbeat as the service reads it, through the real agent, the API and the sweep, with a fake pynvml
in ``sys.modules``. A GPU node whose NVML read fails (a driver hiccup, "GPU is lost", the library gone after an
update) reports its GPU state as unknown, and neither the sweep nor the node-side guard stops it on that; a CPU-only
node is unchanged. Each heartbeat declares the agent's interval, which bounds the gaps idle time accrues across."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from services.agent import node as agent_node
from services.agent.agent import Agent
from services.agent.node import NodeGuard
from services.agent.signals import JobWatch
from services.api.app import create_app
from services.core.db import utcnow
from services.core.settings import Settings
from services.nodes.idle import IdlePolicy
from services.nodes.lifecycle import run_sweep
from tests.conftest import bounded_test_client
from tests.dashboard.conftest import sign_in
from tests.nodes.helpers import AgentStack, Recording, alpha_database, load_node


class NVMLError(Exception):
    """pynvml's error type (each NVML return code is a subclass of it), with the return code as ``value``."""

    def __init__(self, message: str, value: int = 999) -> None:
        super().__init__(message)
        self.value = value


NOT_SUPPORTED, NOT_FOUND = 3, 6  # nvml.h return codes


class FakeNvml(types.ModuleType):
    """Two idle A100s; ``failing`` names the NVML calls that raise, as a lost GPU or a broken driver makes them. With
    ``mig``, each GPU runs MIG with instances in slots 0 and 1 (pids per (GPU, slot) in ``mig_pids``): no utilisation
    figure, as NVML gives none under MIG."""

    def __init__(self) -> None:
        super().__init__("pynvml")
        self.NVMLError = NVMLError
        self.failing: set[str] = set()
        self.mig = False
        self.mig_pids: dict[tuple[int, int], list[int]] = {}

    def _call(self, name: str) -> None:
        if name in self.failing or "*" in self.failing:
            raise NVMLError("GPU is lost")

    def nvmlInit(self) -> None:
        self._call("nvmlInit")

    def nvmlDeviceGetCount(self) -> int:
        self._call("nvmlDeviceGetCount")
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self._call("nvmlDeviceGetHandleByIndex")
        return index

    def nvmlDeviceGetName(self, handle: int) -> str:
        return "NVIDIA A100-SXM4-80GB"

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        self._call("nvmlDeviceGetMemoryInfo")
        return types.SimpleNamespace(total=80 * 2**30, used=2**30)

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12040

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        self._call("nvmlDeviceGetUtilizationRates")
        if self.mig:
            raise NVMLError("Not Supported", NOT_SUPPORTED)
        return types.SimpleNamespace(gpu=0)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        self._call("nvmlDeviceGetComputeRunningProcesses")
        pids = self.mig_pids.get(handle, []) if isinstance(handle, tuple) else []
        return [types.SimpleNamespace(pid=pid) for pid in pids]

    def nvmlDeviceGetMigMode(self, handle: int) -> tuple[int, int]:
        return (1, 1) if self.mig else (0, 0)

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: int) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: int, slot: int) -> tuple[int, int]:
        if slot > 1:
            raise NVMLError("Not Found", NOT_FOUND)
        return (handle, slot)


class Stack(AgentStack):
    def agent(self, tmp_path: Path, guard: NodeGuard | None = None) -> Agent:
        # No process of this machine is the job: an empty /proc stands in for the node's.
        (tmp_path / "proc").mkdir(exist_ok=True)
        agent = Agent(self.client, self.key, jobs=JobWatch(proc=tmp_path / "proc"), guard=guard)
        # The sweeps run 20 min after the last heartbeat: an agent that beats every 10 min was seen idle all along.
        agent.interval_s = 600.0
        return agent

    def get(self, node_id: str) -> dict[str, Any]:
        answer: dict[str, Any] = self.client.get(f"/v1/nodes/{node_id}", headers=self.headers()).json()
        return answer

    def sweep_later(self, minutes: float) -> Recording:
        """A sweep ``minutes`` after now (the node's idle threshold is 15 min)."""
        driver = Recording()
        run_sweep(self.factory, self.settings, utcnow() + timedelta(minutes=minutes), driver)  # type: ignore[arg-type]
        return driver


@pytest.fixture
def stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Stack]:
    # Whoever is logged in to the test machine must not keep the node busy.
    monkeypatch.setattr(agent_node, "interactive_idle_s", lambda: None)
    url, factory, key = alpha_database(tmp_path / "nodes.db")
    # The sweep runs on the test's clock, 20 min ahead: the lost threshold is past that.
    settings = Settings(database_url=url, node_lost_after_s=3600, idle_sweep_interval_s=3600)
    with bounded_test_client(create_app(settings)) as client:
        yield Stack(client, factory, key, settings)


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    fake = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


@pytest.mark.parametrize(
    "failing",
    [
        {"*"},  # the driver is gone: every call fails
        {"nvmlDeviceGetCount"},
        {"nvmlDeviceGetUtilizationRates"},
        {"nvmlDeviceGetComputeRunningProcesses"},  # utilisation reads 0% but who holds the GPU is unknown
    ],
)
def test_a_gpu_node_whose_nvml_read_fails_is_kept_by_the_sweep(
    stack: Stack, nvml: FakeNvml, tmp_path: Path, failing: set[str]
) -> None:
    agent = stack.agent(tmp_path)
    node_id = agent.register(name="gpu-1")
    assert stack.get(node_id)["gpu_count"] == 2
    nvml.failing = failing
    assert agent.heartbeat()
    driver = stack.sweep_later(20)
    row = load_node(stack.factory, node_id)
    assert driver.stopped == [] and row.status == "active"
    assert row.last_decision == "busy:gpu-unreadable"
    assert "GPU state unreadable (NVML)" in (row.last_reason or "")
    node = stack.get(node_id)
    # Each registered GPU is reported, its state unknown: never 0% and no processes.
    assert [g["index"] for g in node["gpus"]] == [0, 1]
    assert all(g["utilisation_pct"] is None for g in node["gpus"]), node["gpus"]
    assert node["idle_since"] is None and node["last_reason"] == row.last_reason


def test_the_same_node_reading_its_gpus_again_is_stopped_once_idle(
    stack: Stack, nvml: FakeNvml, tmp_path: Path
) -> None:
    agent = stack.agent(tmp_path)
    node_id = agent.register(name="gpu-1")
    nvml.failing = {"*"}
    assert agent.heartbeat()
    nvml.failing = set()
    assert agent.heartbeat()
    assert [g["utilisation_pct"] for g in stack.get(node_id)["gpus"]] == [0.0, 0.0]
    assert stack.sweep_later(20).stopped == [node_id]


def test_the_node_side_guard_does_not_stop_a_node_whose_gpus_are_unreadable(
    stack: Stack, nvml: FakeNvml, tmp_path: Path
) -> None:
    now = [1_000_000.0]
    guard = NodeGuard(IdlePolicy(idle_minutes=1), unreachable_after_s=0, clock=lambda: now[0])
    agent = stack.agent(tmp_path, guard)
    agent.register(name="gpu-1")
    nvml.failing = {"nvmlDeviceGetUtilizationRates"}
    for _ in range(3):
        agent.heartbeat()
        now[0] += 120
    assert guard.should_stop() is None
    nvml.failing = set()
    agent.heartbeat()
    now[0] += 120
    assert guard.should_stop() is not None  # readable and idle past the threshold: the guard acts


def test_a_cpu_only_node_without_nvml_is_unchanged(
    stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    agent = stack.agent(tmp_path)
    node_id = agent.register(name="cpu-1", gpu="T4")
    assert stack.get(node_id)["gpu_count"] == 0
    assert agent.heartbeat()
    assert stack.get(node_id)["gpus"] == []
    assert stack.sweep_later(20).stopped == [node_id]


def test_the_dashboard_shows_an_unreadable_gpu(stack: Stack, nvml: FakeNvml, tmp_path: Path) -> None:
    agent = stack.agent(tmp_path)
    agent.register(name="gpu-1")
    nvml.failing = {"nvmlDeviceGetUtilizationRates"}
    assert agent.heartbeat()
    sign_in(stack.client, stack.key)
    page = stack.client.get("/dashboard/nodes")
    assert page.status_code == 200 and page.text.count("state unreadable (NVML)") == 2


def test_each_heartbeat_declares_the_agents_interval(
    stack: Stack, nvml: FakeNvml, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = stack.agent(tmp_path)
    agent.register(name="gpu-1")
    sent: list[dict[str, Any]] = []
    post = agent._post
    monkeypatch.setattr(agent, "_post", lambda path, body: (sent.append(body), post(path, body))[1])
    assert agent.run(interval_s=40.0, once=True) == "once"
    assert sent[0]["heartbeat_interval_s"] == 40.0


def test_a_mig_gpu_without_a_utilisation_figure_is_read_by_its_instances_processes(
    stack: Stack, nvml: FakeNvml, tmp_path: Path
) -> None:
    """NVML gives no utilisation under MIG (a slice rented as a node included): read as unreadable, such a node was
    never stopped. Its instances' compute processes decide instead: a process on one keeps the node; none, it is
    stopped once idle."""
    nvml.mig = True
    agent = stack.agent(tmp_path)
    node_id = agent.register(name="mig-1")
    nvml.mig_pids = {(1, 1): [4242]}  # a training process on GPU 1's second instance
    assert agent.heartbeat()
    assert [g["utilisation_pct"] for g in stack.get(node_id)["gpus"]] == [0.0, 0.0]
    assert stack.sweep_later(20).stopped == []
    assert load_node(stack.factory, node_id).last_decision == "busy:job"
    nvml.mig_pids = {}
    assert agent.heartbeat()
    assert stack.sweep_later(20).stopped == [node_id]
