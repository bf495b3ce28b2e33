"""A query parameter that takes one value, given twice, is a 422 naming it; FastAPI silently took the last."""

from __future__ import annotations

from tests.api.conftest import QLORA_PLAN, Api


def _refused(response_json: dict[str, object], name: str) -> bool:
    return response_json["field"] == f"query.{name}" and "more than once" in str(response_json["message"])


def test_a_repeated_export_format_is_refused_naming_it(api: Api) -> None:
    plan_id = api.client.post("/v1/plans", json=QLORA_PLAN, headers=api.headers()).json()["id"]
    assert api.wait_for_plan(plan_id)["status"] == "done"
    path = f"/v1/plans/{plan_id}/export"
    response = api.client.get(f"{path}?format=axolotl&format=deepspeed", headers=api.headers())
    assert response.status_code == 422 and _refused(response.json(), "format"), response.text
    assert "'axolotl', 'deepspeed'" in response.json()["message"]
    # The same value twice is still two values of a parameter that takes one.
    twice = api.client.get(f"{path}?format=deepspeed&recommendation=0&recommendation=0", headers=api.headers())
    assert twice.status_code == 422 and _refused(twice.json(), "recommendation"), twice.text
    assert api.client.get(f"{path}?format=deepspeed", headers=api.headers()).status_code == 200


def test_repeats_are_refused_on_every_router_and_shared_parameter(api: Api) -> None:
    for path, name in (
        ("/v1/plans?limit=2&limit=3", "limit"),
        ("/v1/catalog/offers?gpu=A100&gpu=H100", "gpu"),
        ("/v1/nodes?limit=5&limit=5", "limit"),  # services/api/deps.py's PageLimit
        ("/v1/runs?plan_id=a&plan_id=b", "plan_id"),
    ):
        response = api.client.get(path, headers=api.headers("admin"))
        assert response.status_code == 422 and _refused(response.json(), name), (path, response.text)
    # One value of each, and parameters the route does not declare, are as before.
    assert api.client.get("/v1/plans?limit=2&other=1&other=2", headers=api.headers()).status_code == 200


def test_a_list_valued_parameter_still_takes_repeats(api: Api) -> None:
    csv = "provider,gpu,on_demand_usd_per_hour,region\ncloudrux,A40,0.01,dc\nown,L4,0.02,lab\n"
    assert api.client.post("/v1/admin/catalog/offers", content=csv, headers=api.headers("admin")).status_code == 201
    removed = api.client.delete("/v1/admin/catalog/offers?provider=cloudrux&provider=own", headers=api.headers("admin"))
    assert removed.status_code == 200 and removed.json()["removed"] == 2, removed.text
