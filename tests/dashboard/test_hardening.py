"""Issue 15.3/15.4 through the dashboard's plan form: a pasted config.json nested 5,000 deep or with
absurd sizes gets a message beside the config input, never a 500 or a stuck request."""

from __future__ import annotations

import json
import re

from fastapi.testclient import TestClient

from services.catalog.models import find_model
from tests.api.conftest import QLORA_PLAN, Api
from tests.dashboard.conftest import csrf_token, submit_done_plan

FORM = {
    "model_source": "config",
    "method": "qlora",
    "lora_rank": "16",
    "precision": "bf16",
    "micro_batch_size": "4",
    "seq_len": "512",
    "examples": "10000",
    "avg_tokens": "512",
    "tokens": "",
    "epochs": "3",
}


def _post_config(client: TestClient, config_json: str) -> tuple[int, str]:
    token = csrf_token(client.get("/dashboard/plans/new").text)
    response = client.post("/dashboard/plans", data={**FORM, "config_json": config_json, "csrf_token": token})
    return response.status_code, response.text


def _config_message(html: str) -> str:
    found = re.search(r'id="config_json-error"[^>]*>([^<]*)<', html)
    assert found is not None, html[:2000]
    return found.group(1)


def test_a_config_nested_5000_deep_is_a_message_beside_the_input(alpha: TestClient) -> None:
    status, html = _post_config(alpha, '{"a": ' * 5_000 + "1" + "}" * 5_000)
    assert status == 422
    assert "nested more than 32 levels deep" in _config_message(html)


def test_a_200_million_layer_config_is_refused_beside_the_input(alpha: TestClient) -> None:
    config = {**find_model("meta-llama/Llama-3.1-8B").config, "num_hidden_layers": 200_000_000}
    status, html = _post_config(alpha, json.dumps(config))
    assert status == 422
    assert "num_hidden_layers" in html and "at most 1,024" in html


def test_a_config_with_infinity_is_a_message_beside_the_input(alpha: TestClient) -> None:
    raw = json.dumps(find_model("meta-llama/Llama-3.1-8B").config).replace("500000.0", "Infinity")
    assert "Infinity" in raw
    status, html = _post_config(alpha, raw)
    assert status == 422
    assert "finite number" in _config_message(html)


def test_a_nul_in_the_url_or_an_oversized_form_is_a_dashboard_page_not_json(alpha: TestClient) -> None:
    # The request limits refuse these before any route runs; on the dashboard a browser gets a page.
    nul = alpha.get("/dashboard/datasets?before=%00")
    token = csrf_token(alpha.get("/dashboard/plans/new").text)
    huge = alpha.post("/dashboard/plans", data={**FORM, "config_json": "x" * 1_100_000, "csrf_token": token})
    for response, status, field in ((nul, 422, "before"), (huge, 413, "body")):
        assert response.status_code == status
        assert response.headers["content-type"].startswith("text/html"), response.text[:200]
        assert f'role="alert">{field}: ' in response.text
        assert response.headers["content-security-policy"].startswith("default-src 'self'")
    # The API keeps its JSON body.
    api = alpha.get("/v1/plans?before=%00")
    assert api.status_code == 422 and api.json()["field"] == "before"


def _alerts(html: str) -> list[str]:
    """The texts of the page's messages: the error page's alert, and the form's messages beside its inputs."""
    return re.findall(r'(?:role="alert"|class="message" id="[a-z_]+-error")>([^<]*)<', html)


def test_a_long_input_is_echoed_cut_short_in_messages_but_kept_in_its_input(alpha: TestClient) -> None:
    long = "x" * 3_000
    token = csrf_token(alpha.get("/dashboard/plans/new").text)
    form = {**FORM, "model_source": "catalog", "model": long, "budget_usd": long, "csrf_token": token}
    refused = alpha.post("/dashboard/plans", data=form)
    assert refused.status_code == 422
    assert f'value="{long}"' in refused.text  # the form keeps what was typed, to fix it
    pages = [
        refused,
        alpha.get(f"/dashboard/{long}"),
        alpha.get(f"/dashboard/plans/{long}"),
        alpha.get(f"/dashboard/quotes/{'word ' * 600}"),
    ]
    for page in pages:
        alerts = _alerts(page.text)
        assert alerts, page.text[:2000]
        for alert in alerts:
            assert len(alert) < 300 and "…" in alert, (page.url, alert[:400])


def test_a_budget_under_a_cent_is_not_shown_as_free(api: Api, alpha: TestClient) -> None:
    plan = submit_done_plan(api, plan={**QLORA_PLAN, "constraints": {"budget_usd": 1e-300}})
    html = alpha.get(f"/dashboard/plans/{plan['id']}").text
    assert "<dt>budget</dt><dd>&lt; $0.01</dd>" in html, re.findall(r"<dt>budget</dt><dd>[^<]*", html)


def test_gpu_utilisation_rounds_halves_away_from_zero(api: Api, alpha: TestClient) -> None:
    node = alpha.post(
        "/v1/nodes", json={"name": "half-box", "gpu": "H100 SXM", "gpu_count": 2}, headers=api.headers()
    ).json()
    gpus = [
        {"index": 0, "utilisation_pct": 12.5, "memory_used_gib": 1.0, "memory_total_gib": 80.0},
        {"index": 1, "utilisation_pct": 13.5, "memory_used_gib": 1.0, "memory_total_gib": 80.0},
    ]
    beat = alpha.post(
        f"/v1/nodes/{node['id']}/heartbeat",
        json={"gpus": gpus, "job_running": True},
        headers={**api.headers(), "X-Node-Token": node["node_token"]},
    )
    assert beat.is_success, beat.text
    html = alpha.get("/dashboard/nodes").text
    shown = re.findall(r"GPU (\d) utilisation (\d+)%", html)
    assert shown == [("0", "13"), ("1", "14")], shown
    assert "</meter> 13% " in html and "</meter> 14% " in html
