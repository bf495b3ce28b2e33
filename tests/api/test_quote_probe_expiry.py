"""Probes of a quote's expiry (the quote probe): a retry with the Idempotency-Key of a quote that has expired is a
409 naming the key and the quote, not a 200 that hands back a quote no longer valid as if just issued; the document
says when the quote expires to the minute, as the JSON does."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import create_engine, func, select, update

from services.quotes.tables import QuoteRow
from tests.api.conftest import Api
from tests.api.test_quotes import _done_plan, _pdf_text, _pick


def _set_valid_until(api: Api, quote_id: str, when: datetime) -> None:
    engine = create_engine(api.url)
    with engine.begin() as conn:
        conn.execute(update(QuoteRow).where(QuoteRow.id == quote_id).values(valid_until=when))
    engine.dispose()


def _quotes(api: Api) -> int:
    engine = create_engine(api.url)
    with engine.connect() as conn:
        count = int(conn.scalar(select(func.count()).select_from(QuoteRow)) or 0)
    engine.dispose()
    return count


def test_a_retry_with_the_key_of_an_expired_quote_is_409_naming_the_quote(api: Api) -> None:
    """A probe: the quote issued with key "order-9" expired, and the same request with that key answered 200 with the
    expired quote: a client reads a 2xx quote as one to accept (it was valid until 2020)."""
    plan = _done_plan(api)
    url = f"/v1/plans/{plan['id']}/quotes"
    body = _pick(plan["recommendations"][0], customer_name="Ada")
    headers = {**api.headers(), "Idempotency-Key": "order-9"}
    first = api.client.post(url, json=body, headers=headers)
    assert first.status_code == 201, first.text
    quote = first.json()
    # Within its validity the retry is the quote it issued.
    retry = api.client.post(url, json=body, headers=headers)
    assert retry.status_code == 200 and retry.json() == quote, retry.text

    _set_valid_until(api, quote["id"], datetime.now(UTC) - timedelta(minutes=1))
    expired = api.client.post(url, json=body, headers=headers)
    assert expired.status_code == 409, expired.text
    error = expired.json()
    assert error["field"] == "Idempotency-Key", error
    assert quote["id"] in error["message"] and quote["number"] in error["message"], error
    assert "expired" in error["message"] and "new Idempotency-Key" in error["message"], error
    assert _quotes(api) == 1  # no second quote under the key
    # The key with another body is still the other conflict; the expired quote reads back as it was issued.
    other = api.client.post(url, json={**body, "customer_name": "Grace"}, headers=headers)
    assert other.status_code == 409 and "different quote request" in other.json()["message"], other.text
    read = api.client.get(f"/v1/quotes/{quote['id']}", headers=api.headers())
    assert read.status_code == 200 and read.json()["id"] == quote["id"]
    # A new key is a new quote, valid from now.
    fresh = api.client.post(url, json=body, headers={**api.headers(), "Idempotency-Key": "order-10"})
    assert fresh.status_code == 201 and fresh.json()["id"] != quote["id"], fresh.text


def test_the_document_says_when_the_quote_expires_to_the_minute(api: Api) -> None:
    """A probe: a quote valid until 2026-12-21T13:26Z printed "Valid until 2026-12-21", which a customer reads as the
    whole of that day, and the dashboard's list marks it expired from 13:26."""
    plan = _done_plan(api)
    response = api.client.post(
        f"/v1/plans/{plan['id']}/quotes", json=_pick(plan["recommendations"][0]), headers=api.headers()
    )
    assert response.status_code == 201, response.text
    quote = response.json()
    valid_until = datetime.fromisoformat(quote["valid_until"].replace("Z", "+00:00"))
    shown = f"Valid until {valid_until.astimezone(UTC):%Y-%m-%d %H:%M} UTC"
    html = api.client.get(f"/v1/quotes/{quote['id']}/html", headers=api.headers()).text
    assert shown in html, [line for line in html.splitlines() if "Valid until" in line]
    pdf = _pdf_text(api.client.get(f"/v1/quotes/{quote['id']}/pdf", headers=api.headers()).content)
    assert shown in pdf, pdf[:300]


def test_a_quote_says_whether_it_has_expired_and_its_document_says_so(api: Api) -> None:
    """A probe: GET /v1/quotes/{id} had no ``expired``: a client compared valid_until with its own clock to tell
    whether the quote still holds, and the document of an expired quote read as a valid offer."""
    plan = _done_plan(api)
    response = api.client.post(
        f"/v1/plans/{plan['id']}/quotes", json=_pick(plan["recommendations"][0]), headers=api.headers()
    )
    assert response.status_code == 201, response.text
    quote = response.json()
    assert quote["expired"] is False
    read = api.client.get(f"/v1/quotes/{quote['id']}", headers=api.headers()).json()
    assert read["expired"] is False
    listed = api.client.get("/v1/quotes", headers=api.headers()).json()["items"]
    assert [q["expired"] for q in listed] == [False]
    html = api.client.get(f"/v1/quotes/{quote['id']}/html", headers=api.headers()).text
    assert "Expired" not in html

    _set_valid_until(api, quote["id"], datetime.now(UTC) - timedelta(minutes=1))
    read = api.client.get(f"/v1/quotes/{quote['id']}", headers=api.headers()).json()
    assert read["expired"] is True, read
    listed = api.client.get("/v1/quotes", headers=api.headers()).json()["items"]
    assert [q["expired"] for q in listed] == [True]
    html = api.client.get(f"/v1/quotes/{quote['id']}/html", headers=api.headers()).text
    assert "Expired:</strong> this quote was valid until" in html, html[:800]
    pdf = _pdf_text(api.client.get(f"/v1/quotes/{quote['id']}/pdf", headers=api.headers()).content)
    assert "Expired: this quote was valid until" in pdf, pdf[:400]
    schema = api.client.get("/openapi.json").json()["components"]["schemas"]["QuoteOut"]
    assert "expired" in schema["required"] and schema["properties"]["expired"]["description"]
