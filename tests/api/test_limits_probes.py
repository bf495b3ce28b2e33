"""Issue 21's limit probes replayed against the real app (SQLite and PostgreSQL): every list endpoint pages
with a cursor, keys per organization are capped (atomically), failed sign-ins are limited per client
address (API and dashboard), a key's rate limit holds on the dashboard, sign-ins and plan creation are
audited, price lists with a byte-order mark or one provider in two cases import as one, and runs in the
server's shared bucket live under their organization's own prefix."""

from __future__ import annotations

import re
import threading
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import select

from services.api.app import create_app
from services.core.db import make_engine, make_sessionmaker, unit_of_work
from services.core.settings import Settings
from services.orgs.tables import AuditEvent
from tests.api.conftest import QLORA_PLAN, Api
from tests.dashboard.conftest import csrf_token, sign_in

LISTS = ("/v1/keys", "/v1/nodes", "/v1/runs", "/v1/datasets", "/v1/benchmarks", "/v1/plans", "/v1/audit")


def _app(api: Api, **settings: Any) -> TestClient:
    return TestClient(create_app(Settings(database_url=api.url, **settings)))


def _all_pages(client: TestClient, path: str, headers: dict[str, str], limit: int) -> list[list[str]]:
    pages, cursor = [], None
    while True:
        params: dict[str, Any] = {"limit": limit, **({"before": cursor} if cursor else {})}
        body = client.get(path, params=params, headers=headers).json()
        pages.append([item["id"] for item in body["items"]])
        cursor = body["next_cursor"]
        if cursor is None:
            return pages


def test_every_list_endpoint_pages_with_a_cursor(api: Api) -> None:
    admin = api.headers("admin")
    with _app(api) as client:
        for n in range(7):
            assert client.post("/v1/nodes", json={"name": f"n{n}", "gpu": "T4"}, headers=admin).status_code == 201
            assert client.post("/v1/keys", json={"name": f"k{n}"}, headers=admin).status_code == 201
        for path, total in (("/v1/nodes", 7), ("/v1/keys", 9)):  # alpha's two keys and the seven new ones
            pages = _all_pages(client, path, admin, limit=3)
            ids = [i for page in pages for i in page]
            assert [len(p) for p in pages][:-1] == [3] * (len(pages) - 1) and len(ids) == len(set(ids)) == total
            every = client.get(path, params={"limit": 500}, headers=admin).json()
            assert [i["id"] for i in every["items"]] == ids and every["next_cursor"] is None
        for path in LISTS:
            stranger = client.get(path, params={"before": "f" * 32}, headers=admin)
            assert stranger.status_code == 422, (path, stranger.text)
            assert stranger.json()["field"] in ("before", "query.before"), (path, stranger.json())
            assert client.get(path, params={"limit": 100_000}, headers=admin).status_code == 422, path
        # Another organization's cursor is no cursor here.
        node = client.get("/v1/nodes", headers=admin).json()["items"][0]["id"]
        assert client.get("/v1/nodes", params={"before": node}, headers=api.headers("beta")).status_code == 422


