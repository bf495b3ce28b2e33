"""A plan is resolved once on its way: POST /v1/plans and its estimation task (in process) parse the model's
architecture once, resolve its config once and look the model up once (issue 24, step 1)."""

from __future__ import annotations

import sys
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

import services.catalog.models as catalog_models
import services.estimator.architecture.parse as parse
import services.estimator.recipe as recipe
import services.hub.service as hub
from services.estimator.resolved import clear_architecture_cache
from tests.api.conftest import QLORA_PLAN, Api


def _count_everywhere(monkeypatch: pytest.MonkeyPatch, counts: Counter[str], key: str, original: Any) -> None:
    """Count calls of ``original`` through every module-level name bound to it (``from x import f`` copies
    the binding, so patching the defining module alone would miss callers)."""
    lock = threading.Lock()

    def counted(*args: Any, **kwargs: Any) -> Any:
        # The in-process runner's threads run the estimation task; the rest is the POST request.
        side = "task" if threading.current_thread().name.startswith("gpuplan-task") else "request"
        with lock:
            counts[key] += 1
            counts[f"{key} ({side})"] += 1
        return original(*args, **kwargs)

    for module in list(sys.modules.values()):
        if module is None or not (getattr(module, "__name__", "") or "").startswith("services"):
            continue
        for name, value in list(vars(module).items()):
            if value is original:
                monkeypatch.setattr(module, name, counted)


def _counting(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    counts: Counter[str] = Counter()
    targets: dict[str, Callable[..., Any]] = {
        "architecture parses": parse.architecture_from_config,
        "config resolutions": hub.resolve_model,
        "model look-ups": catalog_models.find_model,
        "recipe resolutions": recipe.resolve_recipe,
    }
    for key, original in targets.items():
        _count_everywhere(monkeypatch, counts, key, original)
    return counts


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_post_plan_and_its_estimation_resolve_the_plan_once(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    clear_architecture_cache()  # parsed by no earlier test
    counts = _counting(monkeypatch)
    plan = QLORA_PLAN
    response = api.client.post("/v1/plans", json=plan, headers=api.headers())
    assert response.status_code == 202, response.text
    body = api.wait_for_plan(response.json()["id"])
    assert body["status"] == "done", body.get("error")
    # One parse in all: the request parses the architecture to check the plan, the task finds it by the
    # config's content. The task resolves the model again from the stored request (in Celery it runs in
    # another process), once; each side looks the model up once.
    assert counts["architecture parses"] == 1, counts
    for side in ("request", "task"):
        assert counts[f"config resolutions ({side})"] == 1, counts
        assert counts[f"model look-ups ({side})"] == 1, counts
    # The task resolves the plan's recipe once; the planner derives one per variant whose recipe inputs
    # differ (sharding: none, ZeRO-2, FSDP and ZeRO-3; accumulation, offload, optimizer, the method of a suggestion).
    assert counts["recipe resolutions (request)"] == 0, counts
    assert counts["recipe resolutions (task)"] <= 10, counts


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("fmt", ["hf-trainer", "torchtune"])
def test_an_export_parses_nothing_and_looks_the_model_up_once(
    api: Api, monkeypatch: pytest.MonkeyPatch, fmt: str
) -> None:
    """An export of a done plan resolves its model once and hands the resolved plan to the re-planning (a
    torchtune export plans again for another framework) and the writers: no parse, one look-up."""
    plan_id = api.client.post("/v1/plans", json=QLORA_PLAN, headers=api.headers()).json()["id"]
    assert api.wait_for_plan(plan_id)["status"] == "done"
    counts = _counting(monkeypatch)
    response = api.client.get(f"/v1/plans/{plan_id}/export?format={fmt}", headers=api.headers())
    assert response.status_code == 200, response.text
    assert counts["architecture parses"] == 0, counts
    assert counts["config resolutions"] == 1, counts
    assert counts["model look-ups"] == 1, counts
