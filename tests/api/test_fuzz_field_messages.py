"""Bad input a bounded fuzzing pass over the API found answered without naming its field: a string length said in
"items", ids echoed whole, lookups of a body field's id answered as the path's, Python's own advice on a long integer
literal, a price list that is not text. Each is now a 4xx whose message starts with the field, and nothing is stored."""

from __future__ import annotations

from typing import Any

import pytest

from services.agent.agent import Agent
from tests.api.conftest import Api
from tests.api.test_integer_bounds import World


@pytest.fixture
def world(api: Api) -> World:
    return World(api)


def _names(answer: Any, field: str, status: int = 422) -> dict[str, Any]:
    assert answer.status_code == status, answer.text
    body: dict[str, Any] = answer.json()
    assert body["message"].startswith(f"{field}: "), body
    assert body.get("field") == field, body
    return body


def test_a_too_long_optional_single_line_string_is_said_in_characters(api: Api) -> None:
    # RunCreate.prefix is `SingleLine | None` with max_length: pydantic checks it as a sequence ("items").
    body = {"node_ids": ["n"], "checkpoint_dir": "/d", "prefix": "a" * 513}
    answer = api.client.post("/v1/plans/nope/runs", json=body, headers=api.headers())
    message = _names(answer, "prefix")["message"]
    assert "at most 512 characters" in message and "items" not in message, message


def test_a_run_node_id_is_bounded_not_echoed_whole(api: Api) -> None:
    body = {"node_ids": ["x" * 100_000], "checkpoint_dir": "/d"}
    answer = api.client.post("/v1/plans/nope/runs", json=body, headers=api.headers())
    assert answer.status_code == 422 and answer.json()["message"].startswith("node_ids."), answer.text[:300]
    assert len(answer.content) < 5_000


def test_unknown_ids_in_run_bodies_name_the_body_field(api: Api, world: World) -> None:
    headers = api.headers("admin")
    runs = api.client.get("/v1/runs", headers=headers).json()["items"]
    created = api.client.post(
        f"/v1/plans/{world.plan_id}/runs", json={"node_ids": ["nope"], "checkpoint_dir": "/d"}, headers=headers
    )
    _names(created, "node_ids")
    assert api.client.get("/v1/runs", headers=headers).json()["items"] == runs
    joined = api.client.post(f"/v1/runs/{world.run_id}/nodes", json={"node_id": "nope"}, headers=world.agent())
    _names(joined, "node_id")
    beat = api.client.post(
        f"/v1/nodes/{world.node_id}/heartbeat", json={"progress": {"run_id": "nope"}}, headers=world.agent()
    )
    _names(beat, "progress.run_id")


def test_a_node_of_another_gpu_is_refused_naming_the_field(api: Api, world: World) -> None:
    headers = api.headers("admin")
    other = api.client.post("/v1/nodes", json={"name": "h", "gpu": "H100 SXM"}, headers=headers).json()
    both = {"node_ids": [world.node_id, other["id"]], "checkpoint_dir": "/d"}
    _names(api.client.post(f"/v1/plans/{world.plan_id}/runs", json=both, headers=headers), "node_ids")
    agent = {**headers, "X-Node-Token": other["node_token"]}
    _names(api.client.post(f"/v1/runs/{world.run_id}/nodes", json={"node_id": other["id"]}, headers=agent), "node_id")


def test_an_unknown_gpu_names_the_field(api: Api) -> None:
    nodes = api.client.get("/v1/nodes", headers=api.headers()).json()["items"]
    registered = api.client.post("/v1/nodes", json={"name": "n", "gpu": "zzz"}, headers=api.headers())
    _names(registered, "gpu")
    assert api.client.get("/v1/nodes", headers=api.headers()).json()["items"] == nodes
    _names(api.client.get("/v1/benchmarks", params={"gpu": "zzz"}, headers=api.headers()), "gpu")


def test_a_calibration_of_an_unknown_plan_is_a_422_on_plan_id(api: Api) -> None:
    node = api.client.post("/v1/nodes", json={"name": "n", "gpu": "A100 80GB"}, headers=api.headers()).json()
    answer = api.client.post(f"/v1/nodes/{node['id']}/calibrations", json={"plan_id": "nope"}, headers=api.headers())
    _names(answer, "plan_id")
    claim = api.client.post(
        f"/v1/nodes/{node['id']}/calibrations/next", headers={**api.headers(), "X-Node-Token": node["node_token"]}
    )
    assert claim.status_code == 204, claim.text  # nothing was queued


