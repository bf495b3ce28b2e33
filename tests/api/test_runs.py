"""Runs over the API (SQLite and PostgreSQL): schedule, durable checkpoints, progress, decisions log."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from services.core.db import make_engine, make_sessionmaker, unit_of_work
from services.nodes.drivers import NodeTarget
from services.nodes.lifecycle import sweep
from tests.api.conftest import QLORA_PLAN, Api
from tests.nodes.helpers import SLOW_AGENT

BUCKET = "gpuplan-runs"


class Recording:
    name = "recording"

    def __init__(self) -> None:
        self.stopped: list[str] = []

    def stop(self, node: NodeTarget) -> str:
        self.stopped.append(node.id)
        return "ok"

    def start(self, node: NodeTarget) -> str:
        return "ok"


def _plan_and_node(api: Api, plan: dict[str, Any] | None = None, gpu: str = "A100 80GB") -> tuple[str, str]:
    plan_id = api.client.post("/v1/plans", json=plan or QLORA_PLAN, headers=api.headers()).json()["id"]
    assert api.wait_for_plan(plan_id)["status"] == "done"
    node = api.client.post("/v1/nodes", json={"name": "n1", "gpu": gpu}, headers=api.headers()).json()
    NODE_TOKENS[node["id"]] = node["node_token"]
    return plan_id, node["id"]


NODE_TOKENS: dict[str, str] = {}


def _agent(api: Api, node_id: str) -> dict[str, str]:
    """The headers of the node's agent: the organization's key and the node's token."""
    return {**api.headers(), "X-Node-Token": NODE_TOKENS[node_id]}


def _run(api: Api, plan_id: str, node_id: str, **fields: Any) -> Any:
    body = {"node_ids": [node_id], "checkpoint_dir": "/data/out", "bucket": BUCKET, **fields}
    return api.client.post(f"/v1/plans/{plan_id}/runs", json=body, headers=api.headers())


def _manifest(run_id: str, step: int, sha: str = "a" * 64, metric: float | None = None) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "step": step,
        "dir_name": f"checkpoint-{step}",
        "files": [{"path": "adapter_model.safetensors", "size": 1000, "sha256": sha}],
        "metric": metric,
        "created_at": datetime.now(UTC).isoformat(),
    }


def test_a_run_gets_a_young_daly_schedule_shorter_on_spot(api: Api) -> None:
    plan_id, node_id = _plan_and_node(api)
    on_demand = _run(api, plan_id, node_id)
    assert on_demand.status_code == 201, on_demand.text
    run = on_demand.json()
    schedule = run["schedule"]
    assert run["prefix"] == f"runs/{run['id']}" and run["bucket"] == BUCKET
    assert "Young/Daly" in schedule["formula"] and schedule["capped"] is True
    assert schedule["interval_s"] == 3600 and schedule["interval_steps"] >= 1
    assert "adapter" in schedule["contents"] and schedule["checkpoint_bytes"] < 2e9
    assert "<step:010d>" in schedule["layout"] and "manifest.json last" in schedule["layout"]
    spot = _run(api, plan_id, node_id, spot=True, preemptions_per_node_hour=0.5, upload_mb_per_s=5).json()
    assert spot["schedule"]["interval_s"] < 3600 and not spot["schedule"]["capped"]
    assert spot["schedule"]["mtbf_hours"] == pytest.approx(2.0)


def test_full_fine_tuning_checkpoints_hold_weights_and_optimizer_states(api: Api) -> None:
    plan = {**QLORA_PLAN, "model": {"name": "Qwen/Qwen2.5-0.5B"}, "method": "full", "precision": "bf16-mixed"}
    plan.pop("lora")
    plan_id, node_id = _plan_and_node(api, plan)
    schedule = _run(api, plan_id, node_id).json()["schedule"]
    # 0.49 B parameters: bf16 weights + fp32 master + two fp32 Adam moments ~ 14 bytes per parameter.
    assert 5e9 < schedule["checkpoint_bytes"] < 8e9 and "optimizer" in schedule["contents"]


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"bucket": "Bad_Bucket"}, "bucket"),
        ({"prefix": "../escape"}, "prefix"),
        ({"node_ids": []}, "node_ids"),
        ({"retention": {"keep_last": 0}}, "retention.keep_last"),
        ({"idle_minutes": 0}, "idle_minutes"),
    ],
)
def test_bad_run_input_names_the_field(api: Api, fields: dict[str, Any], field: str) -> None:
    plan_id, node_id = _plan_and_node(api)
    response = _run(api, plan_id, node_id, **fields)
    assert response.status_code == 422
    assert field in response.text


def test_without_a_bucket_the_error_says_how_to_set_one(api: Api) -> None:
    plan_id, node_id = _plan_and_node(api)
    body = {"node_ids": [node_id], "checkpoint_dir": "/data/out"}
    response = api.client.post(f"/v1/plans/{plan_id}/runs", json=body, headers=api.headers())
    assert response.status_code == 422 and "GPUPLAN_S3_BUCKET" in response.text


