"""Abuse limits, metrics, access log and audit through the real app (SQLite and Postgres), and the
Redis-backed counters against the real Redis."""

from __future__ import annotations

import logging
import os
import re
import time
import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient

from services.api.app import create_app
from services.api.limits import InProcessCounters, check_rate, in_process_counters, redis_counters
from services.core.errors import TooManyRequests
from services.core.settings import Settings
from tests.api.conftest import QLORA_PLAN, Api
from tests.conftest import require_service

REDIS_URL = os.environ.get("GPUPLAN_TEST_REDIS_URL", "redis://127.0.0.1:6379/13")


def _app(api: Api, **settings: Any) -> TestClient:
    return TestClient(create_app(Settings(database_url=api.url, **settings)))


def test_a_key_over_its_rate_gets_429_with_retry_after_and_other_keys_do_not(api: Api) -> None:
    with _app(api, rate_limit_per_minute=5) as client:
        codes = [client.get("/v1/plans", headers=api.headers()).status_code for _ in range(5)]
        limited = client.get("/v1/plans", headers=api.headers())
        other = client.get("/v1/plans", headers=api.headers("beta"))
    assert codes == [200] * 5
    assert limited.status_code == 429 and limited.json()["error"] == "rate_limited"
    assert 1 <= int(limited.headers["Retry-After"]) <= 60
    assert other.status_code == 200  # the limit is per key


def test_org_quotas_plans_per_hour_nodes_and_data_set_bytes(api: Api) -> None:
    settings: dict[str, Any] = {"quota_plans_per_hour": 2, "quota_nodes": 1, "quota_dataset_bytes": 1000}
    with _app(api, **settings) as client:
        headers = api.headers()
        assert [client.post("/v1/plans", json=QLORA_PLAN, headers=headers).status_code for _ in range(2)] == [202] * 2
        third = client.post("/v1/plans", json=QLORA_PLAN, headers=headers)
        assert third.status_code == 429 and third.json()["field"] == "plans_per_hour"
        assert 3500 <= int(third.headers["Retry-After"]) <= 3600  # when the oldest plan leaves the hour
        assert client.post("/v1/plans", json=QLORA_PLAN, headers=api.headers("beta")).status_code == 202

        assert client.post("/v1/nodes", json={"name": "a", "gpu": "T4"}, headers=headers).status_code == 201
        second = client.post("/v1/nodes", json={"name": "b", "gpu": "T4"}, headers=headers)
        assert second.status_code == 429 and second.json()["field"] == "nodes" and "Retry-After" in second.headers

        big = client.post("/v1/datasets", json={"name": "d.jsonl", "size_bytes": 5000}, headers=headers)
        assert big.status_code == 429 and big.json()["field"] == "size_bytes"


def test_counters_in_process_and_in_redis_are_a_moving_window(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1_000_059.0]
    monkeypatch.setattr(time, "time", lambda: clock[0])  # the limits library reads time.time()
    local = in_process_counters()
    for _ in range(3):
        check_rate(local, "k1", 3)
    # A fixed minute would start afresh at :00; the moving window still holds the three hits of :59.
    clock[0] = 1_000_061.0
    with pytest.raises(TooManyRequests) as exc:
        check_rate(local, "k1", 3)
    assert 55 <= exc.value.retry_after_s <= 60
    clock[0] = 1_000_119.5  # the hits of :59 have left the window
    check_rate(local, "k1", 3)
    monkeypatch.undo()

    try:
        import redis

        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1).ping()
    except Exception:
        require_service("Redis", False, 'redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save ""')
    key = uuid.uuid4().hex
    first, second = redis_counters(REDIS_URL), redis_counters(REDIS_URL)  # two API processes
    check_rate(first, key, 2)
    check_rate(second, key, 2)
    with pytest.raises(TooManyRequests):
        check_rate(first, key, 2)
    # Redis down: the request is let through (and logged), not failed.
    check_rate(redis_counters("redis://127.0.0.1:9/0"), key, 1)
    check_rate(redis_counters("redis://127.0.0.1:9/0"), key, 1)


