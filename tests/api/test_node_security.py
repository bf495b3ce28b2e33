"""Provider calls built from tenant input (issue 15.1), reproduced through the real API on SQLite and
PostgreSQL with the http driver pointed at a loopback provider that records every request."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from services.api.app import create_app
from services.core.db import make_engine, make_sessionmaker, unit_of_work, utcnow
from services.core.settings import Settings
from services.nodes.lifecycle import sweep
from services.nodes.providers import make_driver
from services.nodes.tables import NodeEventRow, NodeInstanceRow, NodeRow
from services.orgs.service import create_key, create_organization
from tests.conftest import bounded_test_client
from tests.databases import migrate
from tests.nodes.fake_provider import FakeProvider, running_provider
from tests.nodes.helpers import SLOW_AGENT

ATTACK_ID = "x/../../../admin/wipe-all?force=true#"
OPERATOR_TOKEN = "Bearer operator-s3cret-token"


@dataclass
class Secured:
    client: TestClient
    url: str
    keys: dict[str, str]
    provider: FakeProvider
    settings: Settings

    def headers(self, org: str = "alpha", token: str | None = None) -> dict[str, str]:
        headers = {"Authorization": f"Bearer {self.keys[org]}"}
        return {**headers, "X-Node-Token": token} if token is not None else headers

    def register(self, org: str = "alpha", **fields: object) -> dict[str, object]:
        body = {"name": "gpu-1", "gpu": "A100 80GB", **fields}
        response = self.client.post("/v1/nodes", json=body, headers=self.headers(org))
        assert response.status_code == 201, response.text
        return dict(response.json())

    def sweep_at(self, minutes: float) -> None:
        factory = make_sessionmaker(make_engine(self.url))
        with unit_of_work(factory) as session:
            sweep(session, utcnow() + timedelta(minutes=minutes), make_driver(self.settings), 3600)


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    yield from running_provider()


@pytest.fixture
def secured(database_url: str, provider: FakeProvider) -> Iterator[Secured]:
    migrate(database_url)
    factory = make_sessionmaker(make_engine(database_url))
    with unit_of_work(factory) as session:
        keys = {}
        for org in ("alpha", "beta"):
            create_organization(session, org)
            keys[org] = create_key(session, org)
    settings = Settings(
        database_url=database_url,
        provider_driver="http",
        provider_stop_url=provider.url + "/v1/instances/{instance_id}/stop",
        provider_auth_value=OPERATOR_TOKEN,
    )
    with bounded_test_client(create_app(settings)) as client:
        yield Secured(client, database_url, keys, provider, settings)


def test_the_path_traversal_instance_id_is_refused_and_reaches_no_provider(secured: Secured) -> None:
    response = secured.client.post(
        "/v1/nodes", json={"name": "evil", "gpu": "A100 80GB", "instance_id": ATTACK_ID}, headers=secured.headers()
    )
    assert response.status_code == 422, response.text
    assert response.json()["field"] == "instance_id"
    # Even a row that bypassed registration (written before this check existed) makes no call: the driver
    # checks the id again before it builds any URL, and the refusal is an event with its reason.
    node = secured.register()
    factory = make_sessionmaker(make_engine(secured.url))
    with unit_of_work(factory) as session:
        row = session.get(NodeRow, node["id"])
        assert row is not None
        row.instance_id = ATTACK_ID
        row.agent_verified_at = row.idle_since = utcnow() - timedelta(hours=1)
        session.add(NodeInstanceRow(organization_id=row.organization_id, instance_id=ATTACK_ID, provider=""))
    secured.sweep_at(30)
    assert secured.provider.calls == []
    events = secured.client.get(f"/v1/nodes/{node['id']}/events", headers=secured.headers()).json()["items"]
    assert events[0]["kind"] == "stop_failed" and "not a http instance id" in events[0]["reason"]
    assert "s3cret" not in str(events)


def test_an_instance_belongs_to_the_first_organization_that_registers_it(secured: Secured) -> None:
    first = secured.register("alpha", instance_id="i-0abc1234def567890")
    stolen = secured.client.post(
        "/v1/nodes",
        json={"name": "thief", "gpu": "A100 80GB", "instance_id": "i-0abc1234def567890"},
        headers=secured.headers("beta"),
    )
    assert stolen.status_code == 409 and stolen.json()["field"] == "instance_id", stolen.text
    assert secured.client.get("/v1/nodes", headers=secured.headers("beta")).json()["items"] == []
    # The owner's agent restarting registers again: the older node is replaced, never stopped twice.
    again = secured.register("alpha", instance_id="i-0abc1234def567890")
    old = secured.client.get(f"/v1/nodes/{first['id']}", headers=secured.headers()).json()
    assert old["status"] == "replaced" and again["status"] == "active"
    beat = secured.client.post(
        f"/v1/nodes/{first['id']}/heartbeat", json={}, headers=secured.headers(token=str(first["node_token"]))
    )
    assert beat.status_code == 401  # the replaced node's token no longer works


def test_heartbeats_and_reports_need_the_node_token(secured: Secured) -> None:
    node = secured.register()
    other = secured.register(name="gpu-2")
    url = f"/v1/nodes/{node['id']}/heartbeat"
    missing = secured.client.post(url, json={}, headers=secured.headers())
    assert missing.status_code == 401 and missing.json()["field"] == "X-Node-Token"
    for wrong in ("not-the-token", str(other["node_token"])):
        assert secured.client.post(url, json={}, headers=secured.headers(token=wrong)).status_code == 401
    # The right token with another organization's key: that organization has no such node.
    assert (
        secured.client.post(url, json={}, headers=secured.headers("beta", str(node["node_token"]))).status_code == 404
    )
    assert secured.client.post(url, json={}, headers=secured.headers(token=str(node["node_token"]))).status_code == 200
    claim = f"/v1/nodes/{node['id']}/calibrations/next"
    assert secured.client.post(claim, json={}, headers=secured.headers()).status_code == 401
    assert (
        secured.client.post(claim, json={}, headers=secured.headers(token=str(node["node_token"]))).status_code == 204
    )
    # The token is shown once: never in a later read.
    listed = secured.client.get("/v1/nodes", headers=secured.headers()).text
    assert str(node["node_token"]) not in listed and "node_token" not in listed
    factory = make_sessionmaker(make_engine(secured.url))
    with unit_of_work(factory) as session:
        row = session.get(NodeRow, str(node["id"]))
        assert row is not None and row.token_hash is not None and str(node["node_token"]) not in row.token_hash


def test_a_stop_goes_only_to_an_instance_the_org_registered_through_a_proven_agent(secured: Secured) -> None:
    owned = secured.register(instance_id="i-0abc1234def567890", name="owned")
    silent = secured.register(instance_id="i-0fff1234def567890", name="silent")
    token = str(owned["node_token"])
    # The owned node's agent reports idle with its token; the silent one only sends token-less heartbeats.
    assert secured.client.post(
        f"/v1/nodes/{owned['id']}/heartbeat", json=SLOW_AGENT, headers=secured.headers(token=token)
    ).is_success
    assert (
        secured.client.post(f"/v1/nodes/{silent['id']}/heartbeat", json={}, headers=secured.headers()).status_code
        == 401
    )
    factory = make_sessionmaker(make_engine(secured.url))
    with unit_of_work(factory) as session:
        row = session.get(NodeRow, str(silent["id"]))
        assert row is not None
        row.idle_since = utcnow()  # as if it were idle: only the missing proof keeps it from a stop
        row.heartbeat_interval_s = SLOW_AGENT["heartbeat_interval_s"]  # the sweep 30 min on counts them as idle
    secured.sweep_at(30)
    assert [(c.method, c.path) for c in secured.provider.calls] == [("POST", "/v1/instances/i-0abc1234def567890/stop")]
    assert secured.provider.calls[0].headers["authorization"] == OPERATOR_TOKEN
    with unit_of_work(factory) as session:
        kinds = {
            e.node_id: (e.kind, e.reason)
            for e in session.scalars(select(NodeEventRow).where(NodeEventRow.kind.in_(("stop", "stop_failed"))))
        }
    assert kinds[str(owned["id"])][0] == "stop"
    assert kinds[str(silent["id"])] == ("stop_failed", kinds[str(silent["id"])][1])
    assert "proved itself with the node token" in kinds[str(silent["id"])][1]
