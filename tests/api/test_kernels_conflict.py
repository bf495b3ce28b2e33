"""Kernels that conflict with the framework are refused naming kernels, the field to change."""

from __future__ import annotations

import pytest

from tests.api.conftest import QLORA_PLAN, Api


@pytest.mark.parametrize(
    ("framework", "kernels"), [("hf-trainer", "unsloth"), ("torchtune", "unsloth"), ("unsloth", "liger")]
)
def test_an_estimate_names_kernels(api: Api, framework: str, kernels: str) -> None:
    body = {**QLORA_PLAN, "framework": framework, "kernels": kernels}
    response = api.client.post("/v1/estimate", json=body, headers=api.headers())
    assert response.status_code == 422 and response.json()["field"] == "kernels", response.text
    assert response.json()["message"].startswith("kernels: ") and "framework" not in response.json()["field"]


def test_an_export_replanned_for_another_framework_names_kernels(api: Api) -> None:
    # Unsloth's kernels are valid in the plan; the axolotl export re-plans it for axolotl, where they are not:
    # the refusal named "framework", which the caller never set to axolotl.
    body = {**QLORA_PLAN, "framework": "unsloth", "kernels": "unsloth"}
    plan_id = api.client.post("/v1/plans", json=body, headers=api.headers()).json()["id"]
    assert api.wait_for_plan(plan_id)["status"] == "done"
    response = api.client.get(f"/v1/plans/{plan_id}/export?format=axolotl", headers=api.headers())
    assert response.status_code == 422 and response.json()["field"] == "kernels", response.text
    assert "Traceback" not in response.text
