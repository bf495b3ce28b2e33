"""Stops through the real API and sweep (issue 21.3, issue 25.4 and 25.7), on SQLite and PostgreSQL, with the
http driver pointed at a loopback provider: a provider that ignores stops ends in ``stop_failed`` after its
retries with backoff, visible in the API and on the dashboard; a provider that answers slowly delays no
other organization's requests, because no transaction is open while it is called."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from prometheus_client import REGISTRY
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from services.api.app import create_app
from services.core.db import make_engine, make_sessionmaker, unit_of_work, utcnow
from services.core.settings import Settings
from services.nodes.lifecycle import run_sweep
from services.nodes.tables import NodeEventRow, NodeRow
from services.orgs.service import Principal, create_key, create_organization
from services.orgs.tables import AuditEvent
from tests.api.conftest import QLORA_PLAN
from tests.conftest import bounded_test_client
from tests.dashboard.conftest import sign_in
from tests.databases import migrate
from tests.nodes.fake_provider import FakeProvider, running_provider
from tests.nodes.helpers import SLOW_AGENT, beat, load_node

INSTANCE = "i-0abc1234def567890"


@dataclass
class Stack:
    client: TestClient
    url: str
    factory: sessionmaker[Session]
    keys: dict[str, str]
    orgs: dict[str, str]
    provider: FakeProvider
    settings: Settings

    def headers(self, org: str = "alpha", token: str | None = None) -> dict[str, str]:
        headers = {"Authorization": f"Bearer {self.keys[org]}"}
        return {**headers, "X-Node-Token": token} if token is not None else headers

    def idle_node(self, org: str = "alpha", instance_id: str = INSTANCE) -> tuple[str, str]:
        """A node whose proven agent reported idle; returns its id and token."""
        body = {"name": f"{org}-gpu", "gpu": "A100 80GB", "instance_id": instance_id}
        node = self.client.post("/v1/nodes", json=body, headers=self.headers(org)).json()
        beat = self.client.post(
            f"/v1/nodes/{node['id']}/heartbeat", json=SLOW_AGENT, headers=self.headers(org, node["node_token"])
        )
        assert beat.status_code == 200, beat.text
        return str(node["id"]), str(node["node_token"])

    def beat(self, node_id: str, token: str, at: datetime, org: str = "alpha") -> None:
        """An idle heartbeat at ``at``, through the heartbeat service with the app's stop settings. The test's clock
        jumps minutes between heartbeats, so its agent declares the longest interval: those gaps are its cadence."""
        beat(self.factory, self.settings, Principal(self.orgs[org], org, False), node_id, token, at)

    def node(self, node_id: str) -> NodeRow:
        return load_node(self.factory, node_id)


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    yield from running_provider()


def _stack(database_url: str, provider: FakeProvider, **settings: object) -> Iterator[Stack]:
    migrate(database_url)
    factory = make_sessionmaker(make_engine(database_url))
    keys, orgs = {}, {}
    with unit_of_work(factory) as session:
        for org in ("alpha", "beta"):
            orgs[org] = create_organization(session, org).id
            keys[org] = create_key(session, org)
    config = Settings(
        database_url=database_url,
        provider_driver="http",
        provider_stop_url=provider.url + "/v1/instances/{instance_id}/stop",
        idle_sweep_interval_s=3600,  # the test runs each sweep itself
        **settings,  # type: ignore[arg-type]
    )
    with bounded_test_client(create_app(config)) as client:
        yield Stack(client, database_url, factory, keys, orgs, provider, config)


@pytest.fixture
def stack(database_url: str, provider: FakeProvider) -> Iterator[Stack]:
    yield from _stack(
        database_url,
        provider,
        node_stop_max_attempts=3,
        node_stop_backoff_s=60,
        node_stop_backoff_max_s=3600,
        node_stop_grace_s=120,
        node_stop_timeout_s=10,
        node_lost_after_s=3600,  # the test's clock jumps ahead of the heartbeats
    )


def _given_up() -> float:
    return REGISTRY.get_sample_value("gpuplan_node_stop_failed_total") or 0.0


def test_a_stop_the_provider_ignores_ends_in_stop_failed_after_retries_with_backoff(stack: Stack) -> None:
    node_id, token = stack.idle_node()
    t0 = utcnow()
    given_up_before = _given_up()
    # (sweep at, heartbeats after it, the backoff its failure starts): attempt k waits 60 * 2^(k-1) s.
    sweep_at = t0 + timedelta(minutes=20)  # idle 20 min >= 15: a stop
    for attempt, backoff_s in ((1, 60), (2, 120), (3, None)):
        run_sweep(stack.factory, stack.settings, now=sweep_at)
        assert len(stack.provider.calls) == attempt, "one provider call per attempt"
        row = stack.node(node_id)
        assert (row.status, row.stop_attempts) == ("stopped", attempt)
        # The machine shuts down for a while: a heartbeat within the grace period changes nothing.
        stack.beat(node_id, token, sweep_at + timedelta(seconds=60))
        assert stack.node(node_id).status == "stopped"
        # Past the grace period it still reports idle: the stop changed nothing, a failed attempt.
        seen_at = sweep_at + timedelta(seconds=180)
        stack.beat(node_id, token, seen_at)
        row = stack.node(node_id)
        if backoff_s is None:
            break
        assert row.status == "active" and row.next_stop_at == seen_at + timedelta(seconds=backoff_s)
        assert "still heartbeats 180 s later" in (row.last_stop_answer or "")
        # Sweeps during the backoff send nothing.
        run_sweep(stack.factory, stack.settings, now=seen_at + timedelta(seconds=backoff_s - 1))
        assert len(stack.provider.calls) == attempt
        sweep_at = seen_at + timedelta(seconds=backoff_s + 1)
    # Given up, with a retry an hour on while it reports idle (tests/nodes/test_stop_failed_retries.py).
    assert row.status == "stop_failed" and row.stop_attempts == 3 and row.next_stop_at == seen_at + timedelta(hours=1)
    # Silent since: later sweeps never call the provider again (a node whose heartbeats stop is never stopped).
    for minutes in (60, 120, 600):
        run_sweep(stack.factory, stack.settings, now=t0 + timedelta(minutes=minutes))
    assert len(stack.provider.calls) == 3
    assert _given_up() == given_up_before + 1

    with unit_of_work(stack.factory) as session:
        actions = [
            a
            for (a,) in session.execute(
                select(AuditEvent.action).where(AuditEvent.target == f"node:{node_id}").order_by(AuditEvent.created_at)
            )
        ]
        kinds = [
            k
            for (k,) in session.execute(
                select(NodeEventRow.kind).where(NodeEventRow.node_id == node_id).order_by(NodeEventRow.created_at)
            )
        ]
    # One audit row per attempt and one for giving up; not one per sweep.
    assert actions == ["node.stop", "node.stop", "node.stop", "node.stop_failed"], actions
    assert kinds.count("stop") == 3 and kinds.count("stop_ineffective") == 3, kinds

    api = stack.client.get(f"/v1/nodes/{node_id}", headers=stack.headers()).json()
    assert api["status"] == "stop_failed" and api["stop_attempts"] == 3 and api["next_stop_at"] is not None
    assert "the provider confirmed the stop" in api["last_stop_answer"] and "HTTP 200" in api["last_stop_answer"]
    assert "stop attempt 3 of 3 failed" in api["last_reason"] and "given up" in api["last_reason"]

    sign_in(stack.client, stack.keys["alpha"])
    html = stack.client.get("/dashboard/nodes").text
    assert '<span class="badge warn">stop failed</span>' in html
    assert "given up after 3 attempt(s); last answer: the provider confirmed the stop" in html
    assert f"retried after {seen_at + timedelta(hours=1):%Y-%m-%d %H:%M:%S} UTC if it still reports idle" in html


def test_a_provider_that_refuses_is_retried_with_backoff_and_its_answer_is_shown(stack: Stack) -> None:
    stack.provider.status = 503
    node_id, _ = stack.idle_node()
    t0 = utcnow() + timedelta(minutes=20)
    run_sweep(stack.factory, stack.settings, now=t0)
    row = stack.node(node_id)
    assert row.status == "active" and row.stop_attempts == 1
    assert row.next_stop_at == t0 + timedelta(seconds=60) and "HTTP 503" in (row.last_stop_answer or "")
    sign_in(stack.client, stack.keys["alpha"])
    html = stack.client.get("/dashboard/nodes").text
    assert "attempt 1 failed: the provider answered stop with HTTP 503; next attempt after" in html
    for seconds in (30, 59):  # within the backoff: no call
        run_sweep(stack.factory, stack.settings, now=t0 + timedelta(seconds=seconds))
    assert len(stack.provider.calls) == 1
    run_sweep(stack.factory, stack.settings, now=t0 + timedelta(seconds=61))
    row = stack.node(node_id)
    assert len(stack.provider.calls) == 2 and row.next_stop_at == t0 + timedelta(seconds=61 + 120)
    run_sweep(stack.factory, stack.settings, now=t0 + timedelta(seconds=61 + 121))
    row = stack.node(node_id)
    assert len(stack.provider.calls) == 3 and row.status == "stop_failed"
    api = stack.client.get(f"/v1/nodes/{node_id}", headers=stack.headers()).json()
    assert api["status"] == "stop_failed" and "HTTP 503" in api["last_stop_answer"]


def test_a_slow_provider_delays_no_other_organizations_requests(stack: Stack) -> None:
    stack.provider.delay_s = 5.0
    node_id, _ = stack.idle_node("alpha")
    beta_node, beta_token = stack.idle_node("beta", instance_id="i-0fff1234def567890")
    with unit_of_work(stack.factory) as session:
        row = session.get(NodeRow, node_id)
        assert row is not None
        row.idle_since = utcnow() - timedelta(hours=1)  # only alpha's node is due for a stop
    # The sweep on an engine of its own, so the test can see which connections it holds.
    engine = make_engine(stack.url)
    done = threading.Event()
    sweeper = threading.Thread(target=lambda: (run_sweep(make_sessionmaker(engine), stack.settings), done.set()))
    started = time.monotonic()
    sweeper.start()
    deadline = time.monotonic() + 5
    while not stack.provider.calls:  # the stop is with the provider now
        assert time.monotonic() < deadline, "the sweep never called the provider"
        time.sleep(0.01)
    timings = {}
    for name, call in (
        (
            "heartbeat",
            lambda: stack.client.post(
                f"/v1/nodes/{beta_node}/heartbeat", json=SLOW_AGENT, headers=stack.headers("beta", beta_token)
            ),
        ),
        ("plan", lambda: stack.client.post("/v1/plans", json=QLORA_PLAN, headers=stack.headers("beta"))),
        ("list", lambda: stack.client.get("/v1/nodes", headers=stack.headers("alpha"))),
    ):
        t = time.monotonic()
        response = call()
        timings[name] = time.monotonic() - t
        assert response.is_success, response.text
    assert not done.is_set(), "the provider answered before the requests were timed"
    # Waiting for the provider would take its 5 s; half of it leaves room for a loaded machine (0.6 s was seen).
    assert max(timings.values()) < stack.provider.delay_s / 2, timings
    assert engine.pool.checkedout() == 0  # no session or connection of the sweep is open during the call
    listed = {n["id"]: n for n in stack.client.get("/v1/nodes", headers=stack.headers()).json()["items"]}
    assert listed[node_id]["status"] == "stopping" and listed[node_id]["stop_attempts"] == 1
    sweeper.join(timeout=30)
    assert done.is_set() and time.monotonic() - started >= 5.0
    assert stack.node(node_id).status == "stopped"
    with unit_of_work(stack.factory) as session:
        audits = session.scalar(select(func.count()).select_from(AuditEvent).where(AuditEvent.action == "node.stop"))
    assert audits == 1
    engine.dispose()


def test_two_sweeps_at_once_send_one_stop(stack: Stack) -> None:
    stack.provider.delay_s = 1.0
    node_id, _ = stack.idle_node()
    now = utcnow() + timedelta(minutes=20)
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def one() -> None:
        barrier.wait()
        try:
            run_sweep(stack.factory, stack.settings, now=now)
        except Exception as exc:  # SQLite may refuse the second writer; that sweep sends nothing
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(stack.provider.calls) == 1, (stack.provider.calls, errors)
    assert stack.node(node_id).status == "stopped"
