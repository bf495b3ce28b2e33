"""What a plan from a checked data set is priced by (a helper's probe of the data-set path, stop 57): the kept rows'
tokens, every one counted; the tokenizer.json's own truncation and padding never apply; and a data set with no row
to train on is no plan. Through the real API, the upload to the loopback S3 server and the check, as a user runs it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.api.conftest import QLORA_PLAN
from tests.datasets.conftest import DataApi


def _word_tokenizer(tmp_path: Path, **settings: Any) -> bytes:
    """A word-level tokenizer.json (one token per word), with a truncation or padding setting of its own."""
    tokenizers = pytest.importorskip("tokenizers")
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel({"[UNK]": 0, "[PAD]": 1, "a": 2}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    if "max_length" in settings:
        tokenizer.enable_truncation(max_length=settings["max_length"])
    if "pad_to" in settings:
        tokenizer.enable_padding(pad_id=1, pad_token="[PAD]", length=settings["pad_to"])
    path = tmp_path / "tokenizer.json"
    tokenizer.save(str(path))
    return path.read_bytes()


def _rows(*texts: str) -> bytes:
    return b"".join(json.dumps({"text": t}).encode() + b"\n" for t in texts)


def _plan_dataset(data_api: DataApi, dataset_id: str) -> Any:
    body = {**{k: v for k, v in QLORA_PLAN.items() if k not in ("dataset", "seq_len")}, "dataset_id": dataset_id}
    return data_api.client.post("/v1/plans", json=body, headers=data_api.headers())


def _checked_with(data_api: DataApi, data: bytes, tokenizer: bytes) -> dict[str, Any]:
    created = data_api.upload(data)
    put = data_api.client.put(f"/v1/datasets/{created['id']}/tokenizer", content=tokenizer, headers=data_api.headers())
    assert put.status_code == 200, put.text
    checked = data_api.wait_for_dataset(created["id"])
    assert checked["status"] == "done", checked["error"]
    return checked


@pytest.mark.parametrize("settings", [{"max_length": 16}, {"pad_to": 64}])
def test_a_tokenizers_own_truncation_and_padding_never_count(
    data_api: DataApi, tmp_path: Path, settings: dict[str, int]
) -> None:
    """Rows of 1 to 40 words, counted with a tokenizer.json that truncates at 16 or pads to 64: the counts are the
    rows' own (a probe: a max_length of 16 priced 1,440 tokens of 9,910)."""
    data = _rows(*(" ".join(["a"] * n) for n in range(1, 41)))
    tokens = _checked_with(data_api, data, _word_tokenizer(tmp_path, **settings))["report"]["tokens"]
    # Each row's words plus the EOS train.py appends (this tokenizer's post-processor adds no BOS).
    assert (tokens["method"], tokens["max_tokens"], tokens["p50_tokens"]) == ("tokenizer_json", 40 + 1, 20 + 1)
    assert tokens["tokens_per_epoch"] == sum(range(1, 41)) + 40


def test_a_plan_is_priced_by_the_kept_rows_every_token_counted(data_api: DataApi, tmp_path: Path) -> None:
    """Before: the plan's average divided all counted rows' tokens (empty and duplicate ones included, which the
    example count leaves out) and cut each row at the recommended seq_len, whatever seq_len the plan then set."""
    unique = [" ".join(["a"] * (10 + n % 7)) + f" w{n}" for n in range(60)]
    long_rows = [" ".join(["a"] * 3000) + f" long{n}" for n in range(2)]
    data = _rows(*unique, *long_rows, *([""] * 60), *([unique[0]] * 60))
    checked = _checked_with(data_api, data, _word_tokenizer(tmp_path))
    report = checked["report"]
    kept = report["kept_tokens"]
    assert report["rows_kept"] == kept["rows_counted"] == 62
    every_token = sum(len(t.split()) + 1 for t in unique + long_rows)  # the words and train.py's EOS
    assert kept["tokens_per_epoch"] == every_token
    response = _plan_dataset(data_api, checked["id"])
    assert response.status_code == 202, response.text
    plan = data_api.wait_for_plan(response.json()["id"])
    assert plan["status"] == "done", plan["error"]
    assert plan["request"]["dataset"]["avg_tokens"] == round(every_token / 62, 2)
    assert plan["request"]["dataset"]["max_tokens"] == 3001 + 1


@pytest.mark.parametrize("data", [_rows("", " ", ""), b'{"foo": 1}\n{"foo": 2}\n{"foo": 3}\n'])
def test_a_data_set_with_no_row_to_train_on_is_no_plan(data_api: DataApi, data: bytes) -> None:
    """An all-empty file, or one whose rows fit no format, was planned as one example of one token (a probe)."""
    checked = data_api.upload(data)
    assert checked["status"] == "done", checked["error"]
    assert checked["report"]["rows_kept"] == 0
    response = _plan_dataset(data_api, checked["id"])
    assert response.status_code == 422, response.text
    assert response.json()["field"] == "dataset_id" and "no row to train on" in response.json()["message"]


def test_a_json_array_that_breaks_midway_is_no_plan(data_api: DataApi) -> None:
    """The check reads a .json array up to its first syntax error; the rows after it were neither counted nor listed,
    and the plan was priced by the rows before it, where a trainer's JSON loader reads none of the file (a probe)."""
    data = b'[{"text": "row one here"}, {"text": }, {"text": "row three"}, {"text": "row four"}]'
    checked = data_api.upload(data, name="train.json")
    assert checked["status"] == "done", checked["error"]
    report = checked["report"]
    assert report["file_problem"].startswith("row 2: file is not valid JSON"), report["file_problem"]
    response = _plan_dataset(data_api, checked["id"])
    assert response.status_code == 422 and response.json()["field"] == "dataset_id", response.text
    assert "cannot be loaded whole" in response.json()["message"]
    whole = data_api.upload(b'[{"text": "row one here"}, {"text": "row two"}]', name="ok.json")
    assert whole["report"]["file_problem"] is None