@pytest.mark.parametrize("route", ["/v1/estimate", "/v1/plans"])
def test_an_integer_literal_past_pythons_digit_limit_names_its_field(api: Api, route: str) -> None:
    body = '{"model": {"name": "meta-llama/Llama-3.1-8B"}, "seq_len": 1' + "0" * 5000 + "}"
    answer = api.client.post(route, content=body, headers={**api.headers(), "Content-Type": "application/json"})
    message = _names(answer, "seq_len")["message"]
    assert "integer too large" in message and "sys." not in message, message


def test_a_price_list_that_is_not_utf8_names_the_body(api: Api) -> None:
    not_text = api.client.post(
        "/v1/admin/catalog/offers", content=b"\xff\xfe", headers={**api.headers("admin"), "Content-Type": "text/csv"}
    )
    _names(not_text, "body")


def test_the_agent_says_the_services_message_not_its_json(api: Api) -> None:
    agent = Agent(api.client, api.keys["alpha"])
    with pytest.raises(RuntimeError) as refused:
        agent.register(name="n", gpu="zzz")
    assert "gpu: unknown GPU 'zzz'" in str(refused.value) and '{"error"' not in str(refused.value), refused.value


@pytest.mark.parametrize("name", ["   ", "\u3000", "  \u00a0 "])
def test_a_node_name_of_spaces_alone_is_a_422_on_name_and_nothing_is_stored(api: Api, name: str) -> None:
    # A name of spaces alone was registered, and listed as a blank row.
    nodes = api.client.get("/v1/nodes", headers=api.headers()).json()["items"]
    answer = api.client.post("/v1/nodes", json={"name": name, "gpu": "A100 80GB"}, headers=api.headers())
    assert "blank" in _names(answer, "name")["message"]
    assert api.client.get("/v1/nodes", headers=api.headers()).json()["items"] == nodes


def test_a_node_name_is_trimmed(api: Api) -> None:
    node = api.client.post("/v1/nodes", json={"name": "  box-7 ", "gpu": "A100 80GB"}, headers=api.headers())
    assert node.status_code == 201, node.text
    listed = api.client.get("/v1/nodes", headers=api.headers()).json()["items"]
    assert [n["name"] for n in listed if n["id"] == node.json()["id"]] == ["box-7"]


@pytest.mark.parametrize("folder", ["outputs", "./out", "~/ckpt", "data/out", " /data/out"])
def test_a_relative_checkpoint_dir_is_a_422_on_checkpoint_dir(api: Api, world: World, folder: str) -> None:
    # The agent syncs the folder from its own working directory, not the trainer's: a relative one watched a folder
    # the trainer never wrote to, and no checkpoint became durable.
    headers = api.headers("admin")
    runs = api.client.get("/v1/runs", headers=headers).json()["items"]
    body = {"node_ids": [world.node_id], "checkpoint_dir": folder}
    message = _names(api.client.post(f"/v1/plans/{world.plan_id}/runs", json=body, headers=headers), "checkpoint_dir")
    assert "an absolute path on the node" in message["message"] and "--checkpoint-dir" in message["message"]
    assert api.client.get("/v1/runs", headers=headers).json()["items"] == runs


def test_a_price_list_country_is_a_two_letter_code_named_by_row(api: Api) -> None:
    headers = {**api.headers("admin"), "Content-Type": "text/csv"}
    before = api.client.get("/v1/catalog/offers?provider=isoco", headers=api.headers("admin")).json()["items"]
    columns = "provider,gpu,on_demand_usd_per_hour,region,country\n"
    bad = columns + "isoco,L4,0.5,r1,DE\nisoco,L4,0.5,r2,1\nisoco,L4,0.5,r3,USA\n"
    answer = api.client.post("/v1/admin/catalog/offers", content=bad, headers=headers)
    assert answer.status_code == 422, answer.text
    details = answer.json()["details"]
    assert [d.split(":")[0:2] for d in details] == [["row 2", " country"], ["row 3", " country"]], details
    assert all("ISO 3166-1 alpha-2" in d for d in details), details
    after = api.client.get("/v1/catalog/offers?provider=isoco", headers=api.headers("admin")).json()["items"]
    assert after == before == []  # nothing half-imported
    good = columns + "isoco,L4,0.5,r1, de\nisoco,L4,0.5,r2,\n"
    assert api.client.post("/v1/admin/catalog/offers", content=good, headers=headers).status_code == 201
    stored = api.client.get("/v1/catalog/offers?provider=isoco", headers=api.headers("admin")).json()["items"]
    assert sorted(o["country"] for o in stored) == ["", "DE"]
