from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.api.conftest import QLORA_PLAN, Api
from tests.conftest import bounded_test_client
from tests.hub.conftest import INDEX, QWEN_1_8B
from tests.hub.fake_hub import FakeHub


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
    # Cost order, except that a more complex setup ranks above a simpler one only when more than 10% cheaper
    # (constraints.prefer_simpler_within): nothing ranked lower is cheaper by more than that.
    for i, a in enumerate(recs):
        assert all(b["expected_cost_usd"] >= 0.9 * a["expected_cost_usd"] for b in recs[i + 1 :]), a
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
    # A full fine-tune needs a larger card, more GPUs, or its states offloaded to CPU memory. (LoRA of
    # an 8B model and QLoRA may share the cheapest card: the L40S holds both.)
    bigger = full["gpu_memory_gib"] > qlora["gpu_memory_gib"] or full["gpus"] > qlora["gpus"]
    assert bigger or full["cpu_offload"], (qlora, full)
    # Memory per GPU follows the method: QLoRA < LoRA, and a full fine-tune needs several GPUs' worth.
    if not lora["cpu_offload"]:
        shards = lora["gpus"] if lora["sharding"] == "fsdp" else 1
        assert qlora["peak_gib_per_gpu"] < lora["peak_gib_per_gpu"] * shards
    if not full["cpu_offload"]:
        # bf16 weights and gradients and bf16 AdamW states: 8 bytes per parameter, 8.03e9 x 8 B = 59.8 GiB.
        assert full["peak_gib_per_gpu"] * full["gpus"] > 59
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


def test_an_idempotency_key_of_blanks_is_422_and_surrounding_blanks_are_trimmed(api: Api) -> None:
    """Over the ASGI app (no HTTP parser trims the header) a key of spaces made a plan under the key "   ", and
    " run-7 " was another key than "run-7", as quotes had it (services.core.idempotency)."""
    for blank in ("   ", "\t", " \t "):
        response = api.client.post("/v1/plans", json=QLORA_PLAN, headers={**api.headers(), "Idempotency-Key": blank})
        assert response.status_code == 422 and response.json()["field"] == "Idempotency-Key", (blank, response.text)
    first = api.client.post("/v1/plans", json=QLORA_PLAN, headers={**api.headers(), "Idempotency-Key": " run-7 "})
    again = api.client.post("/v1/plans", json=QLORA_PLAN, headers={**api.headers(), "Idempotency-Key": "run-7"})
    assert first.status_code == 202 and again.status_code == 200, (first.text, again.text)
    assert again.json()["id"] == first.json()["id"]
    assert len(api.client.get("/v1/plans", headers=api.headers()).json()["items"]) == 1


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
    # Not a Hub id (owner/name), so only the catalog is asked.
    body = {**QLORA_PLAN, "model": {"name": "Kimi K2 Instruct"}}
    for path in ("/v1/plans", "/v1/estimate"):
        response = api.client.post(path, json=body, headers=api.headers())
        assert response.status_code == 422, response.text
        message = response.json()["message"]
        assert "Nothing in it is close" in message and message.endswith("or send its config.json as model.config.")
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


