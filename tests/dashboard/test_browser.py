"""The dashboard in a real browser: Debian's headless Chromium driven by Playwright, against a real
uvicorn server (SQLite file, in-process tasks). Screenshots go to artifacts/screenshots/."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.dashboard.conftest import LiveServer, screenshot

pytestmark = pytest.mark.slow


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1366, "height": 900})
    context.set_default_timeout(30_000)
    page = context.new_page()
    yield page
    context.close()


def sign_in(page: Any, server: LiveServer, org: str = "alpha") -> None:
    page.goto(f"{server.url}/dashboard/plans")
    assert "/dashboard/login" in page.url
    page.get_by_label("API key").fill(server.keys[org])
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(re.compile(r".*/dashboard/plans$"))


def test_sign_in_submit_a_plan_watch_it_finish_and_quote_it(page: Any, live_server: LiveServer) -> None:
    sign_in(page, live_server)
    screenshot(page, "01-plans-empty")
    page.get_by_role("link", name="New plan").first.click()
    page.get_by_label("Model (type to search").fill("meta-llama/Llama-3.1-8B")
    page.get_by_label("Method").select_option("qlora")
    page.get_by_label("Sequence length (tokens)").fill("512")
    page.get_by_label("Examples").fill("20000")
    page.get_by_label("Epochs").fill("2")
    screenshot(page, "02-plan-form")
    page.get_by_role("button", name="Plan it").click()

    page.wait_for_url(re.compile(r".*/dashboard/plans/[0-9a-f]{32}$"))
    plan_id = page.url.rsplit("/", 1)[1]
    # Live status: the page polls and reloads itself once the estimate is stored.
    page.locator("#plan-status", has_text="done").wait_for()
    screenshot(page, "03-plan-done")

    stored = httpx.get(
        f"{live_server.url}/v1/plans/{plan_id}", headers={"Authorization": f"Bearer {live_server.keys['alpha']}"}
    ).json()
    components = [k for k, v in stored["estimate"]["memory"]["breakdown"].items() if v > 0]
    chart = page.locator("svg#memory-chart")
    assert chart.is_visible()
    assert chart.locator("rect.segment").count() == len(components)
    chart.screenshot(path=str(screenshot(page, "03-plan-done").with_name("03b-memory-chart.png")))
    # The axis ends at the recommended card: one marker per distinct memory size up to it.
    recs = stored["recommendations"]
    top = recs[0]["gpu_memory_gib"]
    cards = {round(r["gpu_memory_gib"], 1) for r in recs if r["gpu_memory_gib"] <= top}
    assert chart.locator("line.card-line").count() == len(cards)
    assert page.locator("table.recs tbody tr.rec").count() == len(recs)
    # Every segment, however small, is wide enough to see and to hover.
    widths = chart.locator("rect.segment").evaluate_all("els => els.map(e => e.getBoundingClientRect().width)")
    assert min(widths) >= 2
    scatter = page.locator("svg#cost-time-chart")
    assert scatter.locator("path.point").count() >= 1
    assert scatter.locator(".mark-ring.mark-cheapest").count() == 1
    assert scatter.locator(".mark-ring.mark-fastest").count() == 1
    # One colour per card: the legend lists each card with its own fill.
    fills = page.locator("ul.series-legend path.point").evaluate_all("els => els.map(e => getComputedStyle(e).fill)")
    assert len(fills) == len(
        {r["gpu"] for r in recs}
        | set(scatter.locator("path.point").evaluate_all("els => els.map(e => e.dataset.series)"))
    )
    assert len(set(fills)) == min(len(fills), 8)
    # The quote form starts on the cheapest setup; the spot box shows only for a setup with a spot price.
    setup = page.get_by_label("Setup to quote")
    cheapest = recs[0]
    assert setup.input_value() == "|".join(
        str(cheapest[k]) for k in ("gpu", "gpus", "provider", "region", "nodes", "offer_gpus_per_node")
    )
    spot_values = setup.locator('option[data-spot="yes"]').evaluate_all("els => els.map(e => e.value)")
    plain_values = setup.locator('option[data-spot="no"]').evaluate_all("els => els.map(e => e.value)")
    assert spot_values and plain_values  # the bundled catalog prices some offers on spot and others not
    setup.select_option(spot_values[0])
    assert page.locator("#spot").is_visible()
    setup.select_option(plain_values[0])
    assert not page.locator("#spot").is_visible()

    page.get_by_label("Setup to quote").select_option(index=1)
    page.get_by_role("button", name="Request a quote").click()
    page.wait_for_url(re.compile(r".*/dashboard/quotes/[0-9a-f]{32}$"))
    assert page.get_by_role("heading", name=re.compile(r"^Quote Q-\d{8}-[0-9A-F]{8}$")).is_visible()
    assert page.locator("table.lines tbody tr").count() >= 1
    assert page.locator("td.total").inner_text().startswith("$")
    screenshot(page, "04-quote")
    page.emulate_media(media="print")
    assert not page.locator("header.site").is_visible()
    assert not page.get_by_role("button", name="Print").is_visible()
    assert not page.get_by_role("link", name="Download PDF").is_visible()
    screenshot(page, "05-quote-print")
    pdf = page.pdf(format="A4")
    assert pdf.startswith(b"%PDF")


def test_the_quote_from_the_plan_page_costs_what_the_page_shows(page: Any, live_server: LiveServer) -> None:
    # Issue 22 item 3: from the plan page, the pre-selected setup with its pricing (the spot box as the table's
    # first row is priced), quoted for a customer, costs the number the page shows for it, to the cent; so does
    # a setup picked from the list, whose label names its price.
    auth = {"Authorization": f"Bearer {live_server.keys['alpha']}"}
    plan = {
        "model": {"name": "meta-llama/Llama-3.1-8B"},
        "method": "qlora",
        "micro_batch_size": 4,
        "seq_len": 512,
        "gradient_checkpointing": True,
        "dataset": {"examples": 10_000, "avg_tokens": 512},
        "epochs": 3,
    }
    plan_id = httpx.post(f"{live_server.url}/v1/plans", json=plan, headers=auth).json()["id"]
    deadline = time.monotonic() + 60
    while httpx.get(f"{live_server.url}/v1/plans/{plan_id}", headers=auth).json()["status"] != "done":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    sign_in(page, live_server)
    page.goto(f"{live_server.url}/dashboard/plans/{plan_id}")
    first = page.locator("table.recs tbody tr.rec").first
    on_spot = first.locator(".badge.warn", has_text="on spot").count() == 1
    shown = first.locator("td[data-label='Spot']" if on_spot else "td[data-label='On demand']").inner_text()
    notes = page.locator('table.recs tr.rec-notes[data-index="0"] ul.setup-notes li').all_inner_texts()
    stored = httpx.get(f"{live_server.url}/v1/plans/{plan_id}", headers=auth).json()["recommendations"][0]
    assert notes == stored["notes"] and shown == f"${stored['expected_cost_usd']:,.2f}"

    spot_box = page.locator("#spot")
    if spot_box.count():
        assert spot_box.is_checked() == on_spot
    page.get_by_label("Customer name").fill("Ada Lovelace")
    page.get_by_label("Customer email").fill("ada@example.org")
    screenshot(page, "08-quote-form")
    page.get_by_role("button", name="Request a quote").click()
    page.wait_for_url(re.compile(r".*/dashboard/quotes/[0-9a-f]{32}$"))
    assert page.locator("td.total").inner_text() == shown
    assert page.locator("address.customer").inner_text().count("Ada Lovelace") == 1
    assert page.locator("ul.setup-notes li").all_inner_texts() == notes
    screenshot(page, "09-quote-of-the-first-setup")
    pdf = page.request.get(page.url + "/pdf")
    assert pdf.ok and pdf.body().startswith(b"%PDF")

    # Another setup from the list: the spot box follows its pricing, and the quote its label's price.
    page.goto(f"{live_server.url}/dashboard/plans/{plan_id}")
    setup = page.get_by_label("Setup to quote")
    values = setup.locator("option").evaluate_all("els => els.map(e => [e.value, e.dataset.pricing, e.textContent])")
    value, pricing, label = values[1]
    setup.select_option(value)
    if page.locator("#spot").count() and page.locator("#spot").is_visible():
        assert page.locator("#spot").is_checked() == (pricing == "spot")
    page.get_by_role("button", name="Request a quote").click()
    page.wait_for_url(re.compile(r".*/dashboard/quotes/[0-9a-f]{32}$"))
    assert label.rsplit(", ", 1)[1].split(" ")[0] == page.locator("td.total").inner_text()


def test_bad_input_shows_the_message_next_to_the_input(page: Any, live_server: LiveServer) -> None:
    page.goto(f"{live_server.url}/dashboard/login")
    page.get_by_label("API key").fill("gp_not-a-key")
    page.get_by_role("button", name="Sign in").click()
    assert page.get_by_role("alert").inner_text() == "Unknown or revoked API key."
    screenshot(page, "06-login-bad-key")

    sign_in(page, live_server)
    page.goto(f"{live_server.url}/dashboard/plans/new")
    page.get_by_label("Model (type to search").fill("llama-9000")
    page.get_by_label("Micro-batch size").fill("0")
    page.get_by_role("button", name="Plan it").click()
    model_error = page.locator("#model-error")
    model_error.wait_for()
    assert "not in the bundled catalog" in model_error.inner_text()
    assert page.locator("#micro_batch_size-error").inner_text() == "micro-batch size: from 1 to 65,536 (got 0)"
    assert page.get_by_label("Model (type to search").get_attribute("aria-invalid") == "true"
    # The error summary takes the focus, so keyboard and screen-reader users land on it.
    assert page.evaluate("document.activeElement.id") == "form-errors"
    screenshot(page, "07-plan-form-errors")

    page.get_by_label("Paste a config.json").check()
    page.get_by_label("config.json", exact=True).fill("{not json")
    page.get_by_label("Micro-batch size").fill("2")
    page.get_by_role("button", name="Plan it").click()
    page.locator("#config_json-error").wait_for()
    assert "not valid JSON" in page.locator("#config_json-error").inner_text()


def test_keyboard_only_sign_in_and_navigation(page: Any, live_server: LiveServer) -> None:
    auth = {"Authorization": f"Bearer {live_server.keys['alpha']}"}
    node = httpx.post(
        f"{live_server.url}/v1/nodes",
        json={"name": "lab-h100", "gpu": "H100 SXM", "gpu_count": 2, "provider": "lab", "usd_per_hour": 5.0},
        headers=auth,
    ).json()
    gpus = [{"index": i, "utilisation_pct": 92 - 40 * i, "memory_used_gib": 70, "memory_total_gib": 80} for i in (0, 1)]
    httpx.post(
        f"{live_server.url}/v1/nodes/{node['id']}/heartbeat",
        json={"gpus": gpus, "job_running": True},
        headers={**auth, "X-Node-Token": node["node_token"]},
    )
    page.goto(f"{live_server.url}/dashboard/login")
    # The key input has the focus on arrival: type and press Enter.
    assert page.evaluate("document.activeElement.id") == "api_key"
    page.keyboard.type(live_server.keys["alpha"])
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r".*/dashboard/plans$"))
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Skip to content"
    focused = []
    for _ in range(10):  # the brand, then each link of the main navigation
        page.keyboard.press("Tab")
        focused.append(page.evaluate("document.activeElement.textContent.trim()"))
    nav = {"Plans", "New plan", "Quotes", "Catalog", "Runs", "Data sets", "Nodes", "Benchmarks"}
    assert nav <= set(focused), focused
    # The focused link has a visible outline.
    page.get_by_role("link", name="Nodes").focus()
    outline = page.evaluate("getComputedStyle(document.activeElement).outlineStyle")
    assert outline == "solid"
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r".*/dashboard/nodes$"))
    assert page.get_by_role("heading", name="Shutdown decisions").is_visible()
    assert page.get_by_role("row", name=re.compile("lab-h100")).is_visible()
    screenshot(page, "09-nodes")


def _done_plan_and_quote(server: LiveServer) -> tuple[str, str]:
    """A plan estimated through the API, and a 4-GPU quote of it (the widest quote page)."""
    auth = {"Authorization": f"Bearer {server.keys['alpha']}"}
    plan = {
        "model": {"name": "meta-llama/Llama-3.1-8B"},
        "method": "qlora",
        "lora": {"rank": 16},
        "micro_batch_size": 4,
        "seq_len": 1024,
        "gradient_checkpointing": True,
        "dataset": {"examples": 20000, "avg_tokens": 700},
        "epochs": 2,
    }
    plan_id = httpx.post(f"{server.url}/v1/plans", json=plan, headers=auth).json()["id"]
    deadline = time.monotonic() + 60
    while httpx.get(f"{server.url}/v1/plans/{plan_id}", headers=auth).json()["status"] != "done":
        assert time.monotonic() < deadline, "the plan did not finish"
        time.sleep(0.2)
    quote = httpx.post(f"{server.url}/v1/plans/{plan_id}/quotes", json={"gpu": "A100 80GB", "gpus": 4}, headers=auth)
    assert quote.status_code == 201, quote.text
    return plan_id, quote.json()["id"]


def _inside_viewport(locator: Any, width: int = 375) -> bool:
    box = locator.bounding_box()
    return box is not None and box["x"] >= 0 and box["x"] + box["width"] <= width and locator.is_visible()


def test_phone_width_pages_fit_the_screen(browser: Any, live_server: LiveServer) -> None:
    plan_id, quote_id = _done_plan_and_quote(live_server)
    context = browser.new_context(viewport={"width": 375, "height": 812}, device_scale_factor=2, is_mobile=True)
    page = context.new_page()
    try:
        sign_in(page, live_server)
        paths = [
            "/dashboard/plans",
            "/dashboard/plans/new",
            "/dashboard/nodes",
            "/dashboard/benchmarks",
            f"/dashboard/plans/{plan_id}",
            f"/dashboard/quotes/{quote_id}",
        ]
        for path in paths:
            page.goto(live_server.url + path)
            # The page itself never scrolls sideways.
            width = page.evaluate("document.scrollingElement.scrollWidth")
            assert width <= 375, f"{path} is {width}px wide at a 375px viewport"
            screenshot(page, "phone-" + path.strip("/").replace("/", "-")[:40])

        page.goto(f"{live_server.url}/dashboard/plans/{plan_id}")
        # The cheapest setup's costs and its marker are on screen, not in a region scrolled off to the side.
        first = page.locator("table.recs tbody tr").first
        assert _inside_viewport(first.locator(".badge", has_text="cheapest"))
        assert _inside_viewport(first.locator('td[data-label="On demand"]'))
        assert first.locator('td[data-label="On demand"]').inner_text().startswith("$")
        assert _inside_viewport(first.locator('td[data-label="Spot"]'))
        # The charts drawn for a narrow screen replace the wide ones; the cheapest mark is on screen.
        assert not page.locator("svg#memory-chart").is_visible()
        assert _inside_viewport(page.locator("svg#memory-narrow-chart"))
        assert not page.locator("svg#cost-time-chart").is_visible()
        assert _inside_viewport(page.locator("svg#cost-time-narrow-chart .mark-ring.mark-cheapest"))
        narrow_chart = page.locator("svg#cost-time-narrow-chart")
        narrow_chart.screenshot(path=str(screenshot(page, "phone-plan").with_name("phone-cost-time.png")))

        page.goto(f"{live_server.url}/dashboard/quotes/{quote_id}")
        assert _inside_viewport(page.locator("td.total"))
    finally:
        context.close()


def test_inference_memory_from_the_form_and_a_favicon(page: Any, live_server: LiveServer) -> None:
    sign_in(page, live_server)
    page.goto(f"{live_server.url}/dashboard/plans/new")
    icon = page.locator('link[rel="icon"]').get_attribute("href")
    assert icon is not None
    response = httpx.get(live_server.url + icon)
    assert response.status_code == 200 and response.headers["content-type"].startswith("image/svg+xml")
    page.get_by_label("Inference memory").check()
    # The inference form has its own inputs; the training ones (method, micro-batch) are hidden.
    assert not page.get_by_label("Method").is_visible()
    page.get_by_label("Model (type to search").fill("meta-llama/Llama-3.1-8B")
    page.get_by_label("Weight quantization").select_option("awq")
    page.get_by_label("KV cache dtype").select_option("fp8")
    page.get_by_label("Concurrent sequences").fill("8")
    page.get_by_label("Context length (tokens per sequence)").fill("4096")
    page.get_by_role("button", name="Plan it").click()
    page.get_by_role("heading", name="Fit per card").wait_for()
    assert "inference memory" in page.locator("h1").inner_text()
    assert page.locator('svg#memory-chart rect.segment[data-component="kv_cache"]').count() == 1
    assert page.locator("table.fits tbody tr").count() >= 10
    assert "int4 AWQ" in page.locator("dl.facts").first.inner_text()
    screenshot(page, "10-inference")
    # Nothing was stored: plans are training runs.
    plans = httpx.get(f"{live_server.url}/v1/plans", headers={"Authorization": f"Bearer {live_server.keys['alpha']}"})
    assert all(p["model"] != "meta-llama/Llama-3.1-8B" or p["method"] != "full" for p in plans.json()["items"])


def test_benchmarks_page_draws_the_public_cases_with_the_identity_line(page: Any, live_server: LiveServer) -> None:
    sign_in(page, live_server)
    page.goto(f"{live_server.url}/dashboard/benchmarks")
    memory = page.locator("svg#bench-memory-chart")
    assert memory.locator("line.identity").count() == 1
    assert memory.locator("circle.series-public").count() > 50
    assert page.locator("svg#bench-tokens-chart circle.point").count() > 20
    screenshot(page, "08-benchmarks")


def test_another_organization_gets_404_pages_in_the_browser(page: Any, live_server: LiveServer) -> None:
    created = httpx.post(
        f"{live_server.url}/v1/plans",
        json={
            "model": {"name": "Qwen/Qwen2.5-0.5B"},
            "method": "lora",
            "lora": {"rank": 8},
            "seq_len": 256,
            "dataset": {"tokens": 1_000_000},
        },
        headers={"Authorization": f"Bearer {live_server.keys['alpha']}"},
    ).json()
    sign_in(page, live_server, "beta")
    response = page.goto(f"{live_server.url}/dashboard/plans/{created['id']}")
    assert response is not None and response.status == 404
    assert page.get_by_role("heading", name="Not found").is_visible()
    page.goto(f"{live_server.url}/dashboard/plans")
    assert created["id"] not in page.content()


def test_the_api_docs_render_with_the_network_off(browser: Any, live_server: LiveServer) -> None:
    """/docs (Swagger UI) and /redoc load their scripts and styles from gpuplan itself: with every request
    to another host refused, both pages render the API's operations."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(30_000)
    outside: list[str] = []

    def only_loopback(route: Any) -> None:
        if route.request.url.startswith(live_server.url):
            route.continue_()
        else:
            outside.append(f"{route.request.resource_type} {route.request.url}")
            route.abort()

    context.route("**/*", only_loopback)
    page = context.new_page()
    try:
        page.goto(f"{live_server.url}/docs")
        page.locator(".swagger-ui .info .title", has_text="gpuplan").wait_for()
        page.locator(".opblock-summary-path", has_text="/v1/plans").first.wait_for()
        screenshot(page, "api-docs-offline")
        page.goto(f"{live_server.url}/redoc")
        page.get_by_text("Plan LLM fine-tuning runs").first.wait_for()
        page.get_by_text("/v1/estimate").first.wait_for(state="attached")
    finally:
        context.close()
    # Nothing the pages need comes from elsewhere; ReDoc's bundle only asks cdn.redoc.ly for the small
    # "powered by" logo in its menu, which shows as missing.
    assert [o for o in outside if not o.startswith("image ")] == [], outside


