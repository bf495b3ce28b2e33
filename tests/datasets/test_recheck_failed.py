"""A check run again that fails leaves no report: before, the data set showed `failed` with the report of the check
before it, whose counts (what a plan is priced by) were shown as if current, also by `gpuplan data upload --resume`.
Now the failed check's error is all it shows, a plan from it is refused naming dataset_id until a check succeeds,
and a check run again once the file is back gives the report again. Through the real API and the loopback S3."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.cli.main import main
from services.core.settings import Settings
from services.storage.s3 import make_s3_client
from tests.datasets.conftest import DataApi
from tests.datasets.test_delete_dataset import _plan, _rows, _stored, live_api  # noqa: F401


def test_a_failed_recheck_shows_no_old_report_and_no_plan_is_made_from_it(
    data_api: DataApi, s3_settings: Settings
) -> None:
    data = _rows(120)
    checked = data_api.upload(data)
    assert checked["status"] == "done" and checked["report"]["rows_total"] == 120, checked["error"]
    dataset_id = checked["id"]
    assert _plan(data_api, dataset_id).status_code == 202
    [key] = _stored(s3_settings)
    s3 = make_s3_client(s3_settings)
    s3.delete_object(Bucket=s3_settings.s3_bucket, Key=key)  # the stored file is gone: the check cannot read it

    queued = data_api.client.post(f"/v1/datasets/{dataset_id}/check", headers=data_api.headers())
    assert queued.status_code == 200, queued.text
    assert queued.json()["report"] is None  # the old counts are no longer shown as the data set's
    failed = data_api.wait_for_dataset(dataset_id)
    assert failed["status"] == "failed" and "NoSuchKey" in failed["error"], failed
    assert failed["report"] is None and failed["progress"]["percent"] != 100.0
    refused = _plan(data_api, dataset_id)
    assert refused.status_code == 409 and refused.json()["field"] == "dataset_id", refused.text
    assert f"data set {dataset_id} is failed: {failed['error']}" in refused.json()["message"]

    s3.put_object(Bucket=s3_settings.s3_bucket, Key=key, Body=data)  # back: the next check succeeds
    assert data_api.client.post(f"/v1/datasets/{dataset_id}/check", headers=data_api.headers()).status_code == 200
    done = data_api.wait_for_dataset(dataset_id)
    assert done["status"] == "done" and done["error"] is None and done["report"] == checked["report"]
    assert _plan(data_api, dataset_id).status_code == 202


def test_gpuplan_data_upload_resume_shows_the_failure_without_old_counts(
    data_api: DataApi,
    s3_settings: Settings,
    live_api: str,  # noqa: F811  (the fixture of test_delete_dataset)
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "train.jsonl"
    path.write_bytes(_rows(80))
    checked = data_api.upload(path.read_bytes())
    dataset_id = checked["id"]
    [key] = _stored(s3_settings)
    make_s3_client(s3_settings).delete_object(Bucket=s3_settings.s3_bucket, Key=key)
    assert data_api.client.post(f"/v1/datasets/{dataset_id}/check", headers=data_api.headers()).status_code == 200
    assert data_api.wait_for_dataset(dataset_id)["status"] == "failed"

    connect = ["--api", live_api, "--key", data_api.keys["alpha"]]
    assert main(["data", "upload", str(path), "--resume", dataset_id, *connect]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"data set {dataset_id}: failed (object storage: NoSuchKey"), out
    assert "80 rows" not in out and "plan from it" not in out