def test_durable_checkpoints_progress_and_tenancy(api: Api) -> None:
    plan_id, node_id = _plan_and_node(api)
    run = _run(api, plan_id, node_id, retention={"keep_last": 1}).json()
    run_id = run["id"]
    url = f"/v1/runs/{run_id}/checkpoints"
    for step in (100, 200):
        answer = api.client.post(url, json={"manifest": _manifest(run_id, step)}, headers=api.headers())
        assert answer.status_code == 200, answer.text
    assert answer.json() == {"last_durable_step": 200, "delete_steps": [100]}
    # The same report again is harmless; other files at a durable step are a conflict.
    again = api.client.post(url, json={"manifest": _manifest(run_id, 200)}, headers=api.headers())
    assert again.status_code == 200
    other = api.client.post(url, json={"manifest": _manifest(run_id, 200, "b" * 64)}, headers=api.headers())
    assert other.status_code == 409
    wrong = api.client.post(url, json={"manifest": _manifest("someone-else", 300)}, headers=api.headers())
    assert wrong.status_code == 422 and "manifest.run_id" in wrong.text
    measured = api.client.post(
        url, json={"manifest": _manifest(run_id, 300), "upload_bytes_per_s": 5e6}, headers=api.headers()
    )
    assert measured.status_code == 200
    body = api.client.get(f"/v1/runs/{run_id}", headers=api.headers()).json()
    assert body["schedule"]["upload_measured"] is True and body["upload_bytes_per_s"] == 5e6
    assert body["schedule"]["idle"] == {"idle_minutes": 15.0, "gpu_busy_pct": 10.0}  # kept through the update
    # A report replayed (a retry whose answer was lost) measured no new upload: the average stays.
    slower = {"manifest": _manifest(run_id, 350), "upload_bytes_per_s": 1e6}
    assert api.client.post(url, json=slower, headers=api.headers()).status_code == 200
    assert api.client.get(f"/v1/runs/{run_id}", headers=api.headers()).json()["upload_bytes_per_s"] == 3e6
    assert api.client.post(url, json=slower, headers=api.headers()).status_code == 200
    assert api.client.get(f"/v1/runs/{run_id}", headers=api.headers()).json()["upload_bytes_per_s"] == 3e6
    assert [c["step"] for c in body["checkpoints"]] == [100, 200, 300]

    hb = {"progress": {"run_id": run_id, "step": 321, "loss": 1.25}, "job_running": True}
    assert api.client.post(f"/v1/nodes/{node_id}/heartbeat", json=hb, headers=_agent(api, node_id)).status_code == 200
    body = api.client.get(f"/v1/runs/{run_id}", headers=api.headers()).json()
    assert body["progress_step"] == 321 and body["progress_loss"] == 1.25
    assert "secret" not in str(body).lower()

    for path in (f"/v1/runs/{run_id}", f"/v1/nodes/{node_id}/events"):
        assert api.client.get(path, headers=api.headers("beta")).status_code == 404
    assert (
        api.client.post(url, json={"manifest": _manifest(run_id, 400)}, headers=api.headers("beta")).status_code == 404
    )
    _other_plan, other_node = _plan_and_node(api)
    response = api.client.post(
        f"/v1/nodes/{other_node}/heartbeat", json={"progress": {"run_id": run_id}}, headers=_agent(api, other_node)
    )
    assert response.status_code == 422 and "progress.run_id" in response.text
    unknown = {"progress": {"run_id": "no-such-run", "step": 1}}
    response = api.client.post(f"/v1/nodes/{other_node}/heartbeat", json=unknown, headers=_agent(api, other_node))
    assert response.status_code == 422 and response.json()["field"] == "progress.run_id", response.text


def test_the_sweep_decisions_are_visible_as_node_events(api: Api) -> None:
    plan_id, node_id = _plan_and_node(api)
    run_id = _run(api, plan_id, node_id, idle_minutes=5).json()["id"]
    busy = {"job_running": True, "progress": {"run_id": run_id, "step": 1}}
    api.client.post(f"/v1/nodes/{node_id}/heartbeat", json=busy, headers=_agent(api, node_id))
    factory = make_sessionmaker(make_engine(api.url))
    driver = Recording()
    now = datetime.now(UTC)
    with unit_of_work(factory) as session:
        sweep(session, now, driver, 3600)
    api.client.post(f"/v1/nodes/{node_id}/heartbeat", json={"unsynced_checkpoints": 1}, headers=_agent(api, node_id))
    with unit_of_work(factory) as session:
        sweep(session, now + timedelta(seconds=30), driver, 3600)
    answer = api.client.post(f"/v1/nodes/{node_id}/heartbeat", json=SLOW_AGENT, headers=_agent(api, node_id)).json()
    assert answer["commands"] == ["sync"]
    with unit_of_work(factory) as session:
        sweep(session, now + timedelta(minutes=1), driver, 3600)
        sweep(session, now + timedelta(minutes=7), driver, 3600)
    assert driver.stopped == [node_id]
    node = api.client.get(f"/v1/nodes/{node_id}", headers=api.headers()).json()
    assert node["status"] == "stopped" and node["run_id"] == run_id
    events = api.client.get(f"/v1/nodes/{node_id}/events", headers=api.headers()).json()["items"]
    kinds = [e["kind"] for e in reversed(events)]
    assert kinds == ["keep", "keep", "sync_requested", "keep", "stop"], kinds
    assert events[0]["reason"].startswith("idle") and events[0]["details"]["driver"] == "recording"
    assert all(e["run_id"] == run_id for e in events)
