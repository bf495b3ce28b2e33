"""Nothing heavy on the event loop (issue 21 item 1: one 50 KB `POST /v1/estimate` with 10,000 LoRA
targets kept `/healthz` waiting 26.6 s).

A real `gpuplan serve` on loopback (its own process, so the test's own work is not measured) gets, on
each route that parses, validates or computes, the largest body it accepts shaped to be slow, sent again
and again from two threads; meanwhile `/healthz` is probed every 50 ms. The median probe must stay under
100 ms and under the idle median plus 100 ms (the idle median measures the shared machine's own load,
so a busy machine does not fail the test; a blocked loop would add seconds, not milliseconds).
"""

from __future__ import annotations

import json
import re
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.core.json_limits import MAX_ITEMS
from services.estimator.validation import MAX_LISTED_ERRORS
from tests.api.conftest import QLORA_PLAN
from tests.api.served import Served, serve

MAX_BODY_BYTES = 2**20  # GPUPLAN_MAX_REQUEST_BYTES
PROBE_EVERY_S = 0.05
LOAD_S = 2.0
LIMIT_MS = 100.0


def _targets() -> bytes:
    """10-character LoRA targets, as many as one JSON array may hold (the issue's probe, 65x larger)."""
    plan = {**QLORA_PLAN, "lora": {"rank": 16, "targets": ["x" * 10] * (MAX_ITEMS - 1)}}
    return json.dumps(plan).encode()


def _unknown_fields() -> bytes:
    """A plan with as many unknown fields as one object may hold: one validation error each."""
    plan: dict[str, Any] = dict(QLORA_PLAN)
    plan.update({f"f{i:05d}": 0 for i in range(MAX_ITEMS - len(plan))})
    return json.dumps(plan).encode()


def _wide_config() -> bytes:
    """A pasted config.json of as many keys as an object may hold, each checked by the config reader."""
    config: dict[str, Any] = {"model_type": "llama"}
    config.update({f"k{i:05d}": 0 for i in range(MAX_ITEMS - 1)})
    plan = {**QLORA_PLAN, "model": {"config": config}}
    return json.dumps(plan).encode()


def _price_list(valid: bool) -> bytes:
    """10,000 rows (the import's limit): all stored, or each refused with its own message."""
    price = "3.5" if valid else "-1"
    rows = [f"loadco,H100,{price},r{i:05d}" for i in range(10_000)]
    return ("provider,gpu,on_demand_usd_per_hour,region\n" + "\n".join(rows) + "\n").encode()


JSON = {"Content-Type": "application/json"}
CSV = {"Content-Type": "text/csv"}
PROBES: dict[str, tuple[str, str, Callable[[], bytes], dict[str, str]]] = {
    "estimate-targets": ("POST", "/v1/estimate", _targets, JSON),
    "estimate-unknown-fields": ("POST", "/v1/estimate", _unknown_fields, JSON),
    "estimate-wide-config": ("POST", "/v1/estimate", _wide_config, JSON),
    "plan-targets": ("POST", "/v1/plans", _targets, JSON),
    "plan-unknown-fields": ("POST", "/v1/plans", _unknown_fields, JSON),
    "plan-wide-config": ("POST", "/v1/plans", _wide_config, JSON),
    "price-list-import": ("POST", "/v1/admin/catalog/offers", lambda: _price_list(True), CSV),
    "price-list-refused": ("POST", "/v1/admin/catalog/offers", lambda: _price_list(False), CSV),
    "dataset-unknown-fields": ("POST", "/v1/datasets", _unknown_fields, JSON),
}


def _probe(base: str, seconds: float) -> list[float]:
    """/healthz latencies (ms), one probe every PROBE_EVERY_S for ``seconds``."""
    latencies = []
    end = time.monotonic() + seconds
    with httpx.Client(base_url=base, timeout=60) as client:
        while time.monotonic() < end:
            start = time.perf_counter()
            assert client.get("/healthz").status_code == 200
            latencies.append((time.perf_counter() - start) * 1000)
            time.sleep(PROBE_EVERY_S)
    return latencies


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp_path: Path = tmp_path_factory.mktemp("event-loop")
    # Quotas and rate limits off: the load sends many requests.
    settings = {"rate_limit_per_minute": "0", "quota_plans_per_hour": "0", "quota_datasets": "0"}
    with serve(f"sqlite:///{tmp_path / 'gpuplan.db'}", tmp_path, settings) as server:
        yield server


