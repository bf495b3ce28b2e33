"""Booleans are JSON true or false, the constraints' regions and providers are single lines, and an object gives each
key once (probes of the API, stop 61): "yes", "off", 1 or 0 for a boolean changed the estimate as if it were one, a
region holding a line break, a bidi override or nothing was stored and matched no offer, and of a key given twice the
last was used. Each is a 422 naming the field, and nothing is stored."""

from __future__ import annotations

from typing import Any

import pytest

from tests.api.conftest import QLORA_PLAN, Api


def _refused(answer: Any, field: str) -> None:
    assert answer.status_code == 422, answer.text
    assert answer.json()["message"].startswith(f"{field}:"), answer.text


@pytest.mark.parametrize("value", ["yes", "off", "true", 1, 0])
def test_a_plan_boolean_that_is_not_true_or_false_is_refused(api: Api, value: object) -> None:
    headers = api.headers()
    _refused(
        api.client.post("/v1/estimate", json={**QLORA_PLAN, "gradient_checkpointing": value}, headers=headers),
        "gradient_checkpointing",
    )
    before = api.client.get("/v1/plans", headers=headers).json()["items"]
    body = {**QLORA_PLAN, "constraints": {"spot_allowed": value}}
    _refused(api.client.post("/v1/plans", json=body, headers=headers), "constraints.spot_allowed")
    assert api.client.get("/v1/plans", headers=headers).json()["items"] == before
    for field in ("gradient_checkpointing", "cpu_offload"):
        assert api.client.post("/v1/estimate", json={**QLORA_PLAN, field: False}, headers=headers).status_code == 200


@pytest.mark.parametrize("place", ["us\n", "", "\u202eus", "x" * 101])
def test_a_region_or_provider_that_is_not_one_line_of_text_is_refused(api: Api, place: str) -> None:
    headers = api.headers()
    before = api.client.get("/v1/plans", headers=headers).json()["items"]
    for field in ("regions", "providers"):
        body = {**QLORA_PLAN, "constraints": {field: ["us", place]}}
        _refused(api.client.post("/v1/plans", json=body, headers=headers), f"constraints.{field}.1")
    version = api.client.post("/v1/plans", json={**QLORA_PLAN, "framework_version": "4.46.0\n"}, headers=headers)
    _refused(version, "framework_version")
    assert "control characters" in version.json()["message"]
    assert api.client.get("/v1/plans", headers=headers).json()["items"] == before


def test_more_regions_than_any_catalog_has_are_refused(api: Api) -> None:
    body = {**QLORA_PLAN, "constraints": {"regions": [f"r{i}" for i in range(201)]}}
    _refused(api.client.post("/v1/plans", json=body, headers=api.headers()), "constraints.regions")
    body = {**QLORA_PLAN, "constraints": {"regions": [f"r{i}" for i in range(200)]}}
    assert api.client.post("/v1/plans", json=body, headers=api.headers()).status_code == 202


def test_a_key_given_twice_is_refused_naming_it(api: Api) -> None:
    headers = {**api.headers(), "Content-Type": "application/json"}
    body = '{"model": {"name": "nope/nope"}, "model": {"name": "meta-llama/Llama-3.1-8B"}, "method": "lora"}'
    _refused(api.client.post("/v1/estimate", content=body, headers=headers), "model")
    before = api.client.get("/v1/plans", headers=headers).json()["items"]
    nested = '{"model": {"name": "meta-llama/Llama-3.1-8B"}, "method": "lora", "dataset": {"tokens": 1, "tokens": 9}}'
    _refused(api.client.post("/v1/plans", content=nested, headers=headers), "tokens")
    assert api.client.get("/v1/plans", headers=headers).json()["items"] == before


def test_a_data_set_sized_twice_is_refused(api: Api) -> None:
    body = {**QLORA_PLAN, "dataset": {"tokens": 1_000_000, "examples": 10, "avg_tokens": 5}}
    _refused(api.client.post("/v1/estimate", json=body, headers=api.headers()), "dataset.examples")
