"""Calibration that cannot poison (issue 25): a mislabelled node, an implausible result or a single result
cannot move an organization's estimates further than the rule allows (services/nodes/calibration.py)."""

from __future__ import annotations

from typing import Any

import pytest

from services.agent.agent import Agent
from services.catalog.gpus import find_gpu
from services.nodes.calibration import limits, plausible_range
from tests.api.conftest import Api
from tests.conftest import require_trace_extra
from tests.nodes.helpers import TINY_PLAN

A100 = "A100 80GB"
A100_NVML = "NVIDIA A100-SXM4-80GB"  # what NVML and torch.cuda.get_device_name call an A100 SXM 80GB
LLAMA_LORA: dict[str, Any] = {
    "model": {"name": "meta-llama/Llama-3.1-8B"},
    "method": "lora",
    "lora": {"rank": 16},
    "micro_batch_size": 4,
    "seq_len": 2048,
    "gradient_checkpointing": True,
    "padding": "packed",  # as the agent measures it (rows of exactly seq_len)
    "dataset": {"tokens": 50_000_000},
    "epochs": 1,
    "constraints": {"providers": ["cloudrux"], "max_gpus": 1},  # one of each of its nine cards, A100 80GB too
}


def _estimate(api: Api, plan: dict[str, Any], gpu: str = A100) -> dict[str, Any]:
    body = {k: v for k, v in plan.items() if k not in ("dataset", "epochs", "constraints")}
    response = api.client.post(f"/v1/estimate?gpu={gpu}", json=body, headers=api.headers())
    assert response.status_code == 200, response.text
    throughput: dict[str, Any] = response.json()["throughput"]
    return throughput


def _a100_recommendations(api: Api, plan: dict[str, Any]) -> list[dict[str, Any]]:
    plan_id = api.client.post("/v1/plans", json=plan, headers=api.headers()).json()["id"]
    done = api.wait_for_plan(plan_id)
    assert done["status"] == "done", done.get("error")
    recs = [r for r in done["recommendations"] if r["gpu"] == A100]
    assert recs, "the planner should consider A100s for an 8B LoRA"
    return recs


def _node(api: Api, *, gpu: str = A100, nvml_gpu: str = A100_NVML, gpu_count: int = 1) -> dict[str, Any]:
    body = {"name": "n", "gpu": gpu, "gpu_count": gpu_count, "nvml_gpu": nvml_gpu}
    response = api.client.post("/v1/nodes", json=body, headers=api.headers())
    assert response.status_code == 201, response.text
    return dict(response.json())


def _submit(
    api: Api, node: dict[str, Any], plan: dict[str, Any], tokens_per_s: float, device: str = A100_NVML
) -> dict[str, Any]:
    """Store ``plan``, queue its calibration on ``node`` and report ``tokens_per_s`` as the node's agent."""
    headers = api.headers()
    plan_id = api.client.post("/v1/plans", json=plan, headers=headers).json()["id"]
    assert api.wait_for_plan(plan_id)["status"] == "done"
    agent_headers = {**headers, "X-Node-Token": node["node_token"]}
    job = {"plan_id": plan_id, "warmup_steps": 1, "timed_steps": 1}
    assert api.client.post(f"/v1/nodes/{node['id']}/calibrations", headers=headers, json=job).status_code == 202
    claimed = api.client.post(f"/v1/nodes/{node['id']}/calibrations/next", headers=agent_headers, json={}).json()
    result = {"tokens_per_s": tokens_per_s, "seconds": 1.0, "gpus": 1, "device": device}
    answer = api.client.post(f"/v1/calibrations/{claimed['id']}/result", headers=agent_headers, json=result)
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def _listed(api: Api, bench_id: str) -> dict[str, Any]:
    items = api.client.get("/v1/benchmarks", headers=api.headers()).json()["items"]
    return dict(next(b for b in items if b["id"] == bench_id))


def test_a_cpu_host_registered_as_an_a100_leaves_the_a100_estimates_unchanged(api: Api) -> None:
    """The issue's node: an agent on a CPU host started with --gpu "A100 80GB" (NVML sees nothing) really
    calibrates, and neither /v1/estimate on an A100 nor a plan's A100 recommendations move."""
    require_trace_extra()
    before = _estimate(api, LLAMA_LORA)
    before_tiny = _estimate(api, TINY_PLAN)
    before_recs = _a100_recommendations(api, LLAMA_LORA)
    agent = Agent(api.client, api.keys["alpha"])
    node_id = agent.register(name="cpu-host", gpu=A100)
    node = api.client.get(f"/v1/nodes/{node_id}", headers=api.headers()).json()
    assert node["gpu"] == A100 and node["gpu_count"] == 0 and node["gpu_nvml"] == ""
    plan_id = api.client.post("/v1/plans", json=TINY_PLAN, headers=api.headers()).json()["id"]
    assert api.wait_for_plan(plan_id)["status"] == "done"
    job = {"plan_id": plan_id, "warmup_steps": 1, "timed_steps": 2}
    assert api.client.post(f"/v1/nodes/{node_id}/calibrations", headers=api.headers(), json=job).status_code == 202
    assert agent.poll_once() is True
    [bench] = api.client.get(f"/v1/benchmarks?gpu={A100}", headers=api.headers()).json()["items"]
    assert bench["device"] == "cpu" and bench["gpu_count"] == 0 and bench["tokens_per_s"] > 0
    assert bench["used"] is False and bench["verified"] is False
    assert "CPU measurement never calibrates a GPU" in bench["unused_reason"]
    assert _estimate(api, LLAMA_LORA) == before
    assert _estimate(api, TINY_PLAN) == before_tiny  # nor the very plan it measured
    assert _a100_recommendations(api, LLAMA_LORA) == before_recs


