"""Probes of quote inputs (the quote probe): a provider of spaces alone is a 422 saying the field is empty, not a
search of the catalog for a provider named "   "."""

from __future__ import annotations

from tests.api.conftest import Api
from tests.api.test_quotes import _done_plan, _quote


def test_a_provider_of_spaces_is_422_as_an_empty_provider(api: Api) -> None:
    """A probe: {"provider": "   "} answered 422 "provider: no offer for A40 at     in the catalog"."""
    plan = _done_plan(api)
    url = f"/v1/plans/{plan['id']}/quotes"
    response = api.client.post(url, json={"gpu": "A40", "gpus": 1, "provider": "   "}, headers=api.headers())
    assert response.status_code == 422 and response.json()["field"] == "provider", response.text
    assert "at least 1" in response.json()["message"] and " at  " not in response.json()["message"], response.text
    # Spaces around a provider's name are no part of it, in the quote and in the request an Idempotency-Key keeps.
    quote = _quote(api, plan["id"], {"gpu": "A40", "gpus": 1, "provider": " vast "})
    assert quote["setup"]["provider"] == "vast"
    key = {**api.headers(), "Idempotency-Key": "spaced"}
    first = api.client.post(url, json={"gpu": "A40", "gpus": 1, "provider": " vast"}, headers=key)
    again = api.client.post(url, json={"gpu": "A40", "gpus": 1, "provider": "vast"}, headers=key)
    assert (first.status_code, again.status_code) == (201, 200), again.text
    assert again.json()["id"] == first.json()["id"]
