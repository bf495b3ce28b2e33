"""The Python API answers what the HTTP API answers for the same body: an estimate equal to
POST /v1/estimate's, and a plan whose setups are the done plan's, on the embedded default."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from services.api.app import create_app
from services.core.db import make_engine, make_sessionmaker, unit_of_work
from services.core.settings import Settings
from services.orgs.service import create_key, create_organization
from services.sdk import PlanError, estimate, plan
from tests.api.conftest import QLORA_PLAN
from tests.conftest import bounded_test_client
from tests.databases import migrate


@pytest.fixture
def served(tmp_path: Path) -> Any:
    url = f"sqlite:///{tmp_path / 'sdk.db'}"
    migrate(url)
    with unit_of_work(make_sessionmaker(make_engine(url))) as session:
        create_organization(session, "sdk")
        key = create_key(session, "sdk")
    with bounded_test_client(create_app(Settings(database_url=url))) as client:
        yield client, {"Authorization": f"Bearer {key}"}


def test_the_python_estimate_is_the_apis(served: Any) -> None:
    client, headers = served
    body = {k: v for k, v in QLORA_PLAN.items() if k not in ("dataset", "epochs")}
    over_http = client.post("/v1/estimate", params={"gpu": "A100 80GB"}, json=body, headers=headers).json()
    assert estimate(body, gpu="A100 80GB") == over_http


def test_the_python_plan_is_the_done_plans(served: Any) -> None:
    client, headers = served
    plan_id = client.post("/v1/plans", json=QLORA_PLAN, headers=headers).json()["id"]
    deadline = time.monotonic() + 60
    while (done := client.get(f"/v1/plans/{plan_id}", headers=headers).json())["status"] not in ("done", "failed"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    ours = plan(QLORA_PLAN)
    assert [(r["gpu"], r["gpus"], r["provider"]) for r in ours["recommendations"]] == [
        (r["gpu"], r["gpus"], r["provider"]) for r in done["recommendations"]
    ]
    assert ours["recommendations"][0]["expected_cost_usd"] == done["recommendations"][0]["expected_cost_usd"]


def test_bad_input_names_the_field_as_the_api_does() -> None:
    with pytest.raises(PlanError) as bad:
        estimate({**QLORA_PLAN, "seq_len": 0})
    assert bad.value.field == "seq_len"
    with pytest.raises(PlanError) as missing:
        plan({k: v for k, v in QLORA_PLAN.items() if k != "dataset"})
    assert missing.value.field == "dataset"
    with pytest.raises(PlanError) as kernels:
        estimate({**QLORA_PLAN, "framework": "hf-trainer", "kernels": "unsloth"})
    assert kernels.value.field == "kernels"
    with pytest.raises(PlanError) as card:
        estimate(QLORA_PLAN, gpu="no such card")
    assert card.value.field is not None


@pytest.mark.parametrize("gpu", [5, "", "  "])
def test_a_gpu_that_is_no_name_is_refused_naming_gpu(gpu: Any) -> None:
    """An input probe of stop 53: gpu=5 raised AttributeError, and gpu="" estimated without a card."""
    with pytest.raises(PlanError) as bad:
        estimate(QLORA_PLAN, gpu=gpu)
    assert bad.value.field == "gpu"
