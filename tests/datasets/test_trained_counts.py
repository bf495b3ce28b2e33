"""A plan from a checked instruction data set is priced by the tokens the exported train.py trains on: the Alpaca
prompt around each row and its EOS, not the rows' fields alone (a probe: 7,960 tokens counted, 26,560 trained).
Through the real API, the upload to the loopback S3 server and the check, as a user runs it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from services.export.dataset import ALPACA_PROMPT, ALPACA_PROMPT_WITH_INPUT
from tests.api.conftest import QLORA_PLAN
from tests.datasets.conftest import DataApi


def _word_tokenizer(tmp_path: Path) -> tuple[Any, bytes]:
    """A word-level tokenizer.json (one token per word or punctuation run, no special tokens of its own)."""
    tokenizers = pytest.importorskip("tokenizers")
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    return tokenizer, (tmp_path / "tokenizer.json").read_bytes()


def _rendered(row: dict[str, str]) -> str:
    """The prompt the exported train.py renders for an Alpaca row (services/export/hf.py, segments)."""
    if row["input"]:
        return ALPACA_PROMPT_WITH_INPUT.format(instruction=row["instruction"], input=row["input"])
    return ALPACA_PROMPT.format(instruction=row["instruction"])


def test_a_plan_from_instruction_rows_counts_the_alpaca_prompt(data_api: DataApi, tmp_path: Path) -> None:
    rows = [
        {"instruction": f"say a {n} times", "input": "a " * (n % 3), "output": " ".join(["a"] * n)}
        for n in range(1, 41)
    ]
    tokenizer, tokenizer_json = _word_tokenizer(tmp_path)
    created = data_api.upload("".join(json.dumps(r) + "\n" for r in rows).encode())
    put = data_api.client.put(
        f"/v1/datasets/{created['id']}/tokenizer", content=tokenizer_json, headers=data_api.headers()
    )
    assert put.status_code == 200, put.text
    checked = data_api.wait_for_dataset(created["id"])
    assert checked["status"] == "done", checked["error"]
    kept = checked["report"]["kept_tokens"]
    trained = [len(tokenizer.encode(_rendered(r)).ids) + len(tokenizer.encode(r["output"]).ids) + 1 for r in rows]
    fields = [len(tokenizer.encode("\n".join(v for v in r.values() if v)).ids) for r in rows]
    assert (kept["method"], kept["rows_counted"]) == ("tokenizer_json", 40)
    assert kept["tokens_per_epoch"] == sum(trained) > 2 * sum(fields)
    assert any("Alpaca prompt" in note for note in kept["notes"])
    body = {**{k: v for k, v in QLORA_PLAN.items() if k not in ("dataset", "seq_len")}, "dataset_id": checked["id"]}
    response = data_api.client.post("/v1/plans", json=body, headers=data_api.headers())
    assert response.status_code == 202, response.text
    plan = data_api.wait_for_plan(response.json()["id"])
    assert plan["status"] == "done", plan["error"]
    assert plan["request"]["dataset"]["avg_tokens"] == round(sum(trained) / 40, 2)
    assert plan["request"]["dataset"]["max_tokens"] == max(trained)
