"""Nodes, calibration on a CPU node with a tiny model, and the calibrated estimate that follows."""

from __future__ import annotations

from typing import Any

import pytest

from services.agent.agent import Agent
from tests.api.conftest import Api
from tests.conftest import require_trace_extra
from tests.nodes.helpers import TINY_PLAN


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
        headers={**api.headers(), "X-Node-Token": node.json()["node_token"]},
        json={
            "gpus": [{"index": 0, "utilisation_pct": 97, "memory_used_gib": 60, "memory_total_gib": 80}],
            "job_running": True,
        },
    )
    assert beat.status_code == 200 and beat.json()["job_running"] is True
    assert api.client.get(f"/v1/nodes/{node_id}", headers=api.headers("beta")).status_code == 404
    assert api.client.get("/v1/nodes", headers=api.headers("beta")).json()["items"] == []
    assert api.client.post("/v1/nodes", json={"name": "x", "gpu": "Voodoo 5"}, headers=api.headers()).status_code == 422


@pytest.mark.parametrize("body", [[], "x", 3, [{"job_running": True}]])
def test_a_body_that_is_not_a_json_object_is_refused_naming_the_body(api: Api, body: Any) -> None:
    node = api.client.post("/v1/nodes", json={"name": "box-1", "gpu": "A100 80GB"}, headers=api.headers()).json()
    node_headers = {**api.headers(), "X-Node-Token": node["node_token"]}
    for path, headers in (
        (f"/v1/nodes/{node['id']}/heartbeat", node_headers),
        ("/v1/nodes", api.headers()),
        ("/v1/estimate", api.headers()),
        ("/v1/plans", api.headers()),
    ):
        refused = api.client.post(path, json=body, headers=headers)
        answer = refused.json()
        assert refused.status_code == 422 and answer["field"] == "body", (path, answer)
        assert answer["message"].startswith("body: must be a JSON object"), (path, answer)
    # A JSON object with a wrong field still names that field.
    wrong = api.client.post(f"/v1/nodes/{node['id']}/heartbeat", json={"gpus": 3}, headers=node_headers).json()
    assert wrong["message"].startswith("gpus: "), wrong


def test_cpu_calibration_stores_a_benchmark_that_leaves_the_estimate_alone(api: Api) -> None:
    require_trace_extra()
    headers = api.headers()
    first = api.client.post("/v1/plans", json=TINY_PLAN, headers=headers).json()["id"]
    assert api.wait_for_plan(first)["status"] == "done"
    before = _t4_estimate(api)
    assert before["utilisation_source"].startswith("prior")
    # A CPU-only node named a T4 by --gpu (CI has no GPU); the agent talks to the API like a real node. What it
    # measures is stored beside the prediction, and never calibrates a T4 (issue 25).
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
    assert bench["gemm_utilisation"] is not None
    assert bench["predicted_tokens_per_s"] > 0 and bench["device"] == "cpu"
    assert bench["used"] is False and "CPU measurement" in bench["unused_reason"]
    assert _t4_estimate(api) == before
    assert api.client.get("/v1/benchmarks", headers=api.headers("beta")).json()["items"] == []


def _calibrate_on_cpu(api: Api, plan: dict[str, Any], gpu: str = "T4") -> dict[str, Any]:
    """A plan stored, calibrated by a real agent on this CPU standing in for ``gpu``; its benchmark."""
    headers = api.headers()
    plan_id = api.client.post("/v1/plans", json=plan, headers=headers).json()["id"]
    assert api.wait_for_plan(plan_id)["status"] == "done"
    agent = Agent(api.client, api.keys["alpha"])
    node_id = agent.register(name="ci-cpu-node", gpu=gpu)
    body = {"plan_id": plan_id, "warmup_steps": 1, "timed_steps": 1}
    assert api.client.post(f"/v1/nodes/{node_id}/calibrations", headers=headers, json=body).status_code == 202
    assert agent.poll_once() is True
    found = [b for b in api.client.get("/v1/benchmarks", headers=headers).json()["items"] if b["node_id"] == node_id]
    assert len(found) == 1, found
    return dict(found[0])


