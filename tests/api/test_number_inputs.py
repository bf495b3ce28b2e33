"""No 500 and no silent coercion from a number or a time (a fuzzing pass of stop 49): every number of every request
body refuses a boolean and text, naming the field; a mean example length outside 1 to 2**22 tokens is refused
before a plan is stored (5e-324 divided by zero: a 500 on /v1/estimate, and a stored plan that failed); a time
without a zone is read as UTC (the node heartbeat compared it with an aware one: a 500).

The number fields are found generically from the OpenAPI schema, as test_integer_bounds finds the integers.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from services.nodes.schemas import SyncHealth
from tests.api.conftest import QLORA_PLAN, Api
from tests.api.test_integer_bounds import World, _with_value, request_fields


@pytest.fixture
def world(api: Api) -> World:
    return World(api)


def test_every_request_number_refuses_a_boolean_and_text(api: Api, world: World) -> None:
    fields = request_fields(api.client.get("/openapi.json").json(), "number")
    assert len(fields) >= 25, "the walk found too few number fields"
    problems = []
    for op, method, template, field, _schema in fields:
        named = field.replace("[]", ".0")
        for value in (True, "4"):
            body = _with_value(world.base(op), field, value)
            if "{calibration_id}" in template:
                template = template.replace("{calibration_id}", world.calibration_id())
            answer = api.client.request(method.upper(), world.url(template), json=body, headers=world.agent())
            text = answer.json().get("message", "") + " ".join(answer.json().get("details") or [])
            if answer.status_code != 422 or named not in text:
                problems.append(f"{op} {field}={value!r}: {answer.status_code} {answer.text[:200]}")
    assert not problems, "\n".join(problems)


def _plan_count(api: Api) -> int:
    listed = api.client.get("/v1/plans", params={"limit": 100}, headers=api.headers())
    assert listed.status_code == 200, listed.text
    return len(listed.json()["items"])


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"data": {"examples": 1000, "avg_tokens_per_example": 5e-324, "epochs": 2}}, "data.avg_tokens_per_example"),
        ({"data": {"examples": 10, "avg_tokens_per_example": 0.5}}, "data.avg_tokens_per_example"),
        ({"data": {"examples": 10**12, "avg_tokens_per_example": 1e308}}, "data.avg_tokens_per_example"),
        ({"dataset": {"examples": 10_000, "avg_tokens": 5e-324}}, "dataset.avg_tokens"),
        ({"dataset": {"examples": 10_000, "avg_tokens": 4_194_305}}, "dataset.avg_tokens"),
    ],
)
@pytest.mark.parametrize("route", ["/v1/estimate", "/v1/plans"])
def test_a_mean_example_length_out_of_range_is_refused_before_anything_is_stored(
    api: Api, route: str, data: dict[str, Any], field: str
) -> None:
    body = {key: value for key, value in QLORA_PLAN.items() if key not in ("dataset", "epochs")} | data
    before = _plan_count(api)
    answer = api.client.post(route, json=body, headers=api.headers())
    assert answer.status_code == 422, answer.text
    assert answer.json()["message"].startswith(f"{field}:"), answer.text
    assert _plan_count(api) == before


def test_the_longest_mean_example_allowed_is_estimated_in_finite_numbers(api: Api) -> None:
    body = {key: value for key, value in QLORA_PLAN.items() if key not in ("dataset", "epochs")}
    body["data"] = {"examples": 10**12, "avg_tokens_per_example": 4_194_304.0, "epochs": 1000}
    answer = api.client.post("/v1/estimate", json=body, headers=api.headers())
    assert answer.status_code == 200, answer.text
    costs = [c for c in answer.json()["costs"] if c.get("hours") is not None]
    assert costs and all(c["hours"] > 0 and c["on_demand_usd"] > 0 for c in costs)


def test_a_generic_size_beside_a_name_is_refused(api: Api) -> None:
    body = {**QLORA_PLAN, "model": {"name": "meta-llama/Llama-3.1-8B", "generic": {"parameters": 10}}}
    answer = api.client.post("/v1/estimate", json=body, headers=api.headers())
    assert answer.status_code == 422
    assert answer.json()["message"].startswith("model: ") and "'generic'" in answer.json()["message"]


def test_decreasing_percentiles_name_the_field_once(api: Api) -> None:
    dataset = {"examples": 100, "avg_tokens": 80, "p50_tokens": 100, "p90_tokens": 50, "p99_tokens": 200}
    answer = api.client.post(
        "/v1/estimate", json={**QLORA_PLAN, "dataset": {**dataset, "max_tokens": 300}}, headers=api.headers()
    )
    assert answer.status_code == 422
    message = answer.json()["message"]
    assert message.startswith("dataset.p90_tokens: 50 is below p50_tokens 100"), message
    assert "dataset.dataset" not in message


@pytest.mark.parametrize("since", ["2026-01-01T00:00:00", "2026-01-01", "2026-01-01T03:00:00+03:00"])
def test_a_sync_failure_time_without_a_zone_is_read_as_utc(api: Api, world: World, since: str) -> None:
    assert SyncHealth(last_error="x", failing_since=since).failing_since == datetime(2026, 1, 1, tzinfo=UTC)
    beat = {**world.base("nodes-heartbeat"), "sync": {"last_error": "x", "pending_bytes": 1, "failing_since": since}}
    answer = api.client.post(f"/v1/nodes/{world.node_id}/heartbeat", json=beat, headers=world.agent())
    assert answer.status_code == 200, answer.text  # was a 500: a naive time compared with an aware one
    node = api.client.get(f"/v1/nodes/{world.node_id}", headers=api.headers("admin")).json()
    # A streak cannot start before the node's last heartbeat (services.nodes.lifecycle.record_sync_health).
    assert node["sync_failing_since"].endswith(("Z", "+00:00")), node["sync_failing_since"]


@pytest.mark.parametrize("since", ["9999-12-31T23:59:59-23:59", "0001-01-01T00:00:00+23:59"])
def test_a_sync_failure_time_out_of_range_in_utc_is_a_422(api: Api, world: World, since: str) -> None:
    """A lifecycle probe (stop 50): converting these to UTC overflows datetime, and the heartbeat answered 500."""
    beat = {**world.base("nodes-heartbeat"), "sync": {"last_error": "x", "pending_bytes": 1, "failing_since": since}}
    answer = api.client.post(f"/v1/nodes/{world.node_id}/heartbeat", json=beat, headers=world.agent())
    assert answer.status_code == 422, answer.text
    assert "failing_since" in answer.text and "out of range" in answer.text


def test_a_lora_role_given_twice_is_refused(api: Api) -> None:
    body = {**QLORA_PLAN, "lora": {"rank": 16, "targets": ["q", "v", "q"]}}
    answer = api.client.post("/v1/estimate", json=body, headers=api.headers())
    assert answer.status_code == 422
    assert answer.json()["message"].startswith("lora.targets: "), answer.text
    assert "q given more than once" in answer.json()["message"]
