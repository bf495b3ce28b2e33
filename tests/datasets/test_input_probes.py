"""Input probes of the data set API: a tokenizer.json body that json.loads cannot convert was a 500, and a data set
with one row holding a 5,000-digit number failed its whole check with Python's internal message."""

from __future__ import annotations

import gzip
import json

import pytest

from tests.datacheck.planted import BACKTRACKING_TOKENIZER
from tests.datasets.conftest import DataApi

GOOD = b'{"text": "a perfectly ordinary training example"}\n'


@pytest.mark.parametrize(
    "body",
    [
        b'{"model": {"vocab": 1' + b"0" * 5000 + b"}}",  # past Python's 4,300-digit int conversion limit
        b'{"model": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",  # past the decoder's recursion limit
    ],
    ids=["long-number", "deep-nesting"],
)
@pytest.mark.parametrize("content_type", ["application/json", "application/octet-stream"])
def test_a_tokenizer_body_json_cannot_read_is_a_422_naming_body(
    data_api: DataApi, body: bytes, content_type: str
) -> None:
    dataset = data_api.upload(GOOD)
    assert dataset["status"] == "done", dataset
    answer = data_api.client.put(
        f"/v1/datasets/{dataset['id']}/tokenizer",
        content=body,
        headers={**data_api.headers(), "Content-Type": content_type},
    )
    assert answer.status_code == 422, answer.text
    assert answer.json()["field"] == "body"
    after = data_api.client.get(f"/v1/datasets/{dataset['id']}", headers=data_api.headers()).json()
    assert after["tokenizer"] is False and after["status"] == "done"


def test_a_row_with_a_number_too_long_to_read_is_one_broken_row_of_a_done_check(data_api: DataApi) -> None:
    data = GOOD + b'{"text": "a row with a long id", "id": 1' + b"0" * 5000 + b"}\n"
    dataset = data_api.upload(data)
    assert dataset["status"] == "done", dataset
    report = dataset["report"]
    assert report["rows_kept"] == 1
    assert [r["row_number"] for r in report["broken_rows"]] == [2]


def test_a_gzip_of_blank_lines_fails_its_check_at_the_line_limit(data_api: DataApi) -> None:
    # 1 GB of newlines is a 1 MB gzip, under the expansion limit: its 268 million lines held the worker for minutes.
    # Scaled down: 2 MiB of newlines in a 2 KiB gzip is past the 100,000-line floor.
    dataset = data_api.upload(gzip.compress(b"\n" * (2 * 2**20), 9), name="blank.jsonl.gz")
    assert dataset["status"] == "failed", dataset
    assert dataset["report"] is None
    assert "holds more than 100,000 lines (blank ones counted), over the line limit" in dataset["error"]


def test_a_tokenizer_that_panics_on_a_row_fails_the_check_naming_the_tokenizer(data_api: DataApi) -> None:
    # tokenizers panics (a BaseException) where Oniguruma gives up on a pattern: the check process ended with no
    # answer, reported as "most likely out of memory".
    dataset = data_api.upload(json.dumps({"text": "a" * 40 + "b"}).encode() + b"\n")
    assert dataset["status"] == "done", dataset
    answer = data_api.client.put(
        f"/v1/datasets/{dataset['id']}/tokenizer",
        content=json.dumps(BACKTRACKING_TOKENIZER).encode(),
        headers={**data_api.headers(), "Content-Type": "application/json"},
    )
    assert answer.status_code == 200, answer.text
    after = data_api.wait_for_dataset(dataset["id"])
    assert after["status"] == "failed", after
    assert "tokenizer: the tokenizer failed on a row" in after["error"], after["error"]
