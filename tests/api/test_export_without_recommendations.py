"""Input probes of the plans API: exporting a plan that has no recommended setup answered "use 0..0", an index
that does not exist."""

from __future__ import annotations

from tests.api.conftest import QLORA_PLAN, Api


def test_exporting_a_plan_without_recommendations_says_there_is_none(api: Api) -> None:
    body = {**QLORA_PLAN, "constraints": {"providers": ["no-such-provider"]}}
    created = api.client.post("/v1/plans", json=body, headers=api.headers())
    assert created.status_code == 202, created.text
    plan = api.wait_for_plan(created.json()["id"])
    assert plan["status"] == "done" and plan["recommendations"] == [], plan
    answer = api.client.get(f"/v1/plans/{plan['id']}/export", params={"format": "hf-trainer"}, headers=api.headers())
    assert answer.status_code == 422, answer.text
    assert answer.json()["field"] == "recommendation"
    assert "no recommended setup" in answer.json()["message"] and "0..0" not in answer.json()["message"]
