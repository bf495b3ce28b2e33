"""Probes of the numbers a quote shows (stop 51's quote probe): each cost line multiplies out to its amount, the
document shows the card's memory and the price's age as the JSON does, and a quote is never in a currency it does
not print."""

from __future__ import annotations

import logging
import re
from decimal import ROUND_HALF_UP, Decimal
from html import unescape
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from services.planner.models import Recommendation
from services.quotes.service import cost_lines
from tests.api.conftest import QLORA_PLAN, Api
from tests.api.test_quotes import _done_plan, _pdf_text, _pick, _quote

FULL_8B_LONG: dict[str, Any] = {
    "model": {"name": "meta-llama/Llama-3.1-8B"},
    "method": "full",
    "precision": "bf16",
    "micro_batch_size": 2,
    "seq_len": 2048,
    "gradient_checkpointing": True,
    "dataset": {"examples": 200_000, "avg_tokens": 1024},
    "epochs": 3,
}


def _html_lines(html: str) -> list[tuple[str, str, str, str]]:
    """(quantity, unit, unit price, amount) of each cost row of a quote's HTML document."""
    row = re.compile(
        r'<tr><td>.*?</td><td class="num">(.*?) <span class="unit">(.*?)</span></td>'
        r'<td class="num">(.*?)</td><td class="num">(.*?)</td></tr>'
    )
    return [tuple(unescape(cell) for cell in found.groups()) for found in row.finditer(html)]  # type: ignore[misc]


def _number(text: str) -> Decimal:
    return Decimal(text.replace("$", "").replace(",", ""))


def _multiplies_out(quantity: Decimal, unit_price: Decimal, amount: Decimal) -> bool:
    """Whether quantity x unit price is the amount to the cent (halves up, as a reader rounds)."""
    return (quantity * unit_price).quantize(Decimal("0.01"), ROUND_HALF_UP) == amount


def test_every_cost_line_multiplies_out_to_its_amount_in_the_json_and_the_document(api: Api) -> None:
    """A probe: the quantity was the line's GPU-hours rounded to 0.01 while the amount was its share of the plan's
    cents, so "1.33 GPU-hour x $3.3177" read $4.41 on a line of $4.43 (16 x A100 80GB, start-up), and "767.03 x
    $0.3740" $286.87 on one of $286.84."""
    plan = _done_plan(api, FULL_8B_LONG)
    bodies: list[dict[str, Any]] = [_pick(r) for r in plan["recommendations"][:3]]
    bodies += [
        {"best_for_gpus": gpus, "spot": spot, "checkpoint_storage_months": 2.5} for gpus in (1, 16) for spot in (0, 1)
    ]
    wrong = []
    for body in bodies:
        response = api.client.post(f"/v1/plans/{plan['id']}/quotes", json=body, headers=api.headers())
        if response.status_code != 201:
            continue  # no spot price for that count: nothing to check
        quote = response.json()
        html = api.client.get(f"/v1/quotes/{quote['id']}/html", headers=api.headers()).text
        shown = _html_lines(html)
        assert len(shown) == len(quote["line_items"])
        for item, (quantity, _unit, unit_price, amount) in zip(quote["line_items"], shown, strict=True):
            assert _number(amount) == Decimal(str(item["amount_usd"])), (amount, item)
            assert _number(quantity) == Decimal(str(item["quantity"])), (quantity, item)
            if not _multiplies_out(_number(quantity), _number(unit_price), _number(amount)):
                wrong.append((quote["setup"]["gpus"], quote["setup"]["gpu"], quantity, unit_price, amount))
        assert sum(round(i["amount_usd"] * 100) for i in quote["line_items"]) == round(quote["total_usd"] * 100)
        # The PDF draws the same cells.
        pdf = _pdf_text(api.client.get(f"/v1/quotes/{quote['id']}/pdf", headers=api.headers()).content)
        for quantity, unit, unit_price, amount in shown:
            assert f"{quantity} {unit}" in pdf and unit_price in pdf and amount in pdf, (quantity, unit_price, amount)
        assert f"${quote['total_usd']:,.2f}" in pdf
    assert not wrong, wrong


