"""What a demanding user met on the dashboard (the probe of December 2026): a refused quote request keeps what
was typed and marks the input it is about, a signed-out visit to a long but valid URL still reaches the
sign-in form, and a form clicked twice in quick succession is sent once."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from markupsafe import escape as html_escape

from tests.api.conftest import QLORA_PLAN, Api
from tests.dashboard.conftest import LiveServer, csrf_token, submit_done_plan


def _quote_form(html: str) -> tuple[str, str]:
    """The setup option selected in the plan page's quote form, and the form's CSRF token."""
    option = re.search(r'<option value="([^"]+)" data-spot="(?:yes|no)" data-pricing="[a-z_]+" selected', html)
    assert option is not None
    return option.group(1), csrf_token(html)


def _input_tag(html: str, name: str) -> str:
    found = re.search(rf'<(?:input|select)[^>]*\bid="{name}"[^>]*>', html)
    assert found is not None, f"no input {name}"
    return found.group(0)


def test_a_refused_quote_keeps_the_customer_and_setup_and_marks_the_input(api: Api, alpha: TestClient) -> None:
    plan = submit_done_plan(api)
    html = alpha.get(f"/dashboard/plans/{plan['id']}").text
    default, token = _quote_form(html)
    options = re.findall(r'<option value="([^"]+)" data-spot="no"', html)
    other = next(o for o in options if o != default)
    name = "Ådа Lovelace & Co <x>"
    form = {"setup": other, "customer_name": name, "customer_email": "nobody", "csrf_token": token}
    response = alpha.post(f"/dashboard/plans/{plan['id']}/quotes", data=form)
    assert response.status_code == 422
    page = response.text
    # What was typed and picked is still there: the name, the wrong email to correct, the setup chosen.
    assert f'value="{html_escape(name)}"' in _input_tag(page, "customer_name")
    assert 'value="nobody"' in _input_tag(page, "customer_email")
    assert re.search(rf'<option value="{re.escape(str(html_escape(other)))}"[^>]* selected', page)
    # The message is linked to the email input, the one it is about, not to the setup.
    email = _input_tag(page, "customer_email")
    assert 'aria-invalid="true"' in email and 'aria-describedby="quote-error"' in email
    assert "aria-invalid" not in _input_tag(page, "setup")
    assert "customer_email: not an email address" in page


def test_a_too_long_customer_name_is_said_in_characters_beside_its_input(api: Api, alpha: TestClient) -> None:
    plan = submit_done_plan(api)
    setup, token = _quote_form(alpha.get(f"/dashboard/plans/{plan['id']}").text)
    form = {"setup": setup, "customer_name": "n" * 5000, "csrf_token": token}
    response = alpha.post(f"/dashboard/plans/{plan['id']}/quotes", data=form)
    assert response.status_code == 422
    assert "customer_name: at most 200 characters (got 5,000)" in response.text
    assert 'aria-invalid="true"' in _input_tag(response.text, "customer_name")


def test_signed_out_a_long_valid_url_still_reaches_the_sign_in_form(api: Api) -> None:
    # Catalog filters of 100 characters each (what the page accepts) make a next= of over 500 once encoded.
    target = "/dashboard/catalog?gpu=" + "%C3%A9" * 100 + "&provider=" + "%C3%A9" * 100
    response = api.client.get(target, follow_redirects=True)
    assert response.status_code == 200, response.text[:500]
    assert 'name="api_key"' in response.text
    too_long = api.client.get("/dashboard/login", params={"next": "/dashboard/plans/" + "a" * 5000})
    assert too_long.status_code == 200 and 'name="api_key"' in too_long.text
    assert 'name="next" value="/dashboard/plans"' in too_long.text


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(20_000)
    yield context.new_page()
    context.close()


def test_a_form_clicked_three_times_quickly_is_sent_once(page: Any, live_server: LiveServer) -> None:
    page.goto(f"{live_server.url}/dashboard/login")
    page.get_by_label("API key").fill(live_server.keys["alpha"])
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(re.compile(r".*/dashboard/plans$"))
    posts: list[str] = []
    page.on("request", lambda r: posts.append(r.url) if r.method == "POST" else None)
    page.goto(f"{live_server.url}/dashboard/plans/new")
    page.evaluate(
        """() => { const b = document.querySelector('form.plan-form button[type=submit]');
                   b.click(); setTimeout(() => b.click(), 20); setTimeout(() => b.click(), 40); }"""
    )
    page.wait_for_timeout(1500)  # a second POST, if sent, aborts the first page's load
    page.wait_for_load_state("networkidle")
    assert len(posts) == 1, posts
    assert re.search(r"/dashboard/plans/[0-9a-f]{32}$", page.url), page.url
    # Back to the form (the browser's page cache may restore it): it can be sent again.
    page.go_back()
    page.wait_for_url(re.compile(r".*/dashboard/plans/new$"))
    assert page.locator("form.plan-form button[type=submit]").is_enabled()


def test_the_address_a_refused_form_leaves_opens_its_form_not_a_404(api: Api, alpha: TestClient) -> None:
    plan = submit_done_plan(api)
    # After a refused quote the address bar holds /plans/{id}/quotes: opened again, it is the plan's quote form.
    answer = alpha.get(f"/dashboard/plans/{plan['id']}/quotes", follow_redirects=False)
    assert answer.status_code == 303
    assert answer.headers["location"] == f"/dashboard/plans/{plan['id']}#quote-h"
    assert alpha.get(f"/dashboard/plans/{plan['id']}/quotes").status_code == 200
    assert alpha.get("/dashboard/plans/nope/quotes").status_code == 404  # the plan page's own 404
    calibrations = alpha.get("/dashboard/calibrations", follow_redirects=False)
    assert calibrations.headers["location"] == "/dashboard/benchmarks#bm-jobs-h"
    logout = alpha.get("/dashboard/logout", follow_redirects=False)
    assert logout.status_code == 303 and logout.headers["location"] == "/dashboard/plans"
    assert alpha.get("/dashboard/plans").status_code == 200  # still signed in: a GET signs nobody out


def test_a_refused_quote_brings_its_message_into_view(page: Any, live_server: LiveServer) -> None:
    import httpx

    from tests.api.conftest import QLORA_PLAN

    headers = {"Authorization": f"Bearer {live_server.keys['alpha']}"}
    plan_id = httpx.post(f"{live_server.url}/v1/plans", json=QLORA_PLAN, headers=headers).json()["id"]
    page.goto(f"{live_server.url}/dashboard/login")
    page.get_by_label("API key").fill(live_server.keys["alpha"])
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(re.compile(r".*/dashboard/plans$"))
    page.goto(f"{live_server.url}/dashboard/plans/{plan_id}")
    page.locator("#customer_email").wait_for()  # the plan is done (the page reloads itself until then)
    page.locator("#customer_name").fill("Zoë")
    page.locator("#customer_email").fill("bad@x")
    with page.expect_navigation():
        page.locator("#customer_email").press("Enter")
    assert page.locator("#customer_email").input_value() == "bad@x"
    assert page.locator("#customer_name").input_value() == "Zoë"
    assert page.evaluate("document.activeElement.id") == "quote-error"
    assert page.locator("#quote-error").is_visible()
    box = page.locator("#quote-error").bounding_box()
    assert box is not None and 0 <= box["y"] < page.viewport_size["height"]


def test_a_refused_calibration_names_the_step_input_and_keeps_the_form(api: Api, alpha: TestClient) -> None:
    from tests.api.test_calibration_trust import LLAMA_LORA, _node

    plan = submit_done_plan(api, plan=LLAMA_LORA)
    node = _node(api)
    token = csrf_token(alpha.get("/dashboard/benchmarks").text)
    form = {"csrf_token": token, "node_id": node["id"], "plan_id": plan["id"], "warmup_steps": "nan"}
    response = alpha.post("/dashboard/calibrations", data={**form, "timed_steps": "7"})
    assert response.status_code == 422
    page = response.text
    # Said in the input's words (it was "invalid literal for int() with base 10: 'nan'"), linked to that input.
    assert "warm-up steps: a whole number from 0 to 100 (got &#39;nan&#39;)" in page
    warmup = _input_tag(page, "cal_warmup_steps")
    assert 'value="nan"' in warmup and 'aria-describedby="calibrate-error"' in warmup
    assert 'value="7"' in _input_tag(page, "cal_timed_steps")
    assert f'<option value="{plan["id"]}" selected>' in page and f'<option value="{node["id"]}" selected>' in page
    both = alpha.post("/dashboard/calibrations", data={**form, "warmup_steps": "-1", "timed_steps": "5000"})
    assert "warm-up steps: from 0 to 100 (got -1)" in both.text  # it was "2 validation errors for CalibrationRequest"


def test_a_config_name_with_a_bidi_override_does_not_reverse_the_page(api: Api, alpha: TestClient) -> None:
    config = {
        "model_type": "llama",
        "hidden_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "intermediate_size": 1024,
        "vocab_size": 1000,
        "_name_or_path": "acme/\u202etiny\u2066-x\u200f",
    }
    plan = submit_done_plan(api, plan={**QLORA_PLAN, "model": {"config": config}})
    for page in (alpha.get(f"/dashboard/plans/{plan['id']}").text, alpha.get("/dashboard/plans").text):
        assert "acme/tiny-x" in page
        assert not re.search("[\u202a-\u202e\u2066-\u2069\u200e\u200f]", page)


def test_a_nan_catalog_filter_is_said_to_be_no_finite_number(alpha: TestClient) -> None:
    for query in ("min_memory_gib=nan", "max_usd_per_hour=NaN"):
        response = alpha.get(f"/dashboard/catalog?{query}")
        assert response.status_code == 422
        assert "finite number" in response.text and "less than or equal" not in response.text
