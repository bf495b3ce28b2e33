"""Probes of the path plan -> quote -> document (the quote probe): a quote's setup says its pricing as the plan's
recommendation does, so a client matches the two; an Idempotency-Key is trimmed as HTTP trims a header, and a key of
blanks is a 422 naming the header whatever carried the request."""

from __future__ import annotations

from sqlalchemy import create_engine, update

from services.quotes.tables import QuoteRow
from tests.api.conftest import QLORA_PLAN, Api
from tests.api.test_quotes import _done_plan, _pdf_text, _pick

# Spot and on-demand setups side by side: the clouds sell both, and the plan lists each at its own price.
CLOUDS = {**QLORA_PLAN, "constraints": {"providers": ["aws", "azure", "gcp"], "prefer_simpler_within": 0.0}}


def test_a_quote_says_its_pricing_as_the_plans_recommendation_does(api: Api) -> None:
    """A probe: quotes said ``setup.pricing`` "on-demand" where the plan's recommendations say "on_demand", so a
    client matching a quote to the recommendation it came from by pricing found none; the document says "on demand"."""
    pricings = set()
    for body in (QLORA_PLAN, CLOUDS):
        plan = _done_plan(api, body)
        url = f"/v1/plans/{plan['id']}/quotes"
        rec = plan["recommendations"][0]
        pricings.add(rec["pricing"])
        response = api.client.post(url, json=_pick(rec), headers=api.headers())
        assert response.status_code == 201, response.text
        quote = response.json()
        assert quote["setup"]["pricing"] == rec["pricing"], (quote["setup"]["pricing"], rec["pricing"])
        assert quote["total_usd"] == rec["expected_cost_usd"]
        html = api.client.get(f"/v1/quotes/{quote['id']}/html", headers=api.headers()).text
        words = "spot" if rec["pricing"] == "spot" else "on demand"
        assert f"<dt>pricing</dt><dd>{words}</dd>" in html, html
    assert pricings == {"on_demand", "spot"}
    best = api.client.post(url, json={"best_for_gpus": 1}, headers=api.headers()).json()
    assert best["setup"]["pricing"] == "on_demand", best

    # A quote issued before stored "on-demand": it reads back in the API's one spelling.
    engine = create_engine(api.url)
    with engine.begin() as conn:
        conn.execute(
            update(QuoteRow).where(QuoteRow.id == best["id"]).values(setup={**best["setup"], "pricing": "on-demand"})
        )
    engine.dispose()
    read = api.client.get(f"/v1/quotes/{best['id']}", headers=api.headers()).json()
    assert read["setup"]["pricing"] == "on_demand"
    pdf = _pdf_text(api.client.get(f"/v1/quotes/{best['id']}/pdf", headers=api.headers()).content)
    assert "pricing on demand" in pdf, pdf[:600]


def test_an_idempotency_key_of_blanks_is_422_and_surrounding_blanks_are_trimmed(api: Api) -> None:
    """A probe: over the ASGI app (no HTTP parser to trim the header), an Idempotency-Key of three spaces issued a
    quote under the key "   ", and " k1 " was another key than "k1" (uvicorn trims both: "" is a 422 there)."""
    plan = _done_plan(api)
    url = f"/v1/plans/{plan['id']}/quotes"
    body = _pick(plan["recommendations"][0])
    for blank in ("   ", "\t", " \t "):
        response = api.client.post(url, json=body, headers={**api.headers(), "Idempotency-Key": blank})
        assert response.status_code == 422, (blank, response.text)
        assert response.json()["field"] == "Idempotency-Key", response.text
    first = api.client.post(url, json=body, headers={**api.headers(), "Idempotency-Key": " k1 "})
    assert first.status_code == 201, first.text
    again = api.client.post(url, json=body, headers={**api.headers(), "Idempotency-Key": "k1"})
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"], again.text
    listed = api.client.get("/v1/quotes", headers=api.headers()).json()["items"]
    assert [q["id"] for q in listed] == [first.json()["id"]]
