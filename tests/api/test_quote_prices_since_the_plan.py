"""A quote prices its setup at the catalog's prices of today, and refuses (409) where they are not the prices the
plan ranked it at: a spot run's on-demand finish counts, and so does a spot price the plan never saw."""

from __future__ import annotations

from typing import Any

from tests.api.conftest import Api
from tests.api.test_probe_quote_numbers import FULL_8B_LONG
from tests.api.test_quotes import _done_plan

HEADER = "provider,gpu,gpus_per_node,on_demand_usd_per_hour,spot_usd_per_hour,region,source,inter_node_gbit_per_s\n"


def _own_prices(api: Api, on_demand: str, spot: str, source: str) -> None:
    row = f"own-dc,H100 SXM,8,{on_demand},{spot},r1,{source},400\n"
    response = api.client.post("/v1/admin/catalog/offers", content=HEADER + row, headers=api.headers("admin"))
    assert response.status_code == 201, response.text


def _own_plan(api: Api) -> dict[str, Any]:
    return _done_plan(api, {**FULL_8B_LONG, "constraints": {"providers": ["own-dc"], "prefer_simpler_within": 0.0}})


def test_a_spot_quote_after_the_on_demand_price_changed_is_409(api: Api) -> None:
    """A probe: after own-dc's on-demand price rose from $2 to $3 (spot unchanged at $1), every on-demand quote of
    the card was a 409, but a spot quote of 3 GPUs (a count the plan did not list) was issued at $96.67 where the
    plan's prices give $72.14: its on-demand finish billed at a price the plan never ranked, with no word of it."""
    _own_prices(api, "2.00", "1.00", "v1")
    plan = _own_plan(api)
    assert not [r for r in plan["recommendations"] if r["gpus"] == 3], plan["recommendations"]
    url = f"/v1/plans/{plan['id']}/quotes"
    body = {"gpu": "H100 SXM", "gpus": 3, "provider": "own-dc", "spot": True}
    before = api.client.post(url, json=body, headers=api.headers())
    assert before.status_code == 201, before.text
    assert any(i["description"].startswith("expected on-demand finish") for i in before.json()["line_items"])

    _own_prices(api, "3.00", "1.00", "v2")
    response = api.client.post(url, json=body, headers=api.headers())
    assert response.status_code == 409, response.text
    answer = response.json()
    assert answer["field"] == "price", answer
    assert "on-demand price of H100 SXM at own-dc (r1) changed since the plan" in answer["message"], answer
    assert "$2.0000 per GPU-hour then, $3.0000 now" in answer["message"], answer


def test_a_spot_quote_at_a_spot_price_the_plan_never_saw_is_409(api: Api) -> None:
    """The plan ranked the offer on demand only (no spot price then); a spot price added since is not the plan's."""
    _own_prices(api, "2.00", "", "v1")
    plan = _own_plan(api)
    assert all(r["spot_price_usd_per_hour"] is None for r in plan["recommendations"]), plan["recommendations"]
    _own_prices(api, "2.00", "1.00", "v2")
    url = f"/v1/plans/{plan['id']}/quotes"
    response = api.client.post(
        url, json={"gpu": "H100 SXM", "gpus": 8, "provider": "own-dc", "spot": True}, headers=api.headers()
    )
    assert response.status_code == 409, response.text
    assert response.json()["field"] == "price"
    assert "spot price of H100 SXM at own-dc (r1) is new since the plan" in response.json()["message"]
    # On demand, the price is the plan's: quoted at the plan's number.
    rec = next(r for r in plan["recommendations"] if r["gpus"] == 8)
    ok = api.client.post(url, json={"gpu": "H100 SXM", "gpus": 8, "provider": "own-dc"}, headers=api.headers())
    assert ok.status_code == 201, ok.text
    assert ok.json()["total_usd"] == rec["expected_cost_usd"]
