"""Text a request gives that a name, a path or an address cannot hold (a fuzzing pass of stop 49): control characters
(a terminal escape in a customer's name reached the quote sent to them) and a checkpoint directory name that climbs
out of the directory a restore writes to. Each is a 422 naming the field, and nothing is stored."""

from __future__ import annotations

from typing import Any

import pytest

from tests.api.conftest import Api
from tests.api.test_integer_bounds import World, _manifest


@pytest.fixture
def world(api: Api) -> World:
    return World(api)


def _refused(answer: Any, field: str) -> None:
    assert answer.status_code == 422, answer.text
    assert answer.json()["message"].startswith(f"{field}:"), answer.text


@pytest.mark.parametrize("name", ["a\u0001\u0007\u001b[31mred", "two\nlines", "tab\there", "line\u2028separator"])
def test_a_customer_name_with_control_characters_is_refused(api: Api, world: World, name: str) -> None:
    route = f"/v1/plans/{world.plan_id}/quotes"
    before = api.client.get("/v1/quotes", headers=world.agent()).json()["items"]
    _refused(
        api.client.post(route, json={"best_for_gpus": 1, "customer_name": name}, headers=world.agent()), "customer_name"
    )
    assert api.client.get("/v1/quotes", headers=world.agent()).json()["items"] == before
    done = api.client.post(
        route, json={"best_for_gpus": 1, "customer_name": "Zeynep Çelik (Ankara)"}, headers=world.agent()
    )
    assert done.status_code == 201, done.text


def test_node_and_run_text_with_control_characters_is_refused(api: Api, world: World) -> None:
    headers = world.agent()
    _refused(api.client.post("/v1/nodes", json={"name": "n\u001b[2J", "gpu": "A100 80GB"}, headers=headers), "name")
    body = {"node_ids": [world.node_id], "checkpoint_dir": "/a\u0001b", "bucket": "gpuplan-runs"}
    _refused(api.client.post(f"/v1/plans/{world.plan_id}/runs", json=body, headers=headers), "checkpoint_dir")


@pytest.mark.parametrize("dir_name", ["..", ".", "../etc", "/abs", "a/b"])
def test_a_checkpoint_directory_name_that_leaves_the_restore_target_is_refused(
    api: Api, world: World, dir_name: str
) -> None:
    manifest = {**_manifest(world.run_id, 7), "dir_name": dir_name}
    answer = api.client.post(f"/v1/runs/{world.run_id}/checkpoints", json={"manifest": manifest}, headers=world.agent())
    _refused(answer, "manifest.dir_name")
    run = api.client.get(f"/v1/runs/{world.run_id}", headers=world.agent()).json()
    assert run["last_durable_step"] is None


@pytest.mark.parametrize("email", ["nobody", "a" * 65 + "@example.org", "two@at@example.org"])
def test_a_customer_email_that_is_no_address_is_refused_naming_the_field_once(
    api: Api, world: World, email: str
) -> None:
    body = {"best_for_gpus": 1, "customer_email": email}
    answer = api.client.post(f"/v1/plans/{world.plan_id}/quotes", json=body, headers=world.agent())
    _refused(answer, "customer_email")
    assert "customer_email: customer_email" not in answer.text


def test_a_trailing_line_break_is_refused_where_a_pattern_checks_the_text(api: Api, world: World) -> None:
    # Python's "$" also matches before a final "\n": a key name, a run's bucket and prefix passed their patterns
    # with one, and were stored.
    headers = api.headers("admin")
    keys = api.client.get("/v1/keys", headers=headers).json()["items"]
    _refused(api.client.post("/v1/keys", json={"name": "ci\n"}, headers=headers), "name")
    assert api.client.get("/v1/keys", headers=headers).json()["items"] == keys
    route = f"/v1/plans/{world.plan_id}/runs"
    runs = api.client.get("/v1/runs", headers=headers).json()["items"]
    for field, value in (("bucket", "gpuplan-runs\n"), ("prefix", "exp-1/\n")):
        body = {"node_ids": [world.node_id], "checkpoint_dir": "/data/out", "bucket": "gpuplan-runs", field: value}
        _refused(api.client.post(route, json=body, headers=headers), field)
    assert api.client.get("/v1/runs", headers=headers).json()["items"] == runs
    assert api.client.post("/v1/keys", json={"name": "ci"}, headers=headers).status_code == 201


def test_a_calibration_note_that_is_not_one_line_of_text_is_refused(api: Api, world: World) -> None:
    calibration = world.calibration_id()
    route = f"/v1/calibrations/{calibration}/result"
    result = {"tokens_per_s": 1000.0, "seconds": 1.0, "comparable": False}
    for note in ("two\nlines", "reversed \u202etxt.exe"):
        _refused(api.client.post(route, json={**result, "notes": ["fine", note]}, headers=world.agent()), "notes.1")
    done = api.client.post(route, json={**result, "notes": ["measured on 1 GPU"]}, headers=world.agent())
    assert done.status_code == 200, done.text


def test_a_step_reported_again_keeps_its_manifest_and_its_row_alike(api: Api, world: World) -> None:
    # The same files again without the metric, marked final: the row kept metric 1.0, its stored manifest lost it.
    route = f"/v1/runs/{world.run_id}/checkpoints"
    first = {**_manifest(world.run_id, 700), "metric": 1.0}
    assert api.client.post(route, json={"manifest": first}, headers=world.agent()).status_code == 200
    again = {**_manifest(world.run_id, 700), "final": True}
    assert api.client.post(route, json={"manifest": again}, headers=world.agent()).status_code == 200
    run = api.client.get(f"/v1/runs/{world.run_id}", headers=world.agent()).json()
    (row,) = [c for c in run["checkpoints"] if c["step"] == 700]
    assert (row["metric"], row["final"]) == (1.0, True)
    assert (row["manifest"]["metric"], row["manifest"]["final"]) == (1.0, True)
