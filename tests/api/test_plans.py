from __future__ import annotations

from typing import Any

from tests.api.conftest import QLORA_PLAN, Api


def test_health(api: Api) -> None:
    response = api.client.get("/healthz")
    assert response.status_code == 200 and response.json()["status"] == "ok"


def test_no_key_is_401_and_bad_key_is_401(api: Api) -> None:
    assert api.client.get("/v1/plans").status_code == 401
    assert api.client.get("/v1/plans", headers={"Authorization": "Bearer nope"}).status_code == 401
    assert api.client.get("/v1/plans", headers={"Authorization": "Basic abc"}).status_code == 401


def test_submit_plan_and_get_recommendations(api: Api) -> None:
    response = api.client.post("/v1/plans", json=QLORA_PLAN, headers=api.headers())
    assert response.status_code == 202, response.text
    plan_id = response.json()["id"]
    assert response.headers["Location"] == f"/v1/plans/{plan_id}"
    body = api.wait_for_plan(plan_id)
    assert body["status"] == "done", body.get("error")
    recs = body["recommendations"]
    assert recs, body
    costs = [r["expected_cost_usd"] for r in recs]
    assert costs == sorted(costs)
    cheapest = recs[0]
    for field in ("gpu", "gpus", "fits", "peak_gib_per_gpu", "gpu_memory_gib", "hours", "cost_usd", "spot_cost_usd"):
        assert field in cheapest
    for field in ("pricing", "expected_cost_usd", "cost_breakdown", "scaling_efficiency", "nodes", "stale_price"):
        assert field in cheapest
    assert cheapest["fits"] and cheapest["peak_gib_per_gpu"] <= 0.9 * cheapest["gpu_memory_gib"]
    assert body["estimate"]["memory"]["peak_device_gib"] > 0


def _cheapest(api: Api, plan: dict[str, Any]) -> dict[str, Any]:
    plan_id = api.client.post("/v1/plans", json=plan, headers=api.headers()).json()["id"]
    body = api.wait_for_plan(plan_id)
    assert body["status"] == "done", body.get("error")
    rec: dict[str, Any] = body["recommendations"][0]
    return rec


def test_lora_and_full_need_larger_cards_or_more_gpus_than_qlora(api: Api) -> None:
    qlora = _cheapest(api, QLORA_PLAN)
    lora = _cheapest(api, {**QLORA_PLAN, "method": "lora"})
    full = _cheapest(api, {**QLORA_PLAN, "method": "full", "lora": None})
    for rec in (lora, full):
        # A larger card, more GPUs, or the same card with states offloaded to CPU memory.
        bigger = rec["gpu_memory_gib"] > qlora["gpu_memory_gib"] or rec["gpus"] > qlora["gpus"]
        assert bigger or rec["cpu_offload"], (qlora, rec)
    # Memory per GPU follows the method: QLoRA < LoRA, and a full fine-tune needs several GPUs' worth.
    if not lora["cpu_offload"]:
        shards = lora["gpus"] if lora["sharding"] == "fsdp" else 1
        assert qlora["peak_gib_per_gpu"] < lora["peak_gib_per_gpu"] * shards
    if not full["cpu_offload"]:
        assert full["peak_gib_per_gpu"] * full["gpus"] > 80
    else:
        assert full["host_ram_gib_per_node"] > 40


def test_list_plans_pages(api: Api) -> None:
    ids = [api.client.post("/v1/plans", json=QLORA_PLAN, headers=api.headers()).json()["id"] for _ in range(3)]
    page = api.client.get("/v1/plans?limit=2", headers=api.headers()).json()
    assert len(page["items"]) == 2 and page["next_cursor"]
    rest = api.client.get(f"/v1/plans?limit=2&before={page['next_cursor']}", headers=api.headers()).json()
    assert {i["id"] for i in page["items"] + rest["items"]} == set(ids)


def test_idempotency_key(api: Api) -> None:
    headers = {**api.headers(), "Idempotency-Key": "run-42"}
    first = api.client.post("/v1/plans", json=QLORA_PLAN, headers=headers)
    again = api.client.post("/v1/plans", json=QLORA_PLAN, headers=headers)
    assert first.status_code == 202 and again.status_code == 200
    assert first.json()["id"] == again.json()["id"]
    other = api.client.post("/v1/plans", json={**QLORA_PLAN, "seq_len": 1024}, headers=headers)
    assert other.status_code == 409 and other.json()["field"] == "Idempotency-Key"
    # Another organization may use the same key for its own plan.
    beta = api.client.post("/v1/plans", json=QLORA_PLAN, headers={**api.headers("beta"), "Idempotency-Key": "run-42"})
    assert beta.status_code == 202 and beta.json()["id"] != first.json()["id"]


def test_tenancy_other_organizations_plans_are_invisible(api: Api) -> None:
    plan_id = api.client.post("/v1/plans", json=QLORA_PLAN, headers=api.headers("alpha")).json()["id"]
    assert api.client.get(f"/v1/plans/{plan_id}", headers=api.headers("beta")).status_code == 404
    assert plan_id not in {p["id"] for p in api.client.get("/v1/plans", headers=api.headers("beta")).json()["items"]}
    assert api.client.get(f"/v1/plans/{plan_id}", headers=api.headers("alpha")).status_code == 200