@pytest.fixture(scope="module")
def idle_median_ms(served: Served) -> float:
    return statistics.median(_probe(served.base, 1.0))


def _under_load(
    served: Served, method: str, path: str, body: bytes, content_type: dict[str, str], seconds: float
) -> tuple[list[float], list[int], list[float]]:
    """/healthz latencies (ms) while two threads send ``body`` again and again; their statuses and
    request durations (s)."""
    statuses: list[int] = []
    durations: list[float] = []
    stop = threading.Event()

    def load() -> None:
        with httpx.Client(base_url=served.base, timeout=120) as client:
            while not stop.is_set():
                start = time.perf_counter()
                answer = client.request(method, path, content=body, headers={**served.headers, **content_type})
                durations.append(time.perf_counter() - start)
                statuses.append(answer.status_code)
                if answer.status_code == 422 and "details" in answer.json():
                    assert len(answer.json()["details"]) <= MAX_LISTED_ERRORS + 1

    senders = [threading.Thread(target=load) for _ in range(2)]
    for sender in senders:
        sender.start()
    try:
        time.sleep(0.2)  # the first bodies are in flight
        latencies = _probe(served.base, seconds)
    finally:
        stop.set()
        for sender in senders:
            sender.join(timeout=120)
    return latencies, statuses, durations


@pytest.mark.parametrize("probe", list(PROBES))
def test_healthz_answers_while_a_slow_body_is_handled(served: Served, idle_median_ms: float, probe: str) -> None:
    method, path, make, content_type = PROBES[probe]
    body = make()
    assert len(body) <= MAX_BODY_BYTES or path.endswith("/offers"), len(body)
    latencies, statuses, durations = _under_load(served, method, path, body, content_type, LOAD_S)
    median = statistics.median(latencies)
    print(
        f"{probe}: {len(body):,} bytes, {len(durations)} requests of {statistics.median(durations) * 1000:.0f} ms "
        f"(statuses {sorted(set(statuses))}); /healthz median {median:.1f} ms, longest {max(latencies):.1f} ms "
        f"over {len(latencies)} probes (idle median {idle_median_ms:.1f} ms)"
    )
    assert statuses and all(status < 500 for status in statuses), statuses
    assert median < LIMIT_MS and median < idle_median_ms + LIMIT_MS, (median, latencies)


def test_healthz_answers_while_any_json_route_gets_the_largest_object(served: Served, idle_median_ms: float) -> None:
    """Every route with a JSON body (from the OpenAPI schema), sent an object of as many unknown fields
    as one may hold (ids in the path made up: the body is validated before the handler looks)."""
    body = json.dumps({f"f{i:05d}": 0 for i in range(MAX_ITEMS)}).encode()
    openapi = httpx.get(f"{served.base}/openapi.json").json()
    routes = [
        (method.upper(), re.sub(r"\{[^}]+\}", "x", path))
        for path, operations in openapi["paths"].items()
        for method, operation in operations.items()
        if "application/json" in operation.get("requestBody", {}).get("content", {})
    ]
    assert len(routes) >= 15, routes
    failed = []
    for method, path in routes:
        latencies, statuses, _durations = _under_load(served, method, path, body, JSON, 1.0)
        median = statistics.median(latencies)
        print(
            f"{method} {path}: /healthz median {median:.1f} ms, longest {max(latencies):.1f} ms {sorted(set(statuses))}"
        )
        if not statuses or any(status >= 500 for status in statuses):
            failed.append(f"{method} {path}: statuses {sorted(set(statuses))}")
        if not (median < LIMIT_MS and median < idle_median_ms + LIMIT_MS):
            failed.append(f"{method} {path}: /healthz median {median:.1f} ms")
    assert not failed, failed