def test_calibration_adapts_the_plans_lora_targets_only(api: Api) -> None:
    require_trace_extra()
    plan = {**TINY_PLAN, "lora": {"rank": 4, "targets": ["q", "v"]}}
    bench = _calibrate_on_cpu(api, plan)
    # q_proj 128 -> 4 heads x 32 = 128, v_proj 128 -> 2 KV heads x 32 = 64; rank 4 adds r x (in + out) each,
    # on 2 layers: 2 x 4 x ((128 + 128) + (128 + 64)) = 3584 (all linear layers would be 2 x 4 x 2304 = 18432).
    assert any(n == "LoRA r=4 on q_proj, v_proj: 3584 trainable parameters" for n in bench["notes"]), bench["notes"]
    assert bench["comparable"] is True and bench["hardware_utilisation"] is not None


def test_a_qlora_plan_without_bitsandbytes_is_recorded_as_not_comparable(api: Api) -> None:
    require_trace_extra()
    plan = {**TINY_PLAN, "method": "qlora"}
    bench = _calibrate_on_cpu(api, plan)
    assert bench["comparable"] is False
    assert any("QLoRA not calibrated as QLoRA" in n and "bitsandbytes" in n for n in bench["notes"]), bench["notes"]
    assert bench["hardware_utilisation"] is None and bench["mfu"] is None
    body = {k: v for k, v in plan.items() if k not in ("dataset", "epochs")}
    after = api.client.post("/v1/estimate?gpu=T4", json=body, headers=api.headers()).json()["throughput"]
    assert after["utilisation_source"].startswith("prior")  # a 16-bit run never calibrates QLoRA


# An 8B LoRA: what a T4 calibration measures for real (a tiny model's rate is floor-bound, and the GEMM
# utilisation that reproduces it is far below any real run's: implausible, never used).
LLAMA_LORA: dict[str, Any] = {
    "model": {"name": "meta-llama/Llama-3.1-8B"},
    "method": "lora",
    "lora": {"rank": 16},
    "micro_batch_size": 2,
    "seq_len": 1024,
    "gradient_checkpointing": True,
    "padding": "packed",
    "dataset": {"tokens": 1_000_000},
    "epochs": 1,
}


def _t4_estimate_of(api: Api, plan: dict[str, Any]) -> dict[str, Any]:
    body = {k: v for k, v in plan.items() if k not in ("dataset", "epochs")}
    response = api.client.post("/v1/estimate?gpu=T4", json=body, headers=api.headers())
    assert response.status_code == 200, response.text
    throughput: dict[str, Any] = response.json()["throughput"]
    return throughput


def _measured(api: Api, plan: dict[str, Any], tokens_per_s: float) -> dict[str, Any]:
    """A T4 node's agent (NVML names its T4) reports ``tokens_per_s`` measured on one GPU for the plan."""
    headers = api.headers()
    plan_id = api.client.post("/v1/plans", json=plan, headers=headers).json()["id"]
    assert api.wait_for_plan(plan_id)["status"] == "done"
    registration = {"name": "t4", "gpu": "T4", "nvml_gpu": "Tesla T4"}
    node = api.client.post("/v1/nodes", json=registration, headers=headers).json()
    agent_headers = {**headers, "X-Node-Token": node["node_token"]}
    job = {"plan_id": plan_id, "warmup_steps": 1, "timed_steps": 1}
    api.client.post(f"/v1/nodes/{node['id']}/calibrations", headers=headers, json=job)
    claimed = api.client.post(f"/v1/nodes/{node['id']}/calibrations/next", headers=agent_headers, json={}).json()
    result = {"tokens_per_s": tokens_per_s, "seconds": 1.0, "gpus": 1, "device": "Tesla T4"}
    answer = api.client.post(f"/v1/calibrations/{claimed['id']}/result", headers=agent_headers, json=result)
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def test_the_calibrated_estimate_of_the_measured_plan_meets_the_measurement(api: Api) -> None:
    """The utilisation that replaces the prior is the one at which the estimate reproduces the measured rate,
    its element-wise, adapter and floor terms charged as every estimate charges them; the measured hardware
    FLOPs utilisation would charge them twice and predict less than was measured."""
    rate = _t4_estimate_of(api, LLAMA_LORA)["tokens_per_s_per_gpu"] * 0.9  # within the band: one result suffices
    bench = _measured(api, LLAMA_LORA, rate)
    assert bench["notes"] == [] and 0 < bench["gemm_utilisation"] < 1 and bench["used"] is True
    after = _t4_estimate_of(api, LLAMA_LORA)
    assert after["utilisation_assumed"] == bench["gemm_utilisation"]
    assert after["tokens_per_s_per_gpu"] == pytest.approx(rate, rel=1e-3)
    assert bench["gemm_utilisation"] > bench["hardware_utilisation"]
    # A rate no utilisation reaches (the estimate's host floor alone is slower) calibrates at 1 and says so;
    # it is stored, not used (issue 25).
    fast = _measured(api, {**TINY_PLAN, "seq_len": 32}, 5e7)
    assert fast["gemm_utilisation"] == 1.0
    assert any("above what the estimate gives" in n for n in fast["notes"]), fast["notes"]
    assert fast["used"] is False and fast["unused_reason"].startswith("implausible: no GEMM utilisation")