def test_bad_plans_are_422_naming_the_field(api: Api) -> None:
    cases = [
        ({**QLORA_PLAN, "method": "lorra"}, "method"),
        ({**QLORA_PLAN, "micro_batch_size": 0}, "micro_batch_size"),
        ({**QLORA_PLAN, "dataset": {"examples": 10}}, "dataset"),
        ({**QLORA_PLAN, "model": {"name": "meta-llama/Llama-9-1B"}}, "model.name"),
        ({**QLORA_PLAN, "constraints": {"budget_usd": -5}}, "constraints.budget_usd"),
        ({**QLORA_PLAN, "dataset": None}, "dataset"),
        ({**QLORA_PLAN, "model": {"generic": {"parameters": 10**9}}}, "model.generic"),
        ({**QLORA_PLAN, "mode": "inference", "method": "full", "lora": None}, "mode"),
    ]
    for body, field in cases:
        response = api.client.post("/v1/plans", json=body, headers=api.headers())
        assert response.status_code == 422, (body, response.text)
        text = (
            response.json()["message"]
            + " ".join(response.json().get("details", []))
            + str(response.json().get("field"))
        )
        assert field in text, (field, response.json())


def test_an_unknown_model_gets_the_apis_own_hint(api: Api) -> None:
    body = {**QLORA_PLAN, "model": {"name": "meta-llama/Llama-4-Scout-17B-16E"}}
    for path in ("/v1/plans", "/v1/estimate"):
        response = api.client.post(path, json=body, headers=api.headers())
        assert response.status_code == 422, response.text
        message = response.json()["message"]
        assert "Nothing in it is close" in message and message.endswith("Send its config.json as model.config instead.")
        assert "--config" not in message


def test_an_instruct_name_is_estimated_with_a_note(api: Api) -> None:
    body = {k: v for k, v in QLORA_PLAN.items() if k not in ("dataset", "epochs")}
    body["model"] = {"name": "meta-llama/Llama-3.1-8B-Instruct"}
    response = api.client.post("/v1/estimate", json=body, headers=api.headers())
    assert response.status_code == 200, response.text
    assert response.json()["warnings"][0].startswith(
        "model.name: 'meta-llama/Llama-3.1-8B-Instruct' is estimated as 'meta-llama/Llama-3.1-8B'"
    )


def test_estimate_is_synchronous_and_stores_nothing(api: Api) -> None:
    body = {k: v for k, v in QLORA_PLAN.items() if k not in ("dataset", "epochs")}
    response = api.client.post("/v1/estimate?gpu=A100%2080GB", json=body, headers=api.headers())
    assert response.status_code == 200, response.text
    data = response.json()
    assert data["memory"]["peak_allocated_gib"] > 0 and data["throughput"]["tokens_per_s"] > 0
    low, high = data["memory"]["interval_gib"]
    assert low < high and data["memory"]["intervals_gib"]["device"] == [low, high]
    assert api.client.get("/v1/plans", headers=api.headers()).json()["items"] == []
    bad = api.client.post("/v1/estimate?gpu=Voodoo%205", json=body, headers=api.headers())
    assert bad.status_code == 422 and bad.json()["field"] == "gpu"


def test_plans_left_unfinished_by_a_stopped_process_resume_on_start(api: Api) -> None:
    from fastapi.testclient import TestClient
    from sqlalchemy import update

    from services.api.app import create_app
    from services.core.db import make_engine, make_sessionmaker, unit_of_work
    from services.core.settings import Settings
    from services.plans.tables import PlanRow

    plan_id = api.client.post("/v1/plans", json=QLORA_PLAN, headers=api.headers()).json()["id"]
    assert api.wait_for_plan(plan_id)["status"] == "done"
    # Pretend the process died mid-estimate.
    with unit_of_work(make_sessionmaker(make_engine(api.url))) as session:
        session.execute(update(PlanRow).where(PlanRow.id == plan_id).values(status="running", estimate=None))
    with TestClient(create_app(Settings(database_url=api.url))) as client:
        restarted = Api(client=client, url=api.url, keys=api.keys)
        body = restarted.wait_for_plan(plan_id)
    assert body["status"] == "done" and body["estimate"] is not None


TINY_CONFIG = {
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 3,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "vocab_size": 32000,
    "tie_word_embeddings": False,
}


def test_trace_is_stored_beside_the_estimate(api: Api) -> None:
    from tests.conftest import require_trace_extra

    require_trace_extra()
    plan = {**QLORA_PLAN, "model": {"name": "tiny", "config": TINY_CONFIG}, "method": "lora", "framework": "pytorch"}
    plan_id = api.client.post("/v1/plans", json=plan, headers=api.headers()).json()["id"]
    assert api.wait_for_plan(plan_id)["status"] == "done"
    response = api.client.post(f"/v1/plans/{plan_id}/trace", headers=api.headers())
    assert response.status_code == 202 and response.json()["trace_status"] in ("queued", "running", "done")
    assert api.client.post(f"/v1/plans/{plan_id}/trace", headers=api.headers("beta")).status_code == 404
    import time

    deadline = time.monotonic() + 120
    while True:
        body = api.client.get(f"/v1/plans/{plan_id}", headers=api.headers()).json()
        if body["trace_status"] in ("done", "failed") or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert body["trace_status"] == "done", body["trace"]
    trace = body["trace"]
    assert trace["peak_allocated_gib"] > 0 and trace["breakdown"]
    assert abs(trace["disagreement_pct"]) <= 15 and trace["flagged"] is False
