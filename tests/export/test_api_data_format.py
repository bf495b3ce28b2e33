"""The API export reads the row format the data check found in the plan's data set (SQLite and PostgreSQL,
a loopback S3 server): chat rows get the chat template, Alpaca rows the instruction template."""

from __future__ import annotations

import json
from typing import Any

import yaml

from tests.api.conftest import (
    QLORA_PLAN,
    database_url,  # noqa: F401  (the SQLite/PostgreSQL fixture)
)
from tests.datasets.conftest import DataApi, data_api  # noqa: F401  (the fixture)


def _rows(kind: str, n: int = 60) -> bytes:
    rows: list[dict[str, Any]] = []
    for i in range(n):
        if kind == "chat":
            rows.append(
                {
                    "messages": [
                        {"role": "user", "content": f"What is {i} plus {i}? Explain the sum step by step please."},
                        {
                            "role": "assistant",
                            "content": f"{i} plus {i} is {2 * i}, because adding a number to itself doubles it.",
                        },
                    ]
                }
            )
        else:
            rows.append(
                {
                    "instruction": f"Write the number {i} in words and say whether it is even.",
                    "input": "",
                    "output": f"The number {i} is {'even' if i % 2 == 0 else 'odd'}; it has {len(str(i))} digits.",
                }
            )
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def _plan(dataset_id: str) -> dict[str, Any]:
    return {**{k: v for k, v in QLORA_PLAN.items() if k not in ("dataset", "seq_len")}, "dataset_id": dataset_id}


def test_exports_read_the_checked_data_format(data_api: DataApi) -> None:  # noqa: F811
    for kind in ("chat", "alpaca"):
        checked = data_api.upload(_rows(kind), name=f"{kind}.jsonl")
        assert checked["status"] == "done", checked["error"]
        assert checked["report"]["detected_format"] == kind
        response = data_api.client.post("/v1/plans", json=_plan(checked["id"]), headers=data_api.headers())
        plan = data_api.wait_for_plan(response.json()["id"])
        assert plan["status"] == "done", plan["error"]
        url = f"/v1/plans/{plan['id']}/export"
        hf = data_api.client.get(f"{url}?format=hf-trainer", headers=data_api.headers()).json()
        tune = data_api.client.get(f"{url}?format=torchtune", headers=data_api.headers()).json()
        axo = data_api.client.get(f"{url}?format=axolotl", headers=data_api.headers()).json()
        source = f"the data check of data set {kind}.jsonl"
        for bundle in (hf, tune, axo):
            assert any(n.startswith(f"Data ({source})") for n in bundle["notes"]), bundle["notes"]
        dataset = yaml.safe_load(tune["files"]["config.yaml"])["dataset"]
        axolotl_data = yaml.safe_load(axo["files"]["axolotl.yaml"])["datasets"][0]
        if kind == "chat":
            assert "apply_chat_template" in hf["files"]["train.py"]
            assert dataset["_component_"] == "torchtune.datasets.chat_dataset"
            assert dataset["conversation_column"] == "messages"
            assert axolotl_data["type"] == "chat_template" and axolotl_data["field_messages"] == "messages"
        else:
            assert "### Instruction" in hf["files"]["train.py"]
            assert dataset["_component_"] == "torchtune.datasets.alpaca_dataset"
            assert axolotl_data["type"] == "alpaca"
        # The flag wins over the check.
        text = data_api.client.get(f"{url}?format=hf-trainer&data_format=text", headers=data_api.headers()).json()
        assert any(n.startswith("Data (data_format)") for n in text["notes"])
