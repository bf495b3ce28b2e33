"""DELETE /v1/datasets/{id} and `gpuplan data delete`: the data set's row, parts and stored objects go; plans made
from it keep the numbers they took, and a new plan naming it is a 404 as for an unknown id. Through the real API
(SQLite and PostgreSQL) and the loopback S3 server, the CLI against the same app served over HTTP."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from services.cli.main import main
from services.core.settings import Settings
from services.storage.s3 import make_s3_client
from tests.api.conftest import QLORA_PLAN
from tests.conftest import served_on_loopback
from tests.datasets.conftest import PART_BYTES, DataApi


def _rows(n: int) -> bytes:
    return b"".join(json.dumps({"text": f"row {i} " + "word " * (5 + i % 9)}).encode() + b"\n" for i in range(n))


def _plan(data_api: DataApi, dataset_id: str, org: str = "alpha") -> Any:
    body = {**{k: v for k, v in QLORA_PLAN.items() if k not in ("dataset", "seq_len")}, "dataset_id": dataset_id}
    return data_api.client.post("/v1/plans", json=body, headers=data_api.headers(org))


def _stored(s3_settings: Settings) -> list[str]:
    """Every object in the test's bucket."""
    answer = make_s3_client(s3_settings).list_objects_v2(Bucket=s3_settings.s3_bucket)
    return sorted(o["Key"] for o in answer.get("Contents", []))


@pytest.fixture
def live_api(data_api: DataApi) -> Iterator[str]:
    """The data_api app served over real HTTP on loopback, for the CLI."""
    with served_on_loopback(data_api.client.app, "datasets-uvicorn", lifespan="off") as url:
        yield url


def test_a_deleted_data_set_and_its_stored_files_are_gone_and_its_plans_keep_their_numbers(
    data_api: DataApi, s3_settings: Settings
) -> None:
    checked = data_api.upload(_rows(200))
    assert checked["status"] == "done", checked["error"]
    dataset_id = checked["id"]
    tokenizer = {"model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "word": 1}, "unk_token": "[UNK]"}}
    put = data_api.client.put(
        f"/v1/datasets/{dataset_id}/tokenizer", content=json.dumps(tokenizer).encode(), headers=data_api.headers()
    )
    assert put.status_code == 200, put.text
    assert data_api.wait_for_dataset(dataset_id)["status"] == "done"
    made = _plan(data_api, dataset_id)
    assert made.status_code == 202, made.text
    plan = data_api.wait_for_plan(made.json()["id"])
    assert plan["status"] == "done", plan["error"]
    stored = _stored(s3_settings)
    assert len(stored) == 2 and all(dataset_id in key for key in stored), stored  # the file and tokenizer.json

    # Another organization's key, and an id no data set has: 404, nothing deleted.
    url = f"/v1/datasets/{dataset_id}"
    assert data_api.client.delete(url, headers=data_api.headers("beta")).status_code == 404
    assert data_api.client.delete("/v1/datasets/nosuchdataset", headers=data_api.headers()).status_code == 404
    assert data_api.client.get(url, headers=data_api.headers()).status_code == 200 and _stored(s3_settings) == stored

    deleted = data_api.client.delete(url, headers=data_api.headers())
    assert deleted.status_code == 204 and deleted.content == b""
    assert _stored(s3_settings) == []
    gone = data_api.client.get(url, headers=data_api.headers())
    assert gone.status_code == 404 and gone.json()["field"] == "id"
    assert data_api.client.get("/v1/datasets", headers=data_api.headers()).json()["items"] == []
    assert data_api.client.delete(url, headers=data_api.headers()).status_code == 404  # deleting again

    # The plan made from it keeps what it took; a new plan naming it is the unknown id's 404 on dataset_id.
    kept = data_api.client.get(f"/v1/plans/{plan['id']}", headers=data_api.headers())
    assert kept.status_code == 200 and kept.json()["request"]["dataset"] == plan["request"]["dataset"]
    assert kept.json()["recommendations"] == plan["recommendations"]
    again = _plan(data_api, dataset_id)
    unknown = _plan(data_api, "nosuchdataset")
    assert again.status_code == unknown.status_code == 404, again.text
    assert again.json()["field"] == unknown.json()["field"] == "dataset_id"
    assert again.json()["message"] == f"dataset_id: no data set {dataset_id!r}"


def test_deleting_an_unfinished_upload_aborts_it(data_api: DataApi, s3_settings: Settings) -> None:
    # Two parts: one sent, the upload left open. Long rows: the check at the end reads 1,200 of them, not the
    # 100,000 short ones that took it 25 s.
    data = b"".join(json.dumps({"text": f"row {i} " + "word " * 1000}).encode() + b"\n" for i in range(1200))
    assert len(data) > PART_BYTES
    created = data_api.create(data)
    assert data_api.put_part(created["id"], data, 1).status_code == 200
    s3 = make_s3_client(s3_settings)
    assert len(s3.list_multipart_uploads(Bucket=s3_settings.s3_bucket).get("Uploads", [])) == 1
    deleted = data_api.client.delete(f"/v1/datasets/{created['id']}", headers=data_api.headers())
    assert deleted.status_code == 204, deleted.text
    assert s3.list_multipart_uploads(Bucket=s3_settings.s3_bucket).get("Uploads", []) == []
    assert _stored(s3_settings) == []
    # Its parts went with it: the same file uploads again from the start.
    assert data_api.upload(data)["status"] == "done"


def test_gpuplan_data_delete(data_api: DataApi, live_api: str, capsys: pytest.CaptureFixture[str]) -> None:
    checked = data_api.upload(_rows(50))
    dataset_id = checked["id"]
    connect = ["--api", live_api, "--key", data_api.keys["alpha"]]

    assert main(["data", "delete", dataset_id, "--api", live_api, "--key", data_api.keys["beta"]]) == 2
    printed = capsys.readouterr()
    assert printed.out == "" and printed.err == f"gpuplan: error: data set {dataset_id}: no data set {dataset_id!r}\n"

    assert main(["data", "delete", dataset_id, *connect]) == 0
    printed = capsys.readouterr()
    assert printed.out == f"data set {dataset_id}: deleted, with its stored file\n" and printed.err == ""
    assert data_api.client.get(f"/v1/datasets/{dataset_id}", headers=data_api.headers()).status_code == 404

    assert main(["data", "delete", dataset_id, *connect]) == 2  # already gone: one line, non-zero
    assert capsys.readouterr().err.strip().splitlines() == [
        f"gpuplan: error: data set {dataset_id}: no data set {dataset_id!r}"
    ]
    assert main(["data", "delete", "not an id", *connect]) == 2
    assert "is not an id" in capsys.readouterr().err
    assert main(["data", "delete", dataset_id, "--api", "http://127.0.0.1:9", "--key", "k"]) == 2
    assert capsys.readouterr().err.startswith("gpuplan: error: cannot reach http://127.0.0.1:9")
