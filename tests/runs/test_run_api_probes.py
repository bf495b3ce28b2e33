"""The runs API: two runs of one organization in one bucket prefix, and nodes a request body names."""

from __future__ import annotations

from pathlib import Path

from services.runs.client import RunApi
from services.runs.sync import SyncOptions, sync_pass
from services.storage.s3 import make_s3_client
from tests.runs.conftest import RunEnv, make_checkpoint

MiB = 2**20
OPTIONS = SyncOptions(part_size=5 * MiB, multipart_threshold=5 * MiB, settle_s=0)


def test_a_second_run_cannot_take_the_prefix_another_run_writes_to(run_env: RunEnv, tmp_path: Path) -> None:
    """A re-run given the first run's prefix used to be accepted: its steps share the first run's keys, so its first
    step that the first run had made durable failed every sync pass (the bucket's manifest names the other run), and
    each run's retention and orphan cleanup deletes the other's objects at a shared step."""
    env = run_env
    first = env.new_run(prefix="exp-1")
    s3 = make_s3_client(env.s3)
    run = env.client.get(f"/v1/runs/{first}", headers=env.headers).json()
    make_checkpoint(tmp_path / "a", 100, MiB, seed=1)
    sync_pass(s3, run["bucket"], run["prefix"], first, tmp_path / "a", RunApi(env.client, env.key, first), OPTIONS)
    body = {"node_ids": [env.node_id], "checkpoint_dir": "/data/ckpt", "bucket": env.s3.s3_bucket, "prefix": "exp-1/"}
    again = env.client.post(f"/v1/plans/{env.plan_id}/runs", json=body, headers=env.headers)
    assert again.status_code == 409, again.text
    error = again.json()
    assert first in error["message"] and "prefix" in again.text
    # Another prefix is fine, and another organization's namespace is its own.
    assert env.new_run(prefix="exp-2")
    theirs = {"Authorization": f"Bearer {env.other_key}"}
    other = env.client.post(f"/v1/plans/{env.plan_id}/runs", json=body, headers=theirs)
    assert other.status_code == 404  # the plan is not theirs: nothing about alpha's prefixes is said


def test_a_node_the_organization_does_not_have_is_named_by_its_body_field(run_env: RunEnv) -> None:
    """A run naming an unknown node (a typo, another organization's node) was a 404 on 'id', a field the request does
    not have: the path names the plan, the body the nodes."""
    env = run_env
    theirs = env.client.post(
        "/v1/nodes", json={"name": "beta-gpu", "gpu": "A100 80GB"}, headers={"Authorization": f"Bearer {env.other_key}"}
    ).json()["id"]
    for node_id in ("no-such-node", theirs):
        body = {"node_ids": [env.node_id, node_id], "checkpoint_dir": "/data/ckpt"}
        created = env.client.post(f"/v1/plans/{env.plan_id}/runs", json=body, headers=env.headers)
        assert created.status_code == 422 and created.json()["field"] == "node_ids", created.text
        assert node_id in created.json()["message"]
        joined = env.client.post(f"/v1/runs/{env.run_id}/nodes", json={"node_id": node_id}, headers=env.headers)
        assert joined.status_code == 422 and joined.json()["field"] == "node_id", joined.text
    # The organization's own node still has to prove itself with its token to join.
    unproven = env.client.post(f"/v1/runs/{env.run_id}/nodes", json={"node_id": env.node_id}, headers=env.headers)
    assert unproven.status_code == 401
