"""A data set that names its model is checked with that model's chat template in mind, also when its tokenizer.json
was uploaded: a Qwen2.5 Instruct template writes a default system turn on rows without a system message, and the
check counts it. Before, the uploaded tokenizer's recheck did not know the model and left it out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.datacheck.training import CHAT_TOKENS_PER_MESSAGE
from tests.datasets.conftest import DataApi
from tests.hub.fake_hub import FakeHub

QWEN25 = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
ROWS = [
    {"messages": [{"role": "user", "content": f"count to {n}"}, {"role": "assistant", "content": "a " * n}]}
    for n in range(1, 21)
]


def test_an_uploaded_tokenizer_counts_the_models_default_system_prompt(
    data_api: DataApi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer_json = tokenizer.to_str().encode()
    hub = FakeHub()  # holds no model: the Hub tokenizer is not found, the upload counts
    try:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.setenv("GPUPLAN_HUB_CACHE_DIR", str(tmp_path / "hub-cache"))
        data = "".join(json.dumps(r) + "\n" for r in ROWS).encode()
        reports = {}
        for name, model in (("plain.jsonl", None), ("qwen.jsonl", "Qwen/Qwen2.5-7B-Instruct")):
            created = data_api.upload(data, name=name, **({"model": model} if model else {}))
            put = data_api.client.put(
                f"/v1/datasets/{created['id']}/tokenizer", content=tokenizer_json, headers=data_api.headers()
            )
            assert put.status_code == 200, put.text
            checked = data_api.wait_for_dataset(created["id"])
            assert checked["status"] == "done", checked["error"]
            reports[name] = checked["report"]
    finally:
        hub.close()
    plain, qwen = reports["plain.jsonl"]["tokens"], reports["qwen.jsonl"]["tokens"]
    assert plain["method"] == qwen["method"] == "tokenizer_json"
    turn = CHAT_TOKENS_PER_MESSAGE + len(tokenizer.encode(QWEN25).ids)
    assert qwen["tokens_per_epoch"] == plain["tokens_per_epoch"] + len(ROWS) * turn
    assert qwen["max_tokens"] == plain["max_tokens"] + turn
    assert any(repr(QWEN25) in n for n in reports["qwen.jsonl"]["notes"])
