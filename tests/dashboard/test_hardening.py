"""Issue 15.3/15.4 through the dashboard's plan form: a pasted config.json nested 5,000 deep or with
absurd sizes gets a message beside the config input, never a 500 or a stuck request."""

from __future__ import annotations

import json
import re

from fastapi.testclient import TestClient

from services.catalog.models import find_model
from tests.dashboard.conftest import csrf_token

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
