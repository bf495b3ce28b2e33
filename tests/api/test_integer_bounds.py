"""No 500 from a number (issue 21 item 5): every integer of every request body has bounds that fit where
it is stored, and integers are strict (``"seq_len": true`` is refused, naming the field).

The integer fields are found generically, from the request bodies of the OpenAPI schema (the pydantic
models' own JSON schema), so a field added later is driven too. Each is sent at its maximum (stored:
no 500), one past it, one under its minimum and as ``true`` (each a 422 naming the field), on SQLite
and PostgreSQL (where an INTEGER column holds at most 2^31 - 1).
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from services.core.json_limits import INT32_MAX, MAX_SAFE_INTEGER
from tests.api.conftest import QLORA_PLAN, Api

BUCKET = "gpuplan-runs"
# Request integers that may pass 2^31 - 1, with where each is kept: a BigInteger column, or only inside a
# JSON column (plan bodies) and the estimator's arithmetic.
WIDE = {
    ("datasets-create", "size_bytes"): "datasets.size_bytes is BigInteger",
    ("runs-checkpoint-durable", "manifest.files[].size"): "summed into run_checkpoints.size_bytes, BigInteger",
    ("runs-checkpoint-durable", "manifest.beside[].size"): "kept in the manifest's JSON",
    ("nodes-heartbeat", "sync.pending_bytes"): "nodes.sync_pending_bytes is BigInteger",
    ("keys-create", "expires_in_s"): "turned into a timestamp",
    **{
        (op, field): "kept in the plan's JSON body"
        for op in ("plans-estimate", "plans-create")
        for field in (
            "model.generic.parameters",
            "model.generic.activation_bytes_per_sample",
            "data.tokens",
            "data.examples",
            "dataset.examples",
            "dataset.tokens",
        )
    },
}


def _resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = schema["components"]["schemas"][node["$ref"].rsplit("/", 1)[1]]
    return node


def typed_fields(
    schema: dict[str, Any], node: dict[str, Any], kind: str, path: str = ""
) -> Iterator[tuple[str, dict[str, Any]]]:
    """(dotted path, JSON schema) of every field of JSON type ``kind`` reachable in a request body schema; list
    items as ``[]``."""
    node = _resolve(schema, node)
    if node.get("type") == kind:
        yield path, node
    for key in ("anyOf", "oneOf", "allOf"):
        for option in node.get(key, ()):
            yield from typed_fields(schema, option, kind, path)
    for name, child in node.get("properties", {}).items():
        yield from typed_fields(schema, child, kind, f"{path}.{name}" if path else name)
    if "items" in node:
        yield from typed_fields(schema, node["items"], kind, path + "[]")


def request_fields(openapi: dict[str, Any], kind: str = "integer") -> list[tuple[str, str, str, str, dict[str, Any]]]:
    """(operation id, method, path template, field, its schema) for every request body field of JSON type ``kind``."""
    found = []
    for template, operations in openapi["paths"].items():
        for method, operation in operations.items():
            body = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
            if body is None:
                continue
            seen = set()
            for field, field_schema in typed_fields(openapi, body, kind):
                if field not in seen:
                    seen.add(field)
                    found.append((operation["operationId"], method, template, field, field_schema))
    return found


def _bounds(field_schema: dict[str, Any]) -> tuple[int | None, int | None]:
    low = field_schema.get("minimum")
    if "exclusiveMinimum" in field_schema:
        low = field_schema["exclusiveMinimum"] + 1
    high = field_schema.get("maximum")
    if "exclusiveMaximum" in field_schema:
        high = field_schema["exclusiveMaximum"] - 1
    return (None if low is None else int(low)), (None if high is None else int(high))


def test_every_request_integer_has_bounds_that_fit_its_column(api: Api) -> None:
    fields = request_fields(api.client.get("/openapi.json").json())
    assert len(fields) >= 40, "the walk found too few integer fields"
    problems = []
    for op, _method, _template, field, field_schema in fields:
        low, high = _bounds(field_schema)
        if low is None or high is None:
            problems.append(f"{op} {field}: unbounded ({field_schema})")
        elif high > (MAX_SAFE_INTEGER if (op, field) in WIDE else INT32_MAX):
            problems.append(f"{op} {field}: maximum {high} does not fit a 32-bit INTEGER column")
    assert not problems, "\n".join(problems)


def _manifest(run_id: str, step: int) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "step": step,
        "dir_name": f"checkpoint-{step}",
        "files": [{"path": "adapter_model.safetensors", "size": 1000, "sha256": "a" * 64}],
        "created_at": datetime.now(UTC).isoformat(),
    }


class World:
    """The resources the routes act on, and a valid body for each operation with integers."""

    def __init__(self, api: Api) -> None:
        self.api = api
        headers = api.headers("admin")
        plan = api.client.post("/v1/plans", json=QLORA_PLAN, headers=headers).json()
        assert api.wait_for_plan(plan["id"], org="admin")["status"] == "done"
        self.plan_id = plan["id"]
        node = api.client.post("/v1/nodes", json={"name": "n1", "gpu": "A100 80GB"}, headers=headers).json()
        self.node_id, self.token = node["id"], node["node_token"]
        run = api.client.post(
            f"/v1/plans/{self.plan_id}/runs",
            json={"node_ids": [self.node_id], "checkpoint_dir": "/data/out", "bucket": BUCKET},
            headers=headers,
        )
        assert run.status_code == 201, run.text
        self.run_id = run.json()["id"]
        self.steps = itertools.count(100)
        self.key_id = api.client.post("/v1/keys", json={"name": "spare"}, headers=headers).json()["id"]

    def calibration_id(self) -> str:
        """A calibration claimed by the node (each result or failure finishes one)."""
        headers = self.agent()
        job = {"plan_id": self.plan_id}
        created = self.api.client.post(f"/v1/nodes/{self.node_id}/calibrations", json=job, headers=headers)
        assert created.status_code == 202, created.text
        claimed = self.api.client.post(f"/v1/nodes/{self.node_id}/calibrations/next", json={}, headers=headers)
        assert claimed.status_code == 200, claimed.text
        return str(claimed.json()["id"])

    def agent(self) -> dict[str, str]:
        return {**self.api.headers("admin"), "X-Node-Token": self.token}

    def base(self, op: str) -> dict[str, Any]:
        bodies: dict[str, dict[str, Any]] = {
            "plans-estimate": {**QLORA_PLAN, "lora": {"rank": 16, "alpha": 32}, "constraints": {"max_gpus": 8}},
            "plans-create": {**QLORA_PLAN, "lora": {"rank": 16, "alpha": 32}, "constraints": {"max_gpus": 8}},
            "quotes-create": {"gpu": "A100 80GB", "gpus": 1},
            "nodes-register": {"name": "n2", "gpu": "A100 80GB", "gpu_count": 1, "agent_pid": 1234},
            "nodes-heartbeat": {
                "gpus": [{"index": 0, "utilisation_pct": 50, "memory_used_gib": 1, "memory_total_gib": 80}],
                "unsynced_checkpoints": 0,
                "progress": {"run_id": self.run_id, "step": 1},
                "agent_pid": 1234,
            },
            "nodes-calibrate": {"plan_id": self.plan_id, "warmup_steps": 1, "timed_steps": 2},
            "calibrations-result": {"tokens_per_s": 1000.0, "seconds": 10.0, "gpus": 1},
            "runs-create": {
                "node_ids": [self.node_id],
                "checkpoint_dir": "/data/out",
                "bucket": BUCKET,
                "retention": {"keep_last": 2},
            },
            "runs-checkpoint-durable": {"manifest": _manifest(self.run_id, next(self.steps))},
            "datasets-create": {"name": "train.jsonl", "size_bytes": 1000},
            "keys-create": {"name": "k", "expires_in_s": 3600},
            "keys-rotate": {"grace_s": 0},
        }
        return copy.deepcopy(bodies.get(op, {}))

    def url(self, template: str) -> str:
        return template.format(plan_id=self.plan_id, node_id=self.node_id, run_id=self.run_id, key_id=self.key_id)


# Fields valid only together: each is set with its siblings, and the estimator's `data` replaces the
# API's `dataset` (a plan gives one).
_PERCENTILES = ("p50", "p90", "p99", "max")
_TOGETHER = {
    **{f"data.{p}_tokens_per_example": [f"data.{q}_tokens_per_example" for q in _PERCENTILES] for p in _PERCENTILES},
    **{f"dataset.{p}_tokens": [f"dataset.{q}_tokens" for q in _PERCENTILES] for p in _PERCENTILES},
}


def _with_value(body: dict[str, Any], field: str, value: Any) -> dict[str, Any]:
    if field.startswith("data."):
        body.pop("dataset", None)
        body["data"] = {"tokens": 10**6}
    if field.startswith("model.generic."):
        body["model"] = {"generic": {"parameters": 8 * 10**9}}
    for other in _TOGETHER.get(field, []):
        _set(body, other, value if isinstance(value, int) and value > 0 else 1000)
    _set(body, field, value)
    return body


def _set(body: dict[str, Any], field: str, value: Any) -> None:
    """Set a dotted path (``[]``: the first item of a list, made when missing) in a request body."""
    parts = field.split(".")
    target: Any = body
    for i, part in enumerate(parts):
        listed = part.endswith("[]")
        name = part.removesuffix("[]")
        last = i == len(parts) - 1
        if listed:
            items = target.setdefault(name, [{}])
            if not items:
                items.append({})
            if last:
                items[0] = value
            target = items[0]
        elif last:
            target[name] = value
        else:
            child = target.get(name)
            if not isinstance(child, dict):
                child = target[name] = {}
            target = child


@pytest.fixture
def world(api: Api) -> World:
    return World(api)


def test_every_request_integer_at_its_bound_and_past_it(api: Api, world: World) -> None:
    fields = request_fields(api.client.get("/openapi.json").json())
    problems = []
    # Each base body is valid, so a value at its bound reaches the handler and the database.
    for op, method, template in sorted({(op, method, template) for op, method, template, _f, _s in fields}):
        url = world.url(template.replace("{calibration_id}", world.calibration_id()))
        answer = api.client.request(method.upper(), url, json=world.base(op), headers=world.agent())
        assert answer.status_code < 400 or answer.status_code == 503, f"{op}: {answer.status_code} {answer.text}"
        if op == "keys-rotate":
            world.key_id = answer.json()["id"]
    for op, method, template, field, field_schema in fields:
        low, high = _bounds(field_schema)
        assert low is not None and high is not None, f"{op} {field} is unbounded"
        named = field.replace("[]", ".0")
        for at_bound, value in ((True, high), (False, high + 1), (False, low - 1), (False, True)):
            body = _with_value(world.base(op), field, value)
            if "{calibration_id}" in template:
                template = template.replace("{calibration_id}", world.calibration_id())
            answer = api.client.request(method.upper(), world.url(template), json=body, headers=world.agent())
            if op == "keys-rotate" and answer.status_code == 201:
                world.key_id = answer.json()["id"]
            if at_bound:
                if answer.status_code >= 500 and not (answer.status_code == 503 and op == "datasets-create"):
                    problems.append(f"{op} {field}={value}: {answer.status_code} {answer.text[:200]}")
                continue
            text = answer.json().get("message", "") + " ".join(answer.json().get("details") or [])
            if answer.status_code != 422 or named not in text:
                problems.append(f"{op} {field}={value!r}: {answer.status_code} {answer.text[:200]}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("route", ["/v1/estimate", "/v1/plans"])
def test_a_boolean_is_not_an_integer(api: Api, route: str) -> None:
    answer = api.client.post(route, json={**QLORA_PLAN, "seq_len": True}, headers=api.headers())
    assert answer.status_code == 422
    assert answer.json()["message"].startswith("seq_len: input should be a valid integer")


def test_progress_and_checkpoint_steps_at_the_column_maximum_are_stored(api: Api, world: World) -> None:
    """The two integers issue 21 saw overflow on PostgreSQL (a 500 "integer out of range")."""
    beat = world.base("nodes-heartbeat")
    beat["progress"]["step"] = INT32_MAX
    answer = api.client.post(f"/v1/nodes/{world.node_id}/heartbeat", json=beat, headers=world.agent())
    assert answer.status_code == 200, answer.text
    report = {"manifest": _manifest(world.run_id, INT32_MAX)}
    answer = api.client.post(f"/v1/runs/{world.run_id}/checkpoints", json=report, headers=world.agent())
    assert answer.status_code == 200, answer.text
    run = api.client.get(f"/v1/runs/{world.run_id}", headers=world.agent()).json()
    assert run["last_durable_step"] == INT32_MAX and run["progress_step"] == INT32_MAX
    past = {"manifest": _manifest(world.run_id, INT32_MAX + 1)}
    answer = api.client.post(f"/v1/runs/{world.run_id}/checkpoints", json=past, headers=world.agent())
    assert answer.status_code == 422 and answer.json()["message"].startswith("manifest.step:")