def test_lines_at_a_dear_per_gpu_price_multiply_out_and_still_add_up_to_the_plan(api: Api) -> None:
    # The same check on a crafted setup: $98.32 an hour for 8 GPUs ($12.29 per GPU-hour), the breakdown's odd cents.
    rec = Recommendation.model_validate(_done_plan(api, QLORA_PLAN)["recommendations"][0])
    breakdown = {
        "compute": 1234.5678,
        "startup": 4.4125,
        "model_download": 0.0399,
        "checkpoint_writes": 4.2463,
        "preemption_rework": 0.034,
        "billing_rounding": 3.3333,
    }
    dear = rec.model_copy(
        update={
            "gpus": 8,
            "pricing": "on_demand",
            "price_usd_per_hour": 98.32,
            "cost_breakdown": breakdown,
            "expected_cost_usd": round(sum(breakdown.values()), 2),
        }
    )
    lines = cost_lines(dear)
    assert sum(round(i.amount_usd * 100) for i in lines) == round(dear.expected_cost_usd * 100)
    for item in lines:
        quantity, unit_price, amount = (Decimal(str(v)) for v in (item.quantity, item.unit_price_usd, item.amount_usd))
        assert unit_price == Decimal("12.29")
        assert _multiplies_out(quantity, unit_price, amount), item


def test_the_document_shows_the_cards_memory_as_the_setup_has_it(api: Api) -> None:
    """A probe: an A10 has 22.5 GiB; its quote said "13.7 GiB of 22 GiB" and "on a 22 GiB card (8.8 GiB headroom)",
    which do not add up (13.7 + 8.8 = 22.5)."""
    plan = _done_plan(api, {**QLORA_PLAN, "constraints": {"providers": ["vast"]}})
    quote = _quote(api, plan["id"], {"gpu": "A10", "gpus": 1, "provider": "vast"})
    setup = quote["setup"]
    assert setup["gpu_memory_gib"] == 22.5
    peak = f"{setup['peak_gib_per_gpu']:.1f} GiB"
    assert quote["assumptions"][0].startswith(f"predicted peak {peak} per GPU on a 22.5 GiB card"), quote["assumptions"]
    html = api.client.get(f"/v1/quotes/{quote['id']}/html", headers=api.headers()).text
    assert f"<dt>per GPU</dt><dd>{peak} of 22.5 GiB</dd>" in html
    # A card of whole GiB keeps its short form.
    quote = _quote(api, plan["id"], {"gpu": "RTX 4090", "gpus": 1, "provider": "vast"})
    assert "on a 24 GiB card" in quote["assumptions"][0]


def test_a_quote_after_a_refetch_at_the_same_price_says_the_price_lists_age(api: Api) -> None:
    """A probe: a setup with ranking notes took the plan's notes whole, so after the provider's offer was fetched again
    at the same price its quote said "price fetched 4.8 days ago (2026-12-02)" above "prices of 2026-12-06 (0.8 days
    old when quoted)"."""
    plan = _done_plan(api, QLORA_PLAN)
    rec = next((r for r in plan["recommendations"] if r["ranking_notes"] and r["stale_price"]), None)
    assert rec is not None, "the bundled catalog's plan has a stale-priced setup with ranking notes"
    offers = api.client.get("/v1/catalog/offers", headers=api.headers()).json()["items"]
    offer = next(
        o
        for o in offers
        if (o["provider"], o["gpu"], o["region"], o["gpus_per_node"])
        == (rec["provider"], rec["gpu"], rec["region"], rec["offer_gpus_per_node"])
    )
    csv = (
        "provider,gpu,gpus_per_node,on_demand_usd_per_hour,region,source\n"
        f"{offer['provider']},{offer['gpu']},{offer['gpus_per_node']},{offer['on_demand_usd_per_hour']},"
        f"{offer['region']},fetched again\n"
    )
    assert api.client.post("/v1/admin/catalog/offers", content=csv, headers=api.headers("admin")).status_code == 201
    quote = _quote(api, plan["id"], _pick(rec))
    assert quote["total_usd"] == rec["expected_cost_usd"]
    assert quote["price_list"]["source"] == "fetched again"
    assert not any(n.startswith("price fetched") for n in quote["notes"]), quote["notes"]
    # The plan's ranking notes stay, where the plan put them.
    assert [n for n in quote["notes"] if n in rec["ranking_notes"]] == rec["ranking_notes"]
    assert quote["notes"] == [n for n in rec["notes"] if not n.startswith("price fetched")]


def test_a_price_list_row_in_another_currency_is_refused_at_import(api: Api) -> None:
    """A probe of stop 52: a price list row in EUR was ranked and quoted as "Total (USD) $0.26", its euros read as
    dollars (every price gpuplan works out is USD and it holds no exchange rate)."""
    header = "provider,gpu,gpus_per_node,on_demand_usd_per_hour,currency,region,source\n"
    response = api.client.post(
        "/v1/admin/catalog/offers",
        content=header + "euro-dc,RTX 4090,8,0.10,EUR,fra,euro list\n",
        headers=api.headers("admin"),
    )
    assert response.status_code == 422, response.text
    assert "row 1: currency:" in response.text and "EUR" in response.text, response.text
    assert all(
        o["provider"] != "euro-dc" for o in api.client.get("/v1/catalog/offers", headers=api.headers()).json()["items"]
    )
    ok = api.client.post(
        "/v1/admin/catalog/offers",
        content=header + "dollar-dc,RTX 4090,8,0.10,usd,fra,t\n",
        headers=api.headers("admin"),
    )
    assert ok.status_code == 201, ok.text


