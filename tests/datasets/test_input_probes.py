"""Input probes of the data set API: a tokenizer.json body that json.loads cannot convert was a 500, and a data set
with one row holding a 5,000-digit number failed its whole check with Python's internal message."""

from __future__ import annotations

import pytest

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
