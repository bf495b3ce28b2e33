"""Nodes, calibration on a CPU node with a tiny model, and the calibrated estimate that follows."""

from __future__ import annotations

from typing import Any

from services.agent.agent import Agent
from tests.api.conftest import Api
from tests.conftest import require_trace_extra

TINY = {
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
    "tie_word_embeddings": False,
}
TINY_PLAN: dict[str, Any] = {
    "model": {"name": "tiny-llama-test", "config": TINY},
    "method": "lora",
    "lora": {"rank": 4},
    "framework": "pytorch",
    "micro_batch_size": 2,
    "seq_len": 64,
    "dataset": {"tokens": 1_000_000},
    "epochs": 1,
}


def _t4_estimate(api: Api) -> dict[str, Any]:
    body = {k: v for k, v in TINY_PLAN.items() if k not in ("dataset", "epochs")}
    response = api.client.post("/v1/estimate?gpu=T4", json=body, headers=api.headers())
    assert response.status_code == 200, response.text
    throughput: dict[str, Any] = response.json()["throughput"]
    return throughput


def test_node_registration_heartbeat_and_tenancy(api: Api) -> None:
    node = api.client.post(
        "/v1/nodes",
        json={"name": "box-1", "gpu": "a100-80gb", "gpu_count": 8, "gpu_memory_gib": 80, "provider": "cloudrux"},
        headers=api.headers(),
    )
    assert node.status_code == 201 and node.json()["gpu"] == "A100 80GB"
    node_id = node.json()["id"]
    beat = api.client.post(
        f"/v1/nodes/{node_id}/heartbeat",
        headers=api.headers(),
        json={
            "gpus": [{"index": 0, "utilisation_pct": 97, "memory_used_gib": 60, "memory_total_gib": 80}],
            "job_running": True,
        },
    )
    assert beat.status_code == 200 and beat.json()["job_running"] is True
    assert api.client.get(f"/v1/nodes/{node_id}", headers=api.headers("beta")).status_code == 404
    assert api.client.get("/v1/nodes", headers=api.headers("beta")).json()["items"] == []
    assert api.client.post("/v1/nodes", json={"name": "x", "gpu": "Voodoo 5"}, headers=api.headers()).status_code == 422


def test_cpu_calibration_stores_a_benchmark_that_changes_the_next_estimate(api: Api) -> None:
    require_trace_extra()
    headers = api.headers()
    first = api.client.post("/v1/plans", json=TINY_PLAN, headers=headers).json()["id"]
    assert api.wait_for_plan(first)["status"] == "done"
    before = _t4_estimate(api)
    assert before["utilisation_source"].startswith("prior")
    # A CPU-only node standing in for a T4 (CI has no GPU); the agent talks to the API like a real node.
    agent = Agent(api.client, api.keys["alpha"])
    node_id = agent.register(name="ci-cpu-node", gpu="T4")
    calibration = api.client.post(
        f"/v1/nodes/{node_id}/calibrations",
        headers=headers,
        json={"plan_id": first, "warmup_steps": 1, "timed_steps": 2},
    )
    assert calibration.status_code == 202 and calibration.json()["status"] == "queued"
    assert agent.poll_once() is True
    assert agent.poll_once() is False  # nothing left to do
    benchmarks = api.client.get("/v1/benchmarks?gpu=T4&method=lora", headers=headers).json()["items"]
    assert len(benchmarks) == 1
    bench = benchmarks[0]
    assert bench["tokens_per_s"] > 0 and bench["hardware_utilisation"] is not None
    assert bench["predicted_tokens_per_s"] > 0 and bench["device"] == "cpu"
    after = _t4_estimate(api)
    assert after["utilisation_source"].startswith("calibrated")
    assert after["utilisation_assumed"] == bench["hardware_utilisation"]
    assert after["tokens_per_s"] != before["tokens_per_s"]
    assert api.client.get("/v1/benchmarks", headers=api.headers("beta")).json()["items"] == []