def test_results_stored_before_the_calibrated_column_count_with_their_hardware_utilisation(api: Api) -> None:
    from sqlalchemy import create_engine, update

    from services.nodes.tables import BenchmarkRow

    rate = _t4_estimate_of(api, LLAMA_LORA)["tokens_per_s_per_gpu"] * 0.9
    # Two agreeing results: the hardware utilisation they fall back on may lie outside the band of one.
    bench, again = _measured(api, LLAMA_LORA, rate), _measured(api, LLAMA_LORA, rate)
    engine = create_engine(api.url)
    try:
        with engine.begin() as connection:  # as migration 0014 leaves a row measured before it
            ids = (bench["id"], again["id"])
            connection.execute(update(BenchmarkRow).where(BenchmarkRow.id.in_(ids)).values(gemm_utilisation=None))
    finally:
        engine.dispose()
    after = _t4_estimate_of(api, LLAMA_LORA)
    assert after["utilisation_source"].startswith("calibrated")
    assert after["utilisation_assumed"] == pytest.approx(bench["hardware_utilisation"])


def test_a_multi_gpu_plan_is_compared_per_gpu_not_divided_by_its_gpu_count(api: Api) -> None:
    one = _measured(api, TINY_PLAN, 5000.0)
    four = _measured(api, {**TINY_PLAN, "gpus": 4, "sharding": "fsdp"}, 5000.0)
    # The same one-GPU measurement means the same utilisation, whatever GPU count the plan has...
    assert four["hardware_utilisation"] == pytest.approx(one["hardware_utilisation"])
    assert four["gemm_utilisation"] == pytest.approx(one["gemm_utilisation"])
    assert four["mfu"] == pytest.approx(one["mfu"]) and four["measured_gpus"] == 1
    # ...and it is compared with the one-GPU prediction, not the plan's four-GPU total.
    assert four["predicted_tokens_per_s"] == pytest.approx(one["predicted_tokens_per_s"])


def test_calibration_of_a_padded_plan_is_compared_on_full_rows(api: Api) -> None:
    """The agent times synthetic rows of exactly seq_len: a plan whose data set pads its batches to the
    longest sample is compared with the prediction for full rows, not for its shorter padded ones."""
    full_rows = _measured(api, TINY_PLAN, 5000.0)
    padded = {**TINY_PLAN, "padding": "longest"}
    padded["dataset"] = {"examples": 10_000, "avg_tokens": 16}
    short_rows = _measured(api, padded, 5000.0)
    assert short_rows["hardware_utilisation"] == pytest.approx(full_rows["hardware_utilisation"], rel=0.05)
    assert short_rows["predicted_tokens_per_s"] == pytest.approx(full_rows["predicted_tokens_per_s"], rel=0.05)
