"""The numbers the dashboard shows in a real browser are the API's numbers for the same object, to the
rounding the page shows: each figure is read back from the page, parsed, and compared with the JSON within
half a unit of its last shown digit (never by calling the page's own formatters)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from services.dashboard.views import quote_value
from tests.dashboard.conftest import LiveServer

pytestmark = pytest.mark.slow

_NUMBER = re.compile(r"-?[0-9][0-9,]*(?:\.[0-9]+)?")
_HOURS_PER = {"min": 1 / 60, "h": 1.0, "days": 24.0}


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1366, "height": 900})
    context.set_default_timeout(20_000)
    yield context.new_page()
    context.close()


def _sign_in(page: Any, server: LiveServer) -> None:
    page.goto(f"{server.url}/dashboard/login")
    page.get_by_label("API key").fill(server.keys["alpha"])
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(re.compile(r".*/dashboard/plans$"))


def _auth(server: LiveServer) -> dict[str, str]:
    return {"Authorization": f"Bearer {server.keys['alpha']}"}


def _done_plan(server: LiveServer, body: dict[str, Any]) -> dict[str, Any]:
    plan_id = httpx.post(f"{server.url}/v1/plans", json=body, headers=_auth(server)).json()["id"]
    deadline = time.monotonic() + 15
    while True:
        stored: dict[str, Any] = httpx.get(f"{server.url}/v1/plans/{plan_id}", headers=_auth(server)).json()
        if stored["status"] not in ("queued", "running"):
            assert stored["status"] == "done", stored
            return stored
        assert time.monotonic() < deadline, "the plan was not estimated in time"
        time.sleep(0.2)


def _shown(text: str) -> tuple[float, float]:
    """The first number in ``text`` and half a unit of its last digit (the most its rounding can move it)."""
    found = _NUMBER.search(text)
    assert found is not None, f"no number in {text!r}"
    digits = found.group(0).replace(",", "")
    decimals = len(digits.partition(".")[2])
    return float(digits), 0.5 * 10.0**-decimals + 1e-9


def assert_shows(text: str, value: float, scale: float = 1.0) -> None:
    shown, half_unit = _shown(text)
    assert abs(shown * scale - value) <= half_unit * scale, f"{text!r} is not {value}"


def assert_shows_hours(text: str, hours: float) -> None:
    unit = text.split()[-1]
    assert unit in _HOURS_PER, text
    assert_shows(text, hours, _HOURS_PER[unit])


# aws only: its offers have spot prices, so the plan ranks setups on spot, whose expected run (preemptions,
# waits for capacity) is longer than the same setup on demand.
SPOT_PLAN = {
    "model": {"name": "meta-llama/Llama-3.1-8B"},
    "method": "qlora",
    "micro_batch_size": 4,
    "seq_len": 512,
    "gradient_checkpointing": True,
    "dataset": {"examples": 20_000, "avg_tokens": 400},
    "epochs": 1,
    "constraints": {"providers": ["aws"]},
}


def test_each_recommended_setup_shows_the_api_numbers_of_its_own_pricing(page: Any, live_server: LiveServer) -> None:
    stored = _done_plan(live_server, SPOT_PLAN)
    recs = stored["recommendations"]
    # The cases this checks are in the plan: a setup on spot that runs longer than on demand, and a card whose
    # memory is not a whole number of GiB (22.5 GiB L4 and A10G).
    assert any(r["pricing"] == "spot" and r["expected_hours"] > 1.2 * r["hours"] for r in recs), recs
    assert any(not float(r["gpu_memory_gib"]).is_integer() for r in recs), recs
    _sign_in(page, live_server)
    page.goto(f"{live_server.url}/dashboard/plans/{stored['id']}")
    rows = page.locator("table.recs tbody tr.rec")
    assert rows.count() == len(recs)
    options = page.get_by_label("Setup to quote").locator("option").all_inner_texts()
    # One option per setup, in the table's order (views.quote_options): a setup recommended both on demand and on spot
    # has one option, priced as its first row.
    first_rows: dict[str, int] = {}
    for i, rec in enumerate(recs):
        first_rows.setdefault(quote_value(rec), i)
    assert len(options) >= len(first_rows)
    for i, rec in enumerate(recs):
        row = rows.nth(i)

        def cell(label: str, row: Any = row) -> str:
            return str(row.locator(f"td[data-label='{label}']").inner_text())

        assert_shows(cell("On demand"), rec["cost_usd"])
        if rec["spot_cost_usd"] is not None:
            assert_shows(cell("Spot"), rec["spot_cost_usd"])
        # The row's hours are those of its pricing: what its quote's "expected duration" says.
        hours = cell("Hours")
        assert_shows_hours(hours, rec["expected_hours"])
        if first_rows[quote_value(rec)] == i:
            option = options[list(first_rows).index(quote_value(rec))]
            assert hours in option, (hours, option)
        fit = re.fullmatch(r"(yes|no), ([0-9.]+) / ([0-9.]+) GiB", cell("Fits: peak of card").strip())
        assert fit is not None, cell("Fits: peak of card")
        assert_shows(fit.group(2), rec["peak_gib_per_gpu"])
        # The card's memory as the API and the quote give it (22.5), not to whole GiB (22 beside 8.8 headroom).
        assert float(fit.group(3)) == rec["gpu_memory_gib"], fit.group(0)
        assert_shows(cell("Headroom"), rec["headroom_gib"])
        assert_shows(cell("Tokens/s"), rec["data_tokens_per_s"])
        # The setup is named once, its pricing once (the badge).
        heading = row.locator("th").inner_text()
        assert heading.startswith(f"{rec['gpus']} x {rec['gpu']}"), heading
        assert heading.count("on spot") == (1 if rec["pricing"] == "spot" else 0), heading


def test_the_plan_facts_show_the_submitted_numbers_in_full(page: Any, live_server: LiveServer) -> None:
    body = {
        "model": {"name": "meta-llama/Llama-3.1-8B"},
        "method": "qlora",
        "micro_batch_size": 2,
        "seq_len": 16_384,
        "gradient_checkpointing": True,
        "dataset": {"examples": 300, "avg_tokens": 1_234_567.5},
        "epochs": 2.5,
    }
    stored = _done_plan(live_server, body)
    _sign_in(page, live_server)
    page.goto(f"{live_server.url}/dashboard/plans/{stored['id']}")
    facts = dict(
        zip(
            page.locator("dl.facts dt").all_inner_texts(),
            page.locator("dl.facts dd").all_inner_texts(),
            strict=True,
        )
    )
    request = stored["request"]
    batch, sequence = facts["micro-batch x sequence"].split(" x ")
    assert _shown(batch)[0] == request["micro_batch_size"] and _shown(sequence)[0] == request["seq_len"]
    examples, avg = facts["data set"].split(" examples x ")
    assert _shown(examples)[0] == request["dataset"]["examples"]
    assert _shown(avg)[0] == request["dataset"]["avg_tokens"], facts["data set"]  # not 1.23457e+06
    assert _shown(facts["epochs"])[0] == request["epochs"]


def test_a_nodes_gpu_memory_and_price_are_the_reported_numbers(page: Any, live_server: LiveServer) -> None:
    node = httpx.post(
        f"{live_server.url}/v1/nodes",
        json={"name": "h100-box", "gpu": "H100 SXM", "gpu_count": 2, "provider": "lab", "usd_per_hour": 6.5},
        headers=_auth(live_server),
    ).json()
    gpus = [
        {"index": 0, "utilisation_pct": 87.4, "memory_used_gib": 60.46, "memory_total_gib": 79.6},
        {"index": 1, "utilisation_pct": 3, "memory_used_gib": 0.5, "memory_total_gib": 79.6},
    ]
    beat = httpx.post(
        f"{live_server.url}/v1/nodes/{node['id']}/heartbeat",
        json={"gpus": gpus, "job_running": True},
        headers={**_auth(live_server), "X-Node-Token": node["node_token"]},
    )
    assert beat.is_success, beat.text
    listed = httpx.get(f"{live_server.url}/v1/nodes", headers=_auth(live_server)).json()["items"]
    stored = next(n for n in listed if n["id"] == node["id"])
    _sign_in(page, live_server)
    page.goto(f"{live_server.url}/dashboard/nodes")
    row = page.locator("table.nodes tbody tr", has=page.locator("th", has_text="h100-box"))
    shown = row.locator("ul.gpus li").all_inner_texts()
    assert len(shown) == len(stored["gpus"])
    for text, gpu in zip(shown, stored["gpus"], strict=True):
        found = re.fullmatch(r"GPU (\d+):\s+([0-9.]+)% ([0-9.]+) / ([0-9.]+) GiB", text.strip())
        assert found is not None, text
        assert int(found.group(1)) == gpu["index"]
        assert_shows(found.group(2), gpu["utilisation_pct"])
        assert_shows(found.group(3), gpu["memory_used_gib"])
        assert float(found.group(4)) == gpu["memory_total_gib"], text  # 79.6 GiB as reported, not "80"
    assert_shows(row.locator("td.num").inner_text(), stored["usd_per_hour"])
    assert row.locator("td").nth(1).inner_text() == f"{stored['gpu_count']} x {stored['gpu']}"
    # A price under a cent an hour as given ("$0.01/h" for $0.0045 was more than twice it).
    cheap = {"name": "cpu-box", "gpu": "L4", "gpu_count": 1, "provider": "lab", "usd_per_hour": 0.0045}
    assert httpx.post(f"{live_server.url}/v1/nodes", json=cheap, headers=_auth(live_server)).is_success
    page.goto(f"{live_server.url}/dashboard/nodes")
    row = page.locator("table.nodes tbody tr", has=page.locator("th", has_text="cpu-box"))
    assert row.locator("td.num").inner_text().strip() == "$0.0045/h"