def test_keys_per_organization_are_capped_even_under_concurrency(api: Api) -> None:
    admin = api.headers("admin")
    with _app(api, quota_keys=5) as client:
        answers: list[int] = []

        def mint(n: int) -> None:
            answers.append(client.post("/v1/keys", json={"name": f"c{n}"}, headers=admin).status_code)

        threads = [threading.Thread(target=mint, args=(n,)) for n in range(12)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        usable = client.get("/v1/keys", params={"limit": 500}, headers=admin).json()["items"]
        assert len(usable) == 5 and answers.count(201) == 3  # alpha held 2 (its key and the admin key)
        refused = client.post("/v1/keys", json={"name": "more"}, headers=admin)
        assert refused.status_code == 429 and refused.json()["field"] == "keys" and "revoke one" in refused.text
        victim = next(k for k in usable if (k["name"] or "").startswith("c"))
        assert client.post(f"/v1/keys/{victim['id']}/revoke", headers=admin).status_code == 200
        assert client.post("/v1/keys", json={"name": "after"}, headers=admin).status_code == 201


def test_failed_sign_ins_are_limited_per_client_address_on_the_api_and_the_dashboard(api: Api) -> None:
    with _app(api, auth_failures_per_minute=5) as client:
        wrong = {"Authorization": "Bearer gp_not-a-real-key"}
        codes = [client.get("/v1/plans", headers=wrong).status_code for _ in range(5)]
        assert codes == [401] * 5
        blocked = client.get("/v1/plans", headers=wrong)
        assert blocked.status_code == 429 and blocked.json()["field"] == "authorization"
        assert 1 <= int(blocked.headers["Retry-After"]) <= 60
        # The address is held before its key is looked at: even a real key waits for the window.
        assert client.get("/v1/plans", headers=api.headers()).status_code == 429
    with _app(api, auth_failures_per_minute=3) as client:
        page = client.get("/dashboard/login")
        token = csrf_token(page.text)
        tries = [
            client.post(
                "/dashboard/login", data={"csrf_token": token, "api_key": "gp_wrong", "next": "/dashboard/plans"}
            ).status_code
            for _ in range(4)
        ]
        assert tries == [401, 401, 401, 429]


def test_a_keys_rate_limit_holds_on_the_dashboard_and_sign_ins_are_audited(api: Api) -> None:
    with _app(api, rate_limit_per_minute=6) as client:
        sign_in(client, api.keys["alpha"])
        codes = [client.get("/dashboard/plans").status_code for _ in range(10)]
        assert 429 in codes and codes.index(429) <= 6
    with _app(api) as client:
        page = client.get("/dashboard/login")
        client.post(
            "/dashboard/login",
            data={"csrf_token": csrf_token(page.text), "api_key": "gp_typo", "next": "/dashboard/plans"},
        )
        sign_in(client, api.keys["alpha"])
        assert client.post("/v1/plans", json=QLORA_PLAN, headers=api.headers()).status_code == 202
    factory = make_sessionmaker(make_engine(api.url))
    with unit_of_work(factory) as session:
        actions = {(e.action, e.actor) for e in session.scalars(select(AuditEvent))}
    assert ("dashboard.sign_in_failed", "anonymous") in actions
    assert any(action == "dashboard.sign_in" for action, _ in actions)
    assert any(action == "plan.create" and actor.startswith("key:gp_") for action, actor in actions)
    assert not any("gp_typo" in actor for _, actor in actions)


def test_a_price_list_with_a_bom_and_one_provider_in_two_cases_is_one_provider(api: Api) -> None:
    headers = {**api.headers("admin"), "Content-Type": "text/csv"}
    with _app(api) as client:
        first = "\ufeffprovider,gpu,on_demand_usd_per_hour,region\nacme,H100 SXM,3.10,eu\n"
        answer = client.post("/v1/admin/catalog/offers", content=first.encode(), headers=headers)
        assert answer.status_code == 201, answer.text
        again = "provider,gpu,on_demand_usd_per_hour,region\nACME ,A100 80GB,1.90,eu\n"
        assert client.post("/v1/admin/catalog/offers", content=again.encode(), headers=headers).status_code == 201
        offers = client.get("/v1/catalog/offers", headers=api.headers("admin")).json()
        items = offers["items"] if isinstance(offers, dict) else offers
        names = {o["provider"] for o in items if o["provider"].casefold() == "acme"}
        assert names == {"acme"}
        twice = "provider,gpu,on_demand_usd_per_hour,region\nAcme,L4,0.5,eu\nacme,L4,0.6,eu\n"
        refused = client.post("/v1/admin/catalog/offers", content=twice.encode(), headers=headers)
        # The file's own check names the row (provider and region in any case, as the import matches them).
        assert refused.status_code == 422 and "row 2: duplicate offer for acme L4 x1" in refused.text


def test_runs_in_the_shared_bucket_are_under_their_organizations_prefix(api: Api) -> None:
    with _app(api, s3_bucket="shared-bucket") as client:
        headers = api.headers()
        plan = client.post("/v1/plans", json=QLORA_PLAN, headers=headers).json()["id"]
        api.client = client
        assert api.wait_for_plan(plan)["status"] == "done"
        node = client.post("/v1/nodes", json={"name": "g", "gpu": "A100 80GB"}, headers=headers).json()["id"]
        body = {"node_ids": [node], "checkpoint_dir": "/data/out"}
        default = client.post(f"/v1/plans/{plan}/runs", json=body, headers=headers).json()
        assert re.fullmatch(rf"orgs/[0-9a-f]{{32}}/runs/{default['id']}", default["prefix"]), default["prefix"]
        org = default["prefix"].split("/")[1]
        # A prefix naming another organization's namespace stays inside this one's.
        chosen = client.post(
            f"/v1/plans/{plan}/runs", json={**body, "prefix": "orgs/other/runs/x"}, headers=headers
        ).json()
        assert chosen["prefix"] == f"orgs/{org}/orgs/other/runs/x"
        own = client.post(
            f"/v1/plans/{plan}/runs", json={**body, "bucket": "my-own-bucket", "prefix": "ckpt/a"}, headers=headers
        ).json()
        assert own["prefix"] == "ckpt/a"  # the organization's own bucket: as given
