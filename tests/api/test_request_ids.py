"""Every response carries a request id, and the access log line of that request names it."""

from __future__ import annotations

import logging

import pytest

from tests.api.conftest import QLORA_PLAN, Api


def test_every_response_carries_a_request_id_that_its_access_log_line_names(
    api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    client = api.client
    with caplog.at_level(logging.INFO, logger="gpuplan.access"):
        answers = [
            client.get("/healthz"),
            client.post("/v1/plans", json=QLORA_PLAN, headers=api.headers()),
            client.get("/v1/plans/" + "0" * 32, headers=api.headers()),  # 404
            client.post("/v1/estimate", json={"model": {}}, headers=api.headers()),  # 422
            client.get("/v1/plans", headers={"Authorization": "Bearer gp_wrong"}),  # 401
            client.post("/v1/plans", content=b"x" * (2 * 2**20), headers=api.headers()),  # 413 before routing
            client.get("/dashboard/login"),
            client.get("/no/such/route"),
        ]
    ids = [a.headers.get("x-request-id") for a in answers]
    assert [a.status_code for a in answers] == [200, 202, 404, 422, 401, 413, 200, 404]
    assert all(ids) and len(set(ids)) == len(ids)
    records = [r for r in caplog.records if r.name == "gpuplan.access"]
    lines = [r.getMessage() for r in records]
    for rid in ids:
        assert sum(f"request_id={rid}" in line for line in lines) == 1, rid
    # Every log record made while serving carries the id (for %(request_id)s in a formatter).
    assert {getattr(r, "request_id", None) for r in records} >= set(ids)


def test_a_callers_plain_request_id_is_kept_and_anything_else_replaced(api: Api) -> None:
    kept = api.client.get("/healthz", headers={"X-Request-ID": "trace-42.a:b"})
    assert kept.headers["x-request-id"] == "trace-42.a:b"
    for odd in ("<script>", "x" * 65, "two words"):
        answer = api.client.get("/healthz", headers={"X-Request-ID": odd})
        assert answer.headers["x-request-id"] != odd and len(answer.headers["x-request-id"]) == 32