LIST_PAGES = ("/dashboard/plans", "/dashboard/quotes", "/dashboard/catalog", "/dashboard/runs", "/dashboard/datasets")


@pytest.mark.parametrize("width", [1280, 375])
def test_the_list_pages_show_every_column_on_screen_at_desktop_and_phone_widths(
    browser: Any, live_server: LiveServer, width: int
) -> None:
    """The plans list, quotes, catalog, runs and data sets: no page scrolls sideways, and every cell of their
    tables (cost and date included) lies inside the viewport, at 1280 px and on a 375 px phone."""
    plan_id, quote_id = _done_plan_and_quote(live_server)
    auth = {"Authorization": f"Bearer {live_server.keys['alpha']}"}
    node = httpx.post(f"{live_server.url}/v1/nodes", json={"name": f"w{width}", "gpu": "A100 80GB"}, headers=auth)
    run = {"node_ids": [node.json()["id"]], "checkpoint_dir": "/data/out", "bucket": "list-pages"}
    assert httpx.post(f"{live_server.url}/v1/plans/{plan_id}/runs", json=run, headers=auth).status_code == 201
    phone = width < 600
    context = browser.new_context(viewport={"width": width, "height": 900}, is_mobile=phone)
    context.set_default_timeout(30_000)
    page = context.new_page()
    try:
        sign_in(page, live_server)
        for path in LIST_PAGES:
            page.goto(live_server.url + path)
            assert page.locator("h1").is_visible()
            scroll = page.evaluate("document.scrollingElement.scrollWidth")
            assert scroll <= width, f"{path} is {scroll}px wide at {width}px"
            cells = page.locator("table.cards td")
            for i in range(min(cells.count(), 60)):
                box = cells.nth(i).bounding_box()
                assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= width + 0.5, (path, i, box)
            screenshot(page, f"list-{width}-" + path.rsplit("/", 1)[1])
        page.goto(f"{live_server.url}/dashboard/quotes")
        page.locator(f'a[href="/dashboard/quotes/{quote_id}"]').click()
        page.wait_for_url(re.compile(rf".*/dashboard/quotes/{quote_id}$"))
        page.goto(f"{live_server.url}/dashboard/catalog?gpu=A100+80GB")
        assert page.locator("section.card-offers h2").count() == 1
        assert "A100 80GB" in page.locator("section.card-offers h2").inner_text()
    finally:
        context.close()
