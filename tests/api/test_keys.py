"""Keys through the real app on SQLite and Postgres: each scope allows what it names and nothing else,
an agent key acts only for its node and run, revocation holds from the next request, rotation and
expiry, the audit log, and a dashboard sign-out that ends the session on the server."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import update

from services.core.db import make_engine, make_sessionmaker, unit_of_work, utcnow
from services.orgs.tables import ApiKey
from tests.api.conftest import QLORA_PLAN, Api
from tests.dashboard.conftest import csrf_token, sign_in


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _new_key(api: Api, **body: Any) -> dict[str, Any]:
    response = api.client.post("/v1/keys", json=body, headers=api.headers("admin"))
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    return created


def test_each_scope_allows_its_routes_only(api: Api) -> None:
    read = _new_key(api, scopes=["read"], name="dashboards")["key"]
    plan = _new_key(api, scopes=["plan"])["key"]
    c = api.client
    plan_id = c.post("/v1/plans", json=QLORA_PLAN, headers=api.headers()).json()["id"]

    assert c.get("/v1/plans", headers=_auth(read)).status_code == 200
    assert c.get(f"/v1/plans/{plan_id}", headers=_auth(read)).status_code == 200
    refused = c.post("/v1/plans", json=QLORA_PLAN, headers=_auth(read))
    assert refused.status_code == 403 and refused.json()["field"] == "authorization"
    assert "needs one of: plan" in refused.json()["message"]
    assert c.post("/v1/estimate", json=QLORA_PLAN, headers=_auth(read)).status_code == 403

    assert c.post("/v1/plans", json=QLORA_PLAN, headers=_auth(plan)).status_code == 202
    assert c.get("/v1/plans", headers=_auth(plan)).status_code == 403  # plan without read cannot list

    for key in (read, plan, api.keys["alpha"]):  # only admin keys manage keys and read the audit log
        assert c.get("/v1/keys", headers=_auth(key)).status_code == 403
        assert c.get("/v1/audit", headers=_auth(key)).status_code == 403
        assert c.post("/v1/keys", json={}, headers=_auth(key)).status_code == 403
    assert c.get("/v1/keys", headers=api.headers("admin")).status_code == 200


def test_an_agent_key_acts_only_for_its_node_and_run(api: Api) -> None:
    c = api.client
    registered = c.post("/v1/nodes", json={"name": "n1", "gpu": "T4"}, headers=api.headers()).json()
    mine, token = registered["id"], {"X-Node-Token": registered["node_token"]}
    other_node = c.post("/v1/nodes", json={"name": "n2", "gpu": "T4"}, headers=api.headers()).json()
    other, other_token = other_node["id"], {"X-Node-Token": other_node["node_token"]}
    unbound = c.post("/v1/keys", json={"scopes": ["agent"]}, headers=api.headers("admin"))
    assert unbound.status_code == 422 and unbound.json()["field"] == "node_id"
    foreign = c.post("/v1/keys", json={"scopes": ["agent"], "node_id": "f" * 32}, headers=api.headers("admin"))
    assert foreign.status_code == 422 and foreign.json()["field"] == "node_id"
    mixed = c.post("/v1/keys", json={"scopes": ["agent", "read"], "node_id": mine}, headers=api.headers("admin"))
    assert mixed.status_code == 422
    agent = _new_key(api, scopes=["agent"], node_id=mine)
    assert agent["node_id"] == mine and agent["scopes"] == ["agent"]
    key = agent["key"]

    assert c.post(f"/v1/nodes/{mine}/heartbeat", json={}, headers={**_auth(key), **token}).status_code == 200
    # Even with the other node's own token, this key is not that node's.
    assert c.post(f"/v1/nodes/{other}/heartbeat", json={}, headers={**_auth(key), **other_token}).status_code == 403
    assert c.post(f"/v1/nodes/{other}/calibrations/next", headers={**_auth(key), **other_token}).status_code == 403
    assert c.post(f"/v1/nodes/{mine}/calibrations/next", headers={**_auth(key), **token}).status_code == 204
    for method, path in (
        ("GET", "/v1/plans"),
        ("GET", f"/v1/nodes/{mine}"),
        ("POST", "/v1/nodes"),
        ("POST", "/v1/estimate"),
        ("GET", "/v1/runs"),
        ("GET", "/v1/keys"),
    ):
        response = c.request(method, path, json=QLORA_PLAN if method == "POST" else None, headers=_auth(key))
        assert response.status_code == 403, (method, path, response.text)

    # A run the node is in: the agent may read it and report checkpoints; another run is refused.
    plan_id = c.post("/v1/plans", json=QLORA_PLAN, headers=api.headers()).json()["id"]
    api.wait_for_plan(plan_id)
    runs = []
    for node in (mine, other):
        body = {"node_ids": [node], "checkpoint_dir": "/data/out", "bucket": "gpuplan-checkpoints"}
        created = c.post(f"/v1/plans/{plan_id}/runs", json=body, headers=api.headers())
        assert created.status_code == 201, created.text
        runs.append(created.json()["id"])
    assert c.get(f"/v1/runs/{runs[0]}", headers=_auth(key)).status_code == 200
    assert c.get(f"/v1/runs/{runs[1]}", headers=_auth(key)).status_code == 403
    join_other = c.post(f"/v1/runs/{runs[0]}/nodes", json={"node_id": other}, headers={**_auth(key), **other_token})
    assert join_other.status_code == 403
    # Bound to a run: only that run.
    run_key = _new_key(api, scopes=["agent"], node_id=mine, run_id=runs[0])["key"]
    assert c.get(f"/v1/runs/{runs[0]}", headers=_auth(run_key)).status_code == 200
    assert c.get(f"/v1/runs/{runs[1]}", headers=_auth(run_key)).status_code == 403


def test_revocation_holds_from_the_next_request_and_rotation_replaces_a_key(api: Api) -> None:
    c = api.client
    made = _new_key(api, scopes=["read", "plan"], name="ci")
    key = made["key"]
    assert c.get("/v1/plans", headers=_auth(key)).status_code == 200
    listed = c.get("/v1/keys", headers=api.headers("admin")).json()["items"]
    assert made["id"] in [k["id"] for k in listed]
    assert all("key" not in k and k["prefix"].startswith("gp_") for k in listed)

    rotated = c.post(f"/v1/keys/{made['id']}/rotate", json={"grace_s": 0}, headers=api.headers("admin"))
    assert rotated.status_code == 201, rotated.text
    new = rotated.json()
    assert new["rotated_from_id"] == made["id"] and new["scopes"] == ["read", "plan"] and new["name"] == "ci"
    assert c.get("/v1/plans", headers=_auth(key)).status_code == 401  # the old key: the very next request
    assert c.get("/v1/plans", headers=_auth(new["key"])).status_code == 200

    revoked = c.post(f"/v1/keys/{new['id']}/revoke", headers=api.headers("admin"))
    assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
    assert c.get("/v1/plans", headers=_auth(new["key"])).status_code == 401
    assert c.post(f"/v1/keys/{new['id']}/rotate", headers=api.headers("admin")).status_code == 409
    # Another organization's key id is not found, not revoked.
    beta_admin = c.post("/v1/keys/" + "0" * 32 + "/revoke", headers=api.headers("admin"))
    assert beta_admin.status_code == 404
    assert c.get("/v1/keys", params={"include_revoked": True}, headers=api.headers("admin")).status_code == 200

    graced = _new_key(api, scopes=["read"])
    answer = c.post(f"/v1/keys/{graced['id']}/rotate", json={"grace_s": 3600}, headers=api.headers("admin"))
    assert answer.status_code == 201
    assert c.get("/v1/plans", headers=_auth(graced["key"])).status_code == 200  # still in its grace period


def test_an_expired_key_is_refused(api: Api) -> None:
    made = _new_key(api, scopes=["read"], expires_in_s=3600)
    assert made["expires_at"] is not None
    assert api.client.get("/v1/plans", headers=_auth(made["key"])).status_code == 200
    with unit_of_work(make_sessionmaker(make_engine(api.url))) as session:
        session.execute(
            update(ApiKey).where(ApiKey.id == made["id"]).values(expires_at=utcnow() - timedelta(seconds=1))
        )
    refused = api.client.get("/v1/plans", headers=_auth(made["key"]))
    assert refused.status_code == 401 and "expired" in refused.json()["message"]
    bad = api.client.post("/v1/keys", json={"expires_in_s": 5}, headers=api.headers("admin"))
    assert bad.status_code == 422 and "expires_in_s" in bad.text
    bad_scope = api.client.post("/v1/keys", json={"scopes": ["root"]}, headers=api.headers("admin"))
    assert bad_scope.status_code == 422 and "scopes" in bad_scope.text


def test_the_audit_log_names_who_what_when_and_where_for_the_org_s_admins(api: Api) -> None:
    made = _new_key(api, scopes=["read"], name="auditor")
    api.client.post(f"/v1/keys/{made['id']}/revoke", headers=api.headers("admin"))
    events = api.client.get("/v1/audit", headers=api.headers("admin")).json()["items"]
    assert [e["action"] for e in events[:2]] == ["key.revoke", "key.create"]
    admin_prefix = api.keys["admin"][:10]
    assert all(e["actor"] == f"key:{admin_prefix}" and e["remote_addr"] == "testclient" for e in events[:2])
    assert events[0]["target"] == f"key:{made['prefix']}" and events[0]["created_at"]
    page = api.client.get("/v1/audit", params={"limit": 1}, headers=api.headers("admin")).json()
    rest = api.client.get("/v1/audit", params={"before": page["next_cursor"]}, headers=api.headers("admin")).json()
    assert page["items"][0]["id"] == events[0]["id"] and rest["items"][0]["id"] == events[1]["id"]
    # Another organization's admin sees none of it.
    beta_admin = api.client.post("/v1/keys", json={}, headers=api.headers("beta"))
    assert beta_admin.status_code == 403


def test_dashboard_sign_out_ends_the_session_on_the_server(api: Api) -> None:
    c = api.client
    sign_in(c, api.keys["alpha"])
    cookie = next(ck for ck in c.cookies.jar if ck.name == "gpuplan_session").value
    assert c.get("/dashboard/plans").status_code == 200
    token = csrf_token(c.get("/dashboard/plans").text)
    assert c.post("/dashboard/logout", data={"csrf_token": token}, follow_redirects=False).status_code == 303
    # A copy of the signed-in cookie, replayed after the sign-out, no longer works.
    c.cookies.clear()
    c.cookies.set("gpuplan_session", cookie)
    replay = c.get("/dashboard/plans", follow_redirects=False)
    assert replay.status_code == 303 and "/dashboard/login" in replay.headers["location"]
    # Revoking the key ends its sessions too; an agent or a read-less key cannot sign in.
    c.cookies.clear()
    made = _new_key(api, scopes=["read"])
    sign_in(c, made["key"])
    assert c.get("/dashboard/plans").status_code == 200
    new_plan = c.post("/dashboard/plans", data={"csrf_token": csrf_token(c.get("/dashboard/plans/new").text)})
    assert new_plan.status_code == 403  # read only: no planning from the dashboard either
    api.client.post(f"/v1/keys/{made['id']}/revoke", headers=api.headers("admin"))
    assert c.get("/dashboard/plans", follow_redirects=False).status_code == 303


def test_a_platform_admin_key_is_not_rotated_over_the_api(api: Api) -> None:
    from services.orgs.service import create_key

    with unit_of_work(make_sessionmaker(make_engine(api.url))) as session:
        platform = create_key(session, "alpha", platform_admin=True)
    listed = api.client.get("/v1/keys", headers=api.headers("admin")).json()["items"]
    platform_id = next(k["id"] for k in listed if k["prefix"] == platform[:10])
    refused = api.client.post(f"/v1/keys/{platform_id}/rotate", headers=api.headers("admin"))
    assert refused.status_code == 409 and "gpuplan admin rotate-key" in refused.json()["message"]
    assert api.client.get("/v1/plans", headers=_auth(platform)).status_code == 200  # still its key


def test_an_unknown_field_of_a_key_request_points_at_the_requests_schema_not_the_plans(api: Api) -> None:
    """An input probe of stop 53: POST /v1/keys with a field it does not have was told to check the plan schema."""
    response = api.client.post("/v1/keys", json={"expires_at": "2027-01-01"}, headers=api.headers("admin"))
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["field"] == "expires_at" and "this request's schema (/docs)" in body["message"], body
    assert "plan schema" not in body["message"]
