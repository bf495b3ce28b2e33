from __future__ import annotations

import json

import yaml

from services.estimator.validation import parse_plan
from services.export import read_back
from tests.api.conftest import QLORA_PLAN, Api


def test_export_every_format_of_a_done_plan(api: Api) -> None:
    plan_id = api.client.post("/v1/plans", json=QLORA_PLAN, headers=api.headers()).json()["id"]
    body = api.wait_for_plan(plan_id)
    assert body["status"] == "done"
    for fmt in ("hf-trainer", "accelerate", "deepspeed"):
        response = api.client.get(f"/v1/plans/{plan_id}/export?format={fmt}", headers=api.headers())
        assert response.status_code == 200, response.text
        files = response.json()["files"]
        assert response.json()["command"]
        rec = body["recommendations"][0]
        if fmt == "deepspeed" and rec["sharding"] not in ("zero1", "zero2", "zero3"):
            # Planned again for DeepSpeed: a ZeRO stage on the same card, its memory estimated again.
            assert any("for deepspeed" in n for n in response.json()["notes"])
            assert json.loads(files["ds_config.json"])["zero_optimization"]["stage"] in (2, 3)
            rec = {**rec, "sharding": "zero"}
        else:
            assert f"{rec['peak_gib_per_gpu']:.2f} GiB" in files["launch.sh"]
        for name, text in files.items():
            if name.endswith(".json"):
                json.loads(text)
            elif name.endswith(".yaml"):
                yaml.safe_load(text)
        request = dict(QLORA_PLAN)
        request.pop("dataset")
        request.pop("epochs")
        base = parse_plan(request)
        back = read_back(fmt, files, base)
        assert back.micro_batch_size == rec["micro_batch_size"] and back.gpus == rec["gpus"]


def test_export_errors(api: Api) -> None:
    plan_id = api.client.post("/v1/plans", json=QLORA_PLAN, headers=api.headers()).json()["id"]
    api.wait_for_plan(plan_id)
    assert api.client.get(f"/v1/plans/{plan_id}/export?format=nope", headers=api.headers()).status_code == 422
    response = api.client.get(f"/v1/plans/{plan_id}/export?format=hf-trainer&data_format=csv", headers=api.headers())
    assert response.status_code == 422 and "data_format" in response.text
    response = api.client.get(f"/v1/plans/{plan_id}/export?format=hf-trainer&recommendation=999", headers=api.headers())
    assert response.status_code == 422 and response.json()["field"] == "recommendation"
    assert (
        api.client.get(f"/v1/plans/{plan_id}/export?format=hf-trainer", headers=api.headers("beta")).status_code == 404
    )


def test_another_framework_is_planned_again_not_refused(api: Api) -> None:
    plan_id = api.client.post("/v1/plans", json=QLORA_PLAN, headers=api.headers()).json()["id"]
    assert api.wait_for_plan(plan_id)["status"] == "done"
    for fmt in ("torchtune", "axolotl"):
        response = api.client.get(f"/v1/plans/{plan_id}/export?format={fmt}", headers=api.headers())
        assert response.status_code == 200, response.text
        notes = response.json()["notes"]
        assert any(n.startswith(f"re-planned for {fmt}") for n in notes), notes
        assert any(n.startswith(f"setup for {fmt}:") for n in notes), notes


def test_export_writes_the_plans_kernels_and_double_quant_or_refuses_naming_them(api: Api) -> None:
    request = {**QLORA_PLAN, "kernels": "liger", "double_quant": True}
    plan_id = api.client.post("/v1/plans", json=request, headers=api.headers()).json()["id"]
    assert api.wait_for_plan(plan_id)["status"] == "done"
    response = api.client.get(f"/v1/plans/{plan_id}/export?format=hf-trainer", headers=api.headers())
    assert response.status_code == 200, response.text
    args = json.loads(response.json()["files"]["hf_args.json"])
    assert args["training_args"]["use_liger_kernel"] is True
    assert args["quantization_config"]["bnb_4bit_use_double_quant"] is True
    # torchtune has no switch for Liger's kernels: refused with the field named, not dropped.
    response = api.client.get(f"/v1/plans/{plan_id}/export?format=torchtune", headers=api.headers())
    assert response.status_code == 422 and response.json()["field"] == "kernels", response.text
