"""Shared test helpers: plans, service requirements, and the loopback S3 server."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from services.core.settings import Settings
from services.estimator.plan import Plan

LLAMA_8B: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
    "max_position_embeddings": 131072,
}


@pytest.fixture(autouse=True)
def _no_real_hub(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """No test reaches the Hugging Face Hub: a model id outside the bundled catalog goes to a closed
    loopback port (the Hub tests point HF_ENDPOINT at their fake), and the CLI caches in a fresh folder."""
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.setenv("GPUPLAN_HUB_CACHE_DIR", str(tmp_path_factory.mktemp("hub-cache")))
    from services.hub import service as hub_service

    hub_service._refusals.clear()  # a fake Hub of an earlier test may have had the same port


def make_plan(**fields: Any) -> Plan:
    data: dict[str, Any] = {"model": {"name": "llama-8b", "config": LLAMA_8B}}
    data.update(fields)
    return Plan.model_validate(data)


def require_service(name: str, available: bool, how_to_start: str) -> None:
    """Skip a test whose service is absent, or fail it under CI (GPUPLAN_REQUIRE_SERVICES=1)."""
    import os

    import pytest

    if available:
        return
    message = f"{name} is not reachable; start it with: {how_to_start}"
    if os.environ.get("GPUPLAN_REQUIRE_SERVICES") == "1":
        pytest.fail(message)
    pytest.skip(message)


def require_trace_extra() -> None:
    """Skip (or, under CI, fail) a test that needs torch, transformers and peft."""
    import importlib.util

    available = all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers", "peft"))
    require_service("the trace extra (torch, transformers, peft)", available, "bash infra/dev.sh test")


def _hypothesis_profiles() -> None:
    import os

    from hypothesis import settings

    # CI explores the same examples every run (a red build means a regression, not a new seed);
    # local runs draw new ones. GPUPLAN_HYPOTHESIS=deep explores ten times more.
    settings.register_profile("dev", max_examples=150)
    settings.register_profile("ci", max_examples=150, derandomize=True)
    settings.register_profile("deep", max_examples=1500)
    if os.environ.get("GPUPLAN_HYPOTHESIS") == "deep":
        settings.load_profile("deep")
    elif os.environ.get("CI") == "true":
        settings.load_profile("ci")
    else:
        settings.load_profile("dev")


_hypothesis_profiles()


S3_TEST_CREDENTIALS = {"s3_access_key_id": "gpuplan-test", "s3_secret_access_key": "gpuplan-test-secret"}


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _s3_server() -> Iterator[str]:
    """moto's S3-compatible server in its own process, over real HTTP on loopback."""
    import importlib.util
    import subprocess
    import sys
    import time
    import urllib.request

    available = importlib.util.find_spec("moto") is not None and importlib.util.find_spec("flask") is not None
    require_service("an S3-compatible server (moto[server])", available, "pip install 'moto[server]'")
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(endpoint + "/moto-api/", timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                require_service("an S3-compatible server (moto[server])", False, "pip install 'moto[server]'")
            time.sleep(0.1)
    try:
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(timeout=10)


s3_server = pytest.fixture(scope="session")(_s3_server)


@pytest.fixture
def s3_settings(s3_server: str) -> Settings:
    """Settings pointing at a fresh, empty bucket on the loopback S3 server."""
    import uuid

    from services.storage.s3 import make_s3_client

    settings = Settings(s3_endpoint_url=s3_server, s3_bucket=f"gpuplan-{uuid.uuid4().hex[:12]}", **S3_TEST_CREDENTIALS)
    make_s3_client(settings).create_bucket(Bucket=settings.s3_bucket)
    return settings


# Skip accounting. Under CI (CI=true or GPUPLAN_REQUIRE_SERVICES=1) a skipped test fails the run
# unless it is listed here with the reason it may skip: an `importorskip` or a self-skip would
# otherwise turn a missing install step into a green build that tested nothing.
# Keys are test node ids; a key without "[...]" covers every parametrization of that test.
ALLOWED_SKIPS: dict[str, str] = {}

_unexpected_skips: list[tuple[str, str]] = []
_allowed_skip_count = 0


def _skip_accounting_on() -> bool:
    import os

    return os.environ.get("CI") == "true" or os.environ.get("GPUPLAN_REQUIRE_SERVICES") == "1"


def skip_is_allowed(nodeid: str, allowed: dict[str, str]) -> bool:
    """Whether a skipped test's node id is on the allow-list (exactly, or by its unparametrized id)."""
    return nodeid in allowed or nodeid.split("[", 1)[0] in allowed


def _skip_reason(report: pytest.CollectReport | pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def _account(report: pytest.CollectReport | pytest.TestReport) -> None:
    global _allowed_skip_count
    if not report.skipped or hasattr(report, "wasxfail"):
        return
    if skip_is_allowed(report.nodeid, ALLOWED_SKIPS):
        _allowed_skip_count += 1
    else:
        _unexpected_skips.append((report.nodeid, _skip_reason(report)))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _account(report)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    _account(report)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _skip_accounting_on():
        return
    if _unexpected_skips:
        terminalreporter.section("unexpected skips (not in tests/conftest.py ALLOWED_SKIPS)", red=True)
        for nodeid, reason in _unexpected_skips:
            terminalreporter.line(f"{nodeid}: {reason}")
    terminalreporter.line(
        f"skip accounting: {_allowed_skip_count} allowed skip(s), {len(_unexpected_skips)} unexpected"
    )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _skip_accounting_on() and _unexpected_skips and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@contextlib.contextmanager
def served_on_loopback(app: Any, name: str = "test-uvicorn", **options: Any) -> Iterator[str]:
    """``app`` served by uvicorn over real HTTP on a free loopback port (for clients in other processes: the
    ``gpuplan`` console command, a browser), its base URL yielded; stopped on exit."""
    import uvicorn

    port = _free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", **options)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=name, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"{name}: the test server did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


# How long a test client's shutdown may take before the test goes on without it.
CLIENT_CLOSE_BOUND_S = 60


@contextlib.contextmanager
def bounded_test_client(app: Any) -> Iterator[Any]:
    """``TestClient(app)`` as a context manager whose shutdown is bounded. Twice (the project's CI run of stop 59,
    and a run of stop 60), the portal thread of run_env's client never ended after the app's lifespan had shut
    down (the main thread in anyio's start_blocking_portal joining a portal loop idle in select), at the same test
    (tests/runs/test_sync_health.py's bucket-cannot-hold case, after a whole suite's worth of earlier tests in the
    process; it passes alone and with its file), and the suite hung until CI's limit. Not understood yet: the
    shutdown now runs in a thread of its own, and one that has not ended after CLIENT_CLOSE_BOUND_S is a warning
    in the test report, with every thread's stack, not a hang. Every test client of the suite run as a context
    manager is made here."""
    import warnings

    from fastapi.testclient import TestClient

    client = TestClient(app)
    client.__enter__()
    try:
        yield client
    finally:
        closer = threading.Thread(
            target=client.__exit__, args=(None, None, None), name="test-client-close", daemon=True
        )
        closer.start()
        closer.join(CLIENT_CLOSE_BOUND_S)
        if closer.is_alive():
            warnings.warn(
                f"the test client did not shut down within {CLIENT_CLOSE_BOUND_S} s; left running. Threads:\n"
                + _thread_stacks(),
                stacklevel=2,
            )


def _thread_stacks(frames: int = 8) -> str:
    """The innermost ``frames`` frames of every thread, to find what a hung shutdown waits for."""
    import sys
    import traceback

    names = {t.ident: t.name for t in threading.enumerate()}
    return "\n".join(
        f"-- {names.get(ident, ident)}\n" + "".join(traceback.format_stack(frame)[-frames:])
        for ident, frame in sys._current_frames().items()
    )
