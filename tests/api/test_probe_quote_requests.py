"""Probes of quote requests (stop 51's quote probe): every bad field is a 422 whose ``field`` names it, and a
recommendation's own fields, sent back as they are, quote it."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import func, select

from services.core.db import make_engine, make_sessionmaker, unit_of_work
from services.quotes.tables import QuoteRow
from tests.api.conftest import QLORA_PLAN, Api


def _done_plan(api: Api, plan: dict[str, Any] | None = None) -> dict[str, Any]:
    plan_id = api.client.post("/v1/plans", json=plan or QLORA_PLAN, headers=api.headers()).json()["id"]
    body = api.wait_for_plan(plan_id)
    assert body["status"] == "done", body.get("error")
    return body


def _quote_rows(api: Api) -> int:
    engine = make_engine(api.url)
    try:
        with unit_of_work(make_sessionmaker(engine)) as session:
            return int(session.scalar(select(func.count()).select_from(QuoteRow)) or 0)
    finally:
        engine.dispose()


BAD: list[tuple[dict[str, Any], str]] = [
    ({}, "gpu"),
    ({"gpu": "A40"}, "gpus"),
    ({"gpus": 2}, "gpu"),
    ({"gpu": "", "gpus": 1}, "gpu"),
    ({"gpu": "A40", "gpus": 0}, "gpus"),
    ({"gpu": "A40", "gpus": 1.5}, "gpus"),
    ({"gpu": "A40", "gpus": "2"}, "gpus"),
    ({"gpu": "A40", "gpus": 1, "nodes": 0}, "nodes"),
    ({"gpu": "A40", "gpus": 1, "checkpoint_storage_months": -1.0}, "checkpoint_storage_months"),
    ({"gpu": "A40", "gpus": 1, "checkpoint_storage_months": "3"}, "checkpoint_storage_months"),
    ({"gpu": "A40", "gpus": 1, "customer_name": "x" * 201}, "customer_name"),
    ({"gpu": "A40", "gpus": 1, "customer_name": "   "}, "customer_name"),
    # A bidi override printed the rest of the quote's line backwards (an input probe of stop 53).
    ({"gpu": "A40", "gpus": 1, "customer_name": "Acme \u202eLtd"}, "customer_name"),
    ({"gpu": "A40", "gpus": 1, "customer_email": "nobody"}, "customer_email"),
    ({"gpu": "A40", "gpus": 1, "offer_gpus_per_node": 65}, "offer_gpus_per_node"),
    ({"best_for_gpus": 1, "provider": "no-such-cloud"}, "provider"),
    ({"best_for_gpus": 1, "provider": "vast", "region": "mars-1"}, "region"),
    ({"best_for_gpus": 8, "nodes": 3}, "nodes"),
    ({"best_for_gpus": 0}, "best_for_gpus"),
]


@pytest.mark.parametrize(("body", "field"), BAD, ids=[f"{i}-{f}" for i, (_, f) in enumerate(BAD)])
def test_a_bad_quote_request_is_422_naming_its_field_and_writes_nothing(
    api: Api, body: dict[str, Any], field: str
) -> None:
    """A probe: a request missing ``gpus`` said "plan: give 'gpu' and 'gpus'" (a quote has no field "plan"); a schema
    error had no ``field`` at all; ``best_for_gpus`` with a provider that has no offer, or with nodes no offer runs
    that count on, said "gpus: no card fits the job on 1 GPUs" on best_for_gpus."""
    plan = _done_plan(api)
    before = _quote_rows(api)
    response = api.client.post(f"/v1/plans/{plan['id']}/quotes", json=body, headers=api.headers())
    assert response.status_code == 422, response.text
    answer = response.json()
    assert answer["field"] == field, answer
    assert answer["message"].startswith(f"{field}:"), answer
    assert _quote_rows(api) == before


def test_a_recommendation_without_a_region_quotes_with_its_fields_sent_back(api: Api) -> None:
    """A probe: a price list row without a region gives recommendations with ``"region": ""``; sent back as it is, the
    quote was a 422 ("region: value should have at least 1 item"), and without it the document read "price list
    ():"."""
    csv = "provider,gpu,gpus_per_node,on_demand_usd_per_hour,source\nno-region,RTX 4090,8,0.05,own cluster\n"
    assert api.client.post("/v1/admin/catalog/offers", content=csv, headers=api.headers("admin")).status_code == 201
    plan = _done_plan(api)
    rec = plan["recommendations"][0]
    assert (rec["provider"], rec["region"]) == ("no-region", "")
    body = {k: rec[k] for k in ("gpu", "gpus", "nodes", "provider", "region", "offer_gpus_per_node")}
    response = api.client.post(f"/v1/plans/{plan['id']}/quotes", json=body, headers=api.headers())
    assert response.status_code == 201, response.text
    quote = response.json()
    assert quote["total_usd"] == rec["expected_cost_usd"]
    html = api.client.get(f"/v1/quotes/{quote['id']}/html", headers=api.headers()).text
    assert "no-region price list: own cluster" in html and "()" not in html


def test_a_customer_name_is_stored_without_surrounding_spaces(api: Api) -> None:
    plan = _done_plan(api)
    rec = plan["recommendations"][0]
    body = {"gpu": rec["gpu"], "gpus": rec["gpus"], "customer_name": "  Ada Lovelace ", "customer_email": " a@b.org"}
    response = api.client.post(f"/v1/plans/{plan['id']}/quotes", json=body, headers=api.headers())
    assert response.status_code == 201, response.text
    assert response.json()["customer"] == {"name": "Ada Lovelace", "email": "a@b.org"}
