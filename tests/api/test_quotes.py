from __future__ import annotations

from typing import Any

from tests.api.conftest import QLORA_PLAN, Api


def _done_plan(api: Api, plan: dict[str, Any] | None = None, org: str = "alpha") -> dict[str, Any]:
    plan_id = api.client.post("/v1/plans", json=plan or QLORA_PLAN, headers=api.headers(org)).json()["id"]
    body = api.wait_for_plan(plan_id, org)
    assert body["status"] == "done", body.get("error")
    return body


def test_quote_for_a_multi_gpu_setup(api: Api) -> None:
    plan = _done_plan(api)
    response = api.client.post(
        f"/v1/plans/{plan['id']}/quotes",
        json={"gpu": "A100 80GB", "gpus": 4, "provider": "cloudrux"},
        headers=api.headers(),
    )
    assert response.status_code == 201, response.text
    quote = response.json()
    assert quote["setup"]["gpus"] == 4 and quote["setup"]["gpu"] == "A100 80GB"
    gpu_line = quote["line_items"][0]
    assert gpu_line["unit"] == "GPU-hour" and gpu_line["unit_price_usd"] == 2.24
    assert abs(quote["total_usd"] - sum(i["amount_usd"] for i in quote["line_items"])) < 0.011
    assert quote["valid_until"] > quote["created_at"]
    assert any("scaling efficiency" in a for a in quote["assumptions"])
    again = api.client.get(f"/v1/quotes/{quote['id']}", headers=api.headers()).json()
    assert again == quote


def test_best_for_n_gpus_and_spot(api: Api) -> None:
    plan = _done_plan(api)
    response = api.client.post(
        f"/v1/plans/{plan['id']}/quotes", json={"best_for_gpus": 2, "spot": True}, headers=api.headers()
    )
    assert response.status_code == 201, response.text
    quote = response.json()
    assert quote["setup"]["gpus"] == 2 and quote["setup"]["pricing"] == "spot"


def test_quotes_are_immutable_and_private(api: Api) -> None:
    plan = _done_plan(api)
    quote = api.client.post(f"/v1/plans/{plan['id']}/quotes", json={"best_for_gpus": 1}, headers=api.headers()).json()
    assert api.client.put(f"/v1/quotes/{quote['id']}", json={}, headers=api.headers()).status_code == 405
    assert api.client.get(f"/v1/quotes/{quote['id']}", headers=api.headers("beta")).status_code == 404
    other = api.client.post(f"/v1/plans/{plan['id']}/quotes", json={"best_for_gpus": 1}, headers=api.headers("beta"))
    assert other.status_code == 404


def test_bad_quote_requests(api: Api) -> None:
    plan = _done_plan(api)
    url = f"/v1/plans/{plan['id']}/quotes"
    assert api.client.post(url, json={}, headers=api.headers()).status_code == 422
    response = api.client.post(url, json={"gpu": "Voodoo 5", "gpus": 2}, headers=api.headers())
    assert response.status_code == 422 and response.json()["field"] == "gpu"
    response = api.client.post(url, json={"gpu": "RTX A6000", "gpus": 1}, headers=api.headers())
    assert response.status_code == 422 and "no offer" in response.json()["message"]
    response = api.client.post(url, json={"gpu": "T4", "gpus": 1, "provider": "cloudrux"}, headers=api.headers())
    assert response.status_code == 422 and response.json()["field"] == "gpu"


def test_the_checkpoint_storage_line_is_the_checkpoint_the_planner_writes(api: Api) -> None:
    # Llama-3.1-70B has 70,553,706,496 parameters (its safetensors index); full fine-tuning in bf16 with
    # torch's AdamW saves the bf16 weights and two bf16 moments (AdamW keeps them in the parameter's
    # dtype): 6 bytes per parameter, 423.3 GB, as docs/runs.md says (the quote said 705.5).
    plan = _done_plan(
        api,
        {
            "model": {"name": "meta-llama/Llama-3.1-70B"},
            "method": "full",
            "precision": "bf16",
            "micro_batch_size": 1,
            "seq_len": 2048,
            "gradient_checkpointing": True,
            "dataset": {"examples": 1000, "avg_tokens": 1024},
            "epochs": 1,
        },
    )
    setup = plan["recommendations"][0]
    response = api.client.post(
        f"/v1/plans/{plan['id']}/quotes", json={"best_for_gpus": setup["gpus"]}, headers=api.headers()
    )
    assert response.status_code == 201, response.text
    storage = [i for i in response.json()["line_items"] if i["unit"] == "GB-month"]
    assert len(storage) == 1 and abs(storage[0]["quantity"] - 70_553_706_496 * 6 / 1e9) < 0.5, storage