def test_in_process_counters_hold_a_high_limit_exactly_and_forget_idle_names(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1_000.0]
    monkeypatch.setattr(time, "time", lambda: clock[0])
    counters = in_process_counters()
    assert isinstance(counters, InProcessCounters)
    assert all(counters.hit("key:a", 5000) for _ in range(5000))
    assert not counters.hit("key:a", 5000) and not counters.allows("key:a", 5000)
    clock[0] += 30
    assert counters.retry_after_s("key:a", 5000) == 30  # when the hits of t=1000 leave the window
    clock[0] += 30.001
    assert counters.allows("key:a", 5000) and counters.hit("key:a", 5000)
    # Names not counted for a minute are dropped by the sweep.
    for i in range(InProcessCounters.SWEEP_EVERY):
        counters.hit(f"addr:{i}", 10)
    clock[0] += 61
    for _ in range(InProcessCounters.SWEEP_EVERY):
        counters.hit("key:b", 10_000_000)
    assert set(counters._events) == {"key:b"}


def _sample(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.rsplit(" ", 1)[0]))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_metrics_count_requests_by_route_and_status_and_show_task_leases(
    api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    client = api.client
    before = _sample(client.get("/metrics").text, "gpuplan_http_requests_total", route="/v1/plans/{plan_id}")
    with caplog.at_level(logging.INFO, logger="gpuplan.access"):
        plan_id = client.post("/v1/plans", json=QLORA_PLAN, headers=api.headers()).json()["id"]
        api.wait_for_plan(plan_id)
        assert client.get("/v1/plans/" + "0" * 32, headers=api.headers()).status_code == 404
    text = client.get("/metrics").text
    ok = _sample(text, "gpuplan_http_requests_total", method="GET", route="/v1/plans/{plan_id}", status="200")
    missing = _sample(text, "gpuplan_http_requests_total", method="GET", route="/v1/plans/{plan_id}", status="404")
    assert ok + missing >= before + 2 and missing >= 1
    assert _sample(text, "gpuplan_http_request_duration_seconds_count", method="POST", route="/v1/plans") >= 1
    assert _sample(text, "gpuplan_task_duration_seconds_count", task="gpuplan.plans.estimate", outcome="ok") >= 1
    assert 'gpuplan_task_leases{state="queued"}' in text
    assert "gpuplan_task_lease_expiries_total" in text and "gpuplan_sweep_decisions_total" in text
    lines = [r.getMessage() for r in caplog.records if r.name == "gpuplan.access"]
    assert any(" POST /v1/plans 202 " in line and f"key:{api.keys['alpha'][:10]}" in line for line in lines)
    assert all(api.keys["alpha"] not in line for line in lines)  # the key itself is never logged


def test_metrics_token_and_node_actions_in_the_audit_log(api: Api) -> None:
    with _app(api, metrics_token="m" * 8 + "0123456789abcdefghijklmnop") as client:
        assert client.get("/metrics").status_code == 401
        token = {"Authorization": "Bearer " + "m" * 8 + "0123456789abcdefghijklmnop"}
        assert client.get("/metrics", headers=token).status_code == 200
    node = api.client.post("/v1/nodes", json={"name": "audited", "gpu": "T4"}, headers=api.headers()).json()
    events = api.client.get("/v1/audit", headers=api.headers("admin")).json()["items"]
    registered = [e for e in events if e["action"] == "nodes.register"]
    assert registered and registered[0]["actor"] == f"key:{api.keys['alpha'][:10]}"
    assert registered[0]["remote_addr"] == "testclient" and registered[0]["detail"]["path"] == "/v1/nodes"
    beat = api.client.post(
        f"/v1/nodes/{node['id']}/heartbeat", json={}, headers={**api.headers(), "X-Node-Token": node["node_token"]}
    )
    assert beat.status_code == 200
    events = api.client.get("/v1/audit", headers=api.headers("admin")).json()["items"]
    assert not [e for e in events if "heartbeat" in e["action"]]  # routine agent calls stay out
    assert api.client.get("/v1/audit", headers=api.headers("beta")).status_code == 403