def test_a_gptq_checkpoint_is_estimated_as_qlora_only(api: Api) -> None:
    """A GPTQ checkpoint loads 4-bit: QLoRA over it is estimated with auto-gptq's dequantization; LoRA or
    full fine-tuning of it is a 422 naming the field to change."""
    body = {k: v for k, v in QLORA_PLAN.items() if k not in ("dataset", "epochs")}
    gptq = {**TINY_CONFIG, "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128}}
    model = {"name": "someone/tiny-GPTQ", "config": gptq}
    ok = api.client.post("/v1/estimate?gpu=A100%2080GB", json={**body, "model": model}, headers=api.headers())
    assert ok.status_code == 200, ok.text
    assert "quantized base: nf4 via auto-gptq" in ok.json()["assumptions"]
    for change, field in (
        ({"method": "lora"}, "method"),
        ({"method": "full", "lora": None}, "method"),
        ({"quantization": "int8"}, "quantization"),
    ):
        bad = api.client.post(
            "/v1/estimate?gpu=A100%2080GB", json={**body, "model": model, **change}, headers=api.headers()
        )
        assert bad.status_code == 422 and bad.json()["field"] == field, (change, bad.text)
        assert "GPTQ" in bad.text


def test_estimate_accepts_inference_plans_with_their_serving_fields(api: Api) -> None:
    """Issue 22 item 6: an inference plan names the served weights' format without a training method; a
    training setting in it, or a serving format in a training plan, is a 422 naming the field."""
    body = {"model": {"name": "meta-llama/Llama-3.1-70B"}, "mode": "inference", "seq_len": 4096}
    bf16 = api.client.post("/v1/estimate", json=body, headers=api.headers())
    assert bf16.status_code == 200, bf16.text
    # 70.55e9 parameters x 2 bytes: 131.4 GiB of weights, more than one 80 GB card holds.
    assert bf16.json()["memory"]["breakdown"]["weights"] == pytest.approx(70.55e9 * 2 / 1024**3, rel=0.005)
    fits = {f["gpu"]: f["fits"] for f in bf16.json()["fits"]}
    assert not fits["H100 SXM"] and not fits["A100 80GB"]
    for quantization in ("awq", "gptq", "nf4"):
        int4 = api.client.post("/v1/estimate", json={**body, "quantization": quantization}, headers=api.headers())
        assert int4.status_code == 200, int4.text
        data = int4.json()
        assert {f["gpu"]: f["fits"] for f in data["fits"]}["H100 SXM"], quantization
        assert not any("optimizer" in a or "LoRA" in a for a in data["assumptions"]), data["assumptions"]
    served_checkpoint = {**TINY_CONFIG, "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128}}
    awq = api.client.post(
        "/v1/estimate",
        json={**body, "model": {"name": "someone/tiny-AWQ", "config": served_checkpoint}},
        headers=api.headers(),
    )
    assert awq.status_code == 200 and any("AWQ" in a for a in awq.json()["assumptions"]), awq.text
    for change, field in (
        ({"method": "qlora"}, "method"),
        ({"quantization": "int3"}, "quantization"),
        ({"kv_cache_dtype": "int2"}, "kv_cache_dtype"),
        ({"precision": "bf16-mixed"}, "precision"),
        ({"optimizer": "adamw-8bit"}, "optimizer"),
        ({"gradient_checkpointing": True}, "gradient_checkpointing"),
        ({"micro_batch_size": 0}, "micro_batch_size"),
        ({"mode": "train", "method": "qlora", "quantization": "awq"}, "quantization"),
        ({"mode": "train", "kv_cache_dtype": "fp8"}, "kv_cache_dtype"),
    ):
        bad = api.client.post("/v1/estimate", json={**body, **change}, headers=api.headers())
        # A schema problem's message starts with the field it names (services/api/errors.py).
        assert bad.status_code == 422 and bad.json()["message"].startswith(f"{field}:"), (change, bad.text)


def test_plans_left_unfinished_by_a_stopped_process_resume_on_start(api: Api) -> None:
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
    with bounded_test_client(create_app(Settings(database_url=api.url))) as client:
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


# --------------------------------------------------------------------------------------------------
# Models by Hub id (issue 13 item 1), through a loopback fake of the Hub


@pytest.fixture
def fake_hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    fake = FakeHub()
    monkeypatch.setenv("HF_ENDPOINT", fake.url)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    yield fake
    fake.close()


def test_estimate_and_plan_a_model_by_its_hub_id_then_offline(api: Api, fake_hub: FakeHub) -> None:
    fake_hub.add_model("Acme/Qwen1-1_8B-SFT", QWEN_1_8B, index=INDEX)
    body = {"model": {"name": "Acme/Qwen1-1_8B-SFT"}, "method": "lora", "seq_len": 1024}
    response = api.client.post("/v1/estimate", json=body, headers=api.headers())
    assert response.status_code == 200, response.text
    report = response.json()
    assert report["model"] == "Acme/Qwen1-1_8B-SFT" and report["model_type"] == "qwen"
    assert any("Hub checkpoint" in w and "3.4 GiB" in w for w in report["warnings"])
    fake_hub.close()  # the cached config answers from now on, also for the background estimate
    again = api.client.post("/v1/estimate", json=body, headers=api.headers())
    assert again.status_code == 200 and again.json()["parameters"] == report["parameters"]
    plan = {**QLORA_PLAN, "model": {"name": "acme/qwen1-1_8b-sft"}}
    created = api.client.post("/v1/plans", json=plan, headers=api.headers())
    assert created.status_code == 202, created.text
    plan_id = created.json()["id"]
    done = api.wait_for_plan(plan_id)
    assert done["status"] == "done", done.get("error")
    assert done["estimate"]["model_type"] == "qwen"
    assert any("Hub checkpoint" in w for w in done["warnings"])
    # The work that reads the stored plan back finds the config in the cache, with the Hub gone.
    quote = api.client.post(f"/v1/plans/{plan_id}/quotes", json={"best_for_gpus": 1}, headers=api.headers())
    assert quote.status_code == 201, quote.text
    export = api.client.get(f"/v1/plans/{plan_id}/export?format=hf-trainer", headers=api.headers())
    assert export.status_code == 200, export.text
    assert "acme/qwen1-1_8b-sft" in json.dumps(export.json()["files"]).lower()
    node = api.client.post("/v1/nodes", json={"name": "n1", "gpu": "T4"}, headers=api.headers())
    assert node.status_code in (200, 201), node.text
    node_id = node.json()["id"]
    queued = api.client.post(
        f"/v1/nodes/{node_id}/calibrations",
        json={"plan_id": plan_id, "warmup_steps": 1, "timed_steps": 1},
        headers=api.headers(),
    )
    assert queued.status_code == 202, queued.text
    agent_headers = {**api.headers(), "X-Node-Token": node.json()["node_token"]}
    job = api.client.post(f"/v1/nodes/{node_id}/calibrations/next", json={}, headers=agent_headers).json()
    assert job["plan"]["model"]["config"] == QWEN_1_8B  # the agent builds the model without the Hub


def test_hub_errors_are_distinct_422s_naming_model_name(api: Api, fake_hub: FakeHub) -> None:
    fake_hub.add_model("meta-llama/Gated-8B", QWEN_1_8B, gated_token="hf_ok")
    codes = {}
    for name in ("acme/nope-7b", "meta-llama/Gated-8B"):
        for path, body in (
            ("/v1/estimate", {"model": {"name": name}}),
            ("/v1/plans", {**QLORA_PLAN, "model": {"name": name}}),
        ):
            response = api.client.post(path, json=body, headers=api.headers())
            assert response.status_code == 422, response.text
            assert response.json()["field"] == "model.name"
            codes[name] = response.json()["error"]
    assert codes == {"acme/nope-7b": "model_not_found", "meta-llama/Gated-8B": "model_gated"}
    fake_hub.close()
    down = api.client.post("/v1/estimate", json={"model": {"name": "acme/never-seen"}}, headers=api.headers())
    assert down.status_code == 422 and down.json()["error"] == "hub_unreachable"
    assert down.json()["field"] == "model.name"
    listed = api.client.get("/v1/plans", headers=api.headers()).json()["items"]
    assert listed == []  # nothing half-stored


def test_an_unknown_family_from_the_hub_is_estimated_with_low_confidence(api: Api, fake_hub: FakeHub) -> None:
    fake_hub.add_model("acme/new-arch-1b", {**QWEN_1_8B, "model_type": "acme_lm", "intermediate_size": 5504})
    response = api.client.post("/v1/estimate", json={"model": {"name": "acme/new-arch-1b"}}, headers=api.headers())
    assert response.status_code == 200, response.text
    assert response.json()["confidence"] == "low"
    assert any("not a known family" in w for w in response.json()["warnings"])
    fake_hub.add_model("acme/sizeless", {"model_type": "acme_lm", "vocab_size": 10})
    refused = api.client.post("/v1/estimate", json={"model": {"name": "acme/sizeless"}}, headers=api.headers())
    assert refused.status_code == 422 and "hidden_size" in refused.json()["message"]


def test_offload_is_checked_against_each_offers_host_ram(api: Api) -> None:
    """Through the API: an organization's own RTX 4090 offers with too little, enough and unknown host RAM."""
    price_list = (
        "provider,gpu,gpus_per_node,on_demand_usd_per_hour,host_ram_gib_per_node\n"
        "tinyram,RTX 4090,1,0.20,16\n"
        "bigram,RTX 4090,1,0.30,256\n"
        "noram,RTX 4090,1,0.40,\n"
    )
    imported = api.client.post(
        "/v1/admin/catalog/offers", content=price_list, headers={"Authorization": f"Bearer {api.keys['admin']}"}
    )
    assert imported.status_code == 201, imported.text
    plan = {
        **QLORA_PLAN,
        "method": "full",
        "lora": None,
        "constraints": {"providers": ["tinyram", "bigram", "noram"], "max_gpus": 1},
    }
    plan_id = api.client.post("/v1/plans", json=plan, headers=api.headers()).json()["id"]
    body = api.wait_for_plan(plan_id)
    assert body["status"] == "done", body.get("error")
    recs = {r["provider"]: r for r in body["recommendations"]}
    # The cheapest node (16 GiB) cannot hold the offloaded states: not recommended, and explained.
    assert set(recs) == {"bigram", "noram"}
    assert all(r["cpu_offload"] and r["host_ram_gib_per_node"] > 40 for r in recs.values())
    assert any("of the node's 256 GiB" in n for n in recs["bigram"]["notes"])
    assert any(n.startswith("host RAM unverified") for n in recs["noram"]["notes"])
    (tiny,) = [r for r in body["rejections"] if r.get("provider") == "tinyram" and r["kind"] == "memory"]
    assert tiny["host_ram_gib_per_node"] == 16.0 and tiny["host_ram_needed_gib_per_node"] > 40
    assert "host RAM per node; tinyram's node has 16 GiB" in tiny["reason"]


def test_partial_or_decreasing_length_percentiles_are_a_422_naming_the_field(api: Api) -> None:
    dataset = {"examples": 1000, "avg_tokens": 300, "p50_tokens": 200}
    partial = api.client.post("/v1/plans", json={**QLORA_PLAN, "dataset": dataset}, headers=api.headers())
    assert partial.status_code == 422 and "dataset.p90_tokens" in partial.json()["message"]
    falling = {**dataset, "p90_tokens": 150, "p99_tokens": 900, "max_tokens": 2000}
    answer = api.client.post("/v1/plans", json={**QLORA_PLAN, "dataset": falling}, headers=api.headers())
    assert answer.status_code == 422 and "dataset.p90_tokens: 150 is below" in answer.json()["message"]