def test_a_cpu_result_never_calibrates_a_gpu_whatever_the_node_claims(api: Api) -> None:
    """The issue's numbers without torch: 30.1 tokens/s measured on ``cpu`` by a node that claims an A100
    (even one whose registration names an NVML A100), stored and never used."""
    before = _estimate(api, LLAMA_LORA)
    before_recs = _a100_recommendations(api, LLAMA_LORA)
    claimed = _submit(api, _node(api, nvml_gpu="", gpu_count=0), LLAMA_LORA, 30.1, device="cpu")
    lying = _submit(api, _node(api), LLAMA_LORA, 30.1, device="cpu")
    for bench in (claimed, lying):
        assert bench["used"] is False and "CPU measurement never calibrates a GPU" in bench["unused_reason"]
        # What poisoned the organization before: a utilisation far below any real A100 run's.
        assert bench["gemm_utilisation"] < plausible_range(find_gpu(A100))[0] / 5
    assert _estimate(api, LLAMA_LORA) == before
    assert _a100_recommendations(api, LLAMA_LORA) == before_recs


def test_a_gpu_named_only_by_flag_or_another_device_is_stored_unused(api: Api) -> None:
    rate = _estimate(api, LLAMA_LORA)["tokens_per_s_per_gpu"] * 0.9
    unverified = _submit(api, _node(api, nvml_gpu="", gpu_count=1), LLAMA_LORA, rate)
    assert unverified["used"] is False and unverified["verified"] is False
    assert unverified["unused_reason"].startswith("unverified: NVML did not report")
    elsewhere = _submit(api, _node(api), LLAMA_LORA, rate, device="NVIDIA H100 80GB HBM3")
    assert elsewhere["used"] is False and "not the node's GPU A100 80GB" in elsewhere["unused_reason"]
    assert _estimate(api, LLAMA_LORA)["utilisation_source"].startswith("prior")
    # Where NVML tells, a hand-named GPU that disagrees is refused at registration.
    body = {"name": "n", "gpu": "H100 SXM", "nvml_gpu": A100_NVML}
    refused = api.client.post("/v1/nodes", json=body, headers=api.headers())
    assert refused.status_code == 422 and refused.json()["field"] == "gpu"


def test_an_implausible_result_is_stored_not_used_and_says_why(api: Api) -> None:
    before = _estimate(api, LLAMA_LORA)
    node = _node(api)
    slow = _submit(api, node, LLAMA_LORA, before["tokens_per_s_per_gpu"] * 0.02)
    assert slow["verified"] is True and slow["used"] is False
    assert slow["unused_reason"].startswith("implausible: GEMM utilisation")
    assert "axolotl-6" in slow["unused_reason"] and "mamf-finder" in slow["unused_reason"]
    assert _listed(api, slow["id"])["unused_reason"] == slow["unused_reason"]
    fast = _submit(api, node, LLAMA_LORA, before["tokens_per_s_per_gpu"] * 50)
    assert fast["used"] is False and fast["unused_reason"].startswith("implausible")
    assert _estimate(api, LLAMA_LORA) == before


def test_one_result_moves_the_estimate_at_most_by_the_band_a_second_agreeing_one_fully(api: Api) -> None:
    before = _estimate(api, LLAMA_LORA)
    band = limits()
    measured = before["tokens_per_s_per_gpu"] * 0.4  # plausible, but below the band's p10 of the prior
    first = _submit(api, _node(api), LLAMA_LORA, measured)
    assert first["used"] is True and first["verified"] is True, first["unused_reason"]
    held = _estimate(api, LLAMA_LORA)
    assert "held to the 80% tokens/s band" in held["utilisation_source"]
    ratio = held["tokens_per_s_per_gpu"] / before["tokens_per_s_per_gpu"]
    assert band.band_low_ratio - 1e-9 <= ratio < 1  # moved, by at most the band
    assert held["utilisation_assumed"] == pytest.approx(before["utilisation_assumed"] * band.band_low_ratio)
    second = _submit(api, _node(api), LLAMA_LORA, measured * 1.05)  # another node agrees
    assert second["used"] is True
    moved = _estimate(api, LLAMA_LORA)
    assert moved["utilisation_source"] == f"calibrated on 2 lora run(s) on {A100}"
    assert moved["tokens_per_s_per_gpu"] == pytest.approx(measured * 1.025, rel=0.01)


def test_a_result_far_from_the_organizations_others_is_left_out(api: Api) -> None:
    rate = _estimate(api, LLAMA_LORA)["tokens_per_s_per_gpu"]
    node = _node(api)
    for _ in range(2):
        assert _submit(api, node, LLAMA_LORA, rate * 0.9)["used"] is True
    far = _submit(api, node, LLAMA_LORA, rate * 0.3)
    assert far["used"] is False and far["unused_reason"].startswith("far from the organization's other results")
    assert _estimate(api, LLAMA_LORA)["tokens_per_s_per_gpu"] == pytest.approx(rate * 0.9, rel=0.01)
