"""A quote request retried with its Idempotency-Key (a timeout, a double click) answers with the quote it issued:
one quote number for one job, as a plan's key does (services/plans)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from services.core.db import make_engine, make_sessionmaker, unit_of_work
from services.orgs.service import create_key, create_organization
from tests.api.conftest import QLORA_PLAN
from tests.api.served import serve


def _done_plan(client: httpx.Client) -> dict[str, Any]:
    plan_id = client.post("/v1/plans", json=QLORA_PLAN).json()["id"]
    deadline = time.monotonic() + 15
    while True:
        body: dict[str, Any] = client.get(f"/v1/plans/{plan_id}").json()
        if body["status"] in ("done", "failed") or time.monotonic() > deadline:
            assert body["status"] == "done", body
            return body
        time.sleep(0.1)


def test_a_retried_quote_request_with_its_idempotency_key_is_one_quote(tmp_path: Path) -> None:
    """A probe: four requests at once with one Idempotency-Key issued four quotes (four numbers for one job), and a
    retry after a timeout issued another; the header was ignored."""
    url = f"sqlite:///{tmp_path / 'gpuplan.db'}"
    with serve(url, tmp_path) as served:
        with unit_of_work(make_sessionmaker(make_engine(url))) as session:
            create_organization(session, "other")
            other_key = create_key(session, "other")
        with httpx.Client(base_url=served.base, headers=served.headers, timeout=30) as client:
            plan = _done_plan(client)
            rec = plan["recommendations"][0]
            body = {"gpu": rec["gpu"], "gpus": rec["gpus"], "provider": rec["provider"], "customer_name": "Ada"}
            quotes = f"/v1/plans/{plan['id']}/quotes"

            def post(key: str, json: dict[str, Any] = body) -> httpx.Response:
                return client.post(quotes, json=json, headers={"Idempotency-Key": key})

            with ThreadPoolExecutor(4) as pool:
                answers = list(pool.map(lambda _: post("order-17"), range(4)))
            assert sorted(a.status_code for a in answers) == [200, 200, 200, 201], [a.text for a in answers]
            assert len({a.json()["id"] for a in answers}) == 1
            first = next(a.json() for a in answers if a.status_code == 201)
            assert first["total_usd"] == rec["expected_cost_usd"]

            again = post("order-17")
            assert again.status_code == 200 and again.json() == first
            assert again.headers["Location"] == f"/v1/quotes/{first['id']}"
            listed = client.get("/v1/quotes").json()["items"]
            assert [q["id"] for q in listed] == [first["id"]]

            # The key with another body is a conflict naming the header; a new key is a new quote.
            other = post("order-17", {**body, "customer_name": "Grace"})
            assert other.status_code == 409 and other.json()["field"] == "Idempotency-Key", other.text
            assert post("order-18").status_code == 201
            empty = post("")
            assert empty.status_code == 422 and empty.json()["field"] == "Idempotency-Key", empty.text
            # Another organization's key space is its own: its plan and its quote.
            headers = {"Authorization": f"Bearer {other_key}"}
            with httpx.Client(base_url=served.base, headers=headers, timeout=30) as theirs:
                their_plan = _done_plan(theirs)
                mine = theirs.post(
                    f"/v1/plans/{their_plan['id']}/quotes", json=body, headers={"Idempotency-Key": "order-17"}
                )
                assert mine.status_code == 201 and mine.json()["id"] != first["id"], mine.text
                assert theirs.post(quotes, json=body, headers={"Idempotency-Key": "order-17"}).status_code == 404
