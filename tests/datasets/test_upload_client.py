"""The resumable upload client (gpuplan data upload) against the real API and a loopback S3 server."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.datasets.client import UploadError, upload_file, wait_for_check
from tests.datacheck.planted import write_planted
from tests.datasets.conftest import DataApi


class Cut(Exception):
    """The connection drops."""


def test_an_interrupted_upload_resumes_with_the_missing_parts(data_api: DataApi, tmp_path: Path) -> None:
    path = tmp_path / "train.jsonl"
    truth = write_planted(path, base_rows=1000, filler_bytes=11_000_000)
    client = data_api.client
    client.headers.update(data_api.headers())
    ids: list[str] = []
    first: list[int] = []

    def cut_after_first_part(number: int, total: int) -> None:
        first.append(number)
        raise Cut

    with pytest.raises(Cut):
        upload_file(client, path, data_country="TR", started=ids.append, sent=cut_after_first_part)
    resumed: list[int] = []
    body = upload_file(client, path, resume_id=ids[0], sent=lambda n, total: resumed.append(n))
    assert (first, resumed) == ([1], [2, 3])
    done = wait_for_check(client, body["id"], poll_s=0.05)
    assert done["status"] == "done" and done["report"]["rows_total"] == truth.rows_total
    assert done["sha256"] is not None and done["data_country"] == "TR"
    other = tmp_path / "other.jsonl"
    other.write_text('{"text": "a different file"}\n', encoding="utf-8")
    with pytest.raises(UploadError, match="that upload is"):
        upload_file(client, other, resume_id=ids[0])