def test_an_offer_stored_in_another_currency_before_imports_refused_it_is_neither_planned_nor_quoted(
    api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    """Stop 52 refused other currencies at import, but a row stored before that (or written by hand) still reached
    the planner, its euros read as dollars. The cheapest RTX 4090 here is that row."""
    header = "provider,gpu,gpus_per_node,on_demand_usd_per_hour,currency,region,source\n"
    rows = "euro-dc,RTX 4090,1,0.01,USD,fra,old list\ndollar-dc,RTX 4090,1,0.02,USD,fra,old list\n"
    assert (
        api.client.post("/v1/admin/catalog/offers", content=header + rows, headers=api.headers("admin")).status_code
        == 201
    )
    engine = create_engine(api.url)
    with engine.begin() as conn:  # what an older gpuplan stored
        conn.execute(text("UPDATE gpu_offers SET currency = 'EUR' WHERE provider = 'euro-dc'"))
    engine.dispose()
    with caplog.at_level(logging.WARNING, logger="gpuplan.catalog"):
        plan = _done_plan(api, QLORA_PLAN)
    picked = [r["provider"] for r in plan["recommendations"]]
    assert "euro-dc" not in picked and plan["recommendations"][0]["provider"] == "dollar-dc", picked
    assert "1 offer(s) priced in EUR left out of planning and quotes" in caplog.text, caplog.text
    response = api.client.post(
        f"/v1/plans/{plan['id']}/quotes",
        json={"gpu": "RTX 4090", "gpus": 1, "provider": "euro-dc"},
        headers=api.headers(),
    )
    assert response.status_code in (404, 409, 422), response.text


def test_a_setup_outside_the_plans_gpus_provider_or_region_is_quoted_and_says_so(api: Api) -> None:
    """A probe: a plan limited to lambda in us-east-1 on at most 2 GPUs quoted 8 x H100 at aws with no word of it,
    where a setup over the budget or past the deadline says so."""
    constraints = {"providers": ["lambda"], "regions": ["us-east-1"], "max_gpus": 2}
    plan = _done_plan(api, {**QLORA_PLAN, "constraints": constraints})
    quote = _quote(api, plan["id"], {"gpu": "H100 SXM", "gpus": 8, "provider": "aws"})
    assert "more GPUs than the plan's max_gpus: 8 against 2" in quote["assumptions"], quote["assumptions"]
    assert "a provider the plan left out: aws, not among lambda" in quote["assumptions"]
    assert not any(a.startswith("a region the plan left out") for a in quote["assumptions"])  # aws's us-east-1
    quote = _quote(api, plan["id"], {"gpu": "H100 SXM", "gpus": 1, "provider": "vast"})
    assert "a region the plan left out: marketplace, not among us-east-1" in quote["assumptions"], quote["assumptions"]
    rec = plan["recommendations"][0]
    quote = _quote(api, plan["id"], _pick(rec))
    assert quote["total_usd"] == rec["expected_cost_usd"]
    assert not any("the plan left out" in a or "max_gpus" in a for a in quote["assumptions"]), quote["assumptions"]


def test_a_spot_quote_bills_no_more_gpu_hours_than_its_run(api: Api) -> None:
    """A quote probe of stop 52: 16 x A100 40GB at azure on spot billed 746 GPU-hours at the spot price for a run of
    18.9 h on 16 GPUs (302 GPU-hours): the expected on-demand finish ($224.62, the on-demand price's excess over spot)
    was part of the rework line. It is its own line now, at that excess per GPU-hour."""
    plan = _done_plan(api, FULL_8B_LONG)
    response = api.client.post(
        f"/v1/plans/{plan['id']}/quotes", json={"best_for_gpus": 16, "spot": True}, headers=api.headers()
    )
    assert response.status_code == 201, response.text
    quote = response.json()
    setup, lines = quote["setup"], quote["line_items"]
    at_spot = [i for i in lines if not i["description"].startswith("expected on-demand finish")]
    assert sum(i["quantity"] for i in at_spot) <= setup["expected_hours"] * setup["gpus"] * 1.01, lines
    fallback = [i for i in lines if i["description"].startswith("expected on-demand finish")]
    assert fallback and fallback[0]["amount_usd"] == round(setup["cost_breakdown"]["on_demand_fallback"], 2), lines
    assert round(sum(i["amount_usd"] for i in lines), 2) == quote["total_usd"]
