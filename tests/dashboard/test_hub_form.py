"""The dashboard's plan form takes any Hugging Face id (looked up on a loopback fake of the Hub)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from tests.api.conftest import Api
from tests.dashboard.conftest import csrf_token
from tests.dashboard.test_routes import FORM, _messages
from tests.hub.conftest import INDEX, QWEN_1_8B
from tests.hub.fake_hub import FakeHub


@pytest.fixture
def fake_hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    fake = FakeHub()
    monkeypatch.setenv("HF_ENDPOINT", fake.url)
    yield fake
    fake.close()


def test_a_hub_id_typed_in_the_form_is_planned(api: Api, alpha: TestClient, fake_hub: FakeHub) -> None:
    fake_hub.add_model("Acme/Qwen1-1_8B-SFT", QWEN_1_8B, index=INDEX)
    page = alpha.get("/dashboard/plans/new")
    assert "Or any Hugging Face model id" in page.text
    form = {**FORM, "model": "Acme/Qwen1-1_8B-SFT", "csrf_token": csrf_token(page.text)}
    response = alpha.post("/dashboard/plans", data=form, follow_redirects=False)
    assert response.status_code == 303, response.text
    plan_id = response.headers["location"].rsplit("/", 1)[-1]
    done = api.wait_for_plan(plan_id)
    assert done["status"] == "done", done.get("error")
    assert done["estimate"]["model_type"] == "qwen"
    fake_hub.close()  # the plan page reads the cached config
    page = alpha.get(f"/dashboard/plans/{plan_id}")
    assert page.status_code == 200 and "Acme/Qwen1-1_8B-SFT" in page.text


def test_a_hub_id_that_is_not_found_or_gated_is_shown_beside_the_model(alpha: TestClient, fake_hub: FakeHub) -> None:
    fake_hub.add_model("meta-llama/Gated-8B", QWEN_1_8B, gated_token="hf_ok")
    token = csrf_token(alpha.get("/dashboard/plans/new").text)
    for name, needle in (("acme/not-there", "was not found"), ("meta-llama/Gated-8B", "is gated")):
        response = alpha.post("/dashboard/plans", data={**FORM, "model": name, "csrf_token": token})
        assert response.status_code == 422
        assert _messages(response.text) == ["model"]
        assert needle in response.text
