"""gpuplan from Python: the estimate and the plan the API answers, with the same schema and results, for a
notebook or a script, with no server and no database.

    from services.sdk import estimate, plan

    report = estimate({"model": {"name": "meta-llama/Llama-3.1-8B"}, "method": "qlora", "seq_len": 2048},
                      gpu="A100 80GB")
    report["memory"]["peak_device_gib"], report["throughput"]["tokens_per_s"]

    setups = plan({"model": {"name": "meta-llama/Llama-3.1-8B"}, "method": "qlora",
                   "dataset": {"examples": 10_000, "avg_tokens": 512}, "epochs": 3})
    setups["recommendations"][0]["gpu"], setups["recommendations"][0]["expected_cost_usd"]

``estimate`` is ``POST /v1/estimate``'s answer; ``plan`` is what a done plan holds under
``GET /v1/plans/{id}`` (recommendations, rejections, warnings). Input is the API's JSON (a dict) or
the schema objects; bad input raises ``PlanError`` naming the field, as the API's 422 does. A model
named by its Hub id is read from the bundled catalog, else the disk cache the CLI uses, else the Hub.
Prices are the bundled catalog's unless ``offers`` are given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from services.catalog.gpus import find_gpu
from services.catalog.offers import Offer, bundled_offers
from services.core.errors import GpuplanError
from services.core.settings import Settings
from services.estimator.errors import EstimatorError
from services.estimator.estimate import estimate as _estimate
from services.estimator.plan import Plan
from services.hub.service import DiskCache, checkpoint_note, with_model_config
from services.plans.recommend import recommend
from services.plans.schemas import PlanRequest

__all__ = ["PlanError", "estimate", "plan"]


class PlanError(ValueError):
    """Bad input: ``field`` names what is wrong (the API's 422 ``field``), ``message`` says why."""

    def __init__(self, field: str | None, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message


def _validated(model: type[Plan], data: Mapping[str, Any] | Plan) -> Any:
    if isinstance(data, model):
        return data
    try:
        return model.model_validate(dict(data) if isinstance(data, Mapping) else data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or None
        raise PlanError(field, str(first["msg"])) from None


def _with_model(plan: Any) -> tuple[Any, Any]:
    try:
        return with_model_config(plan, DiskCache())
    except GpuplanError as exc:
        raise PlanError(exc.field or "model.name", exc.message) from None


def estimate(plan: Mapping[str, Any] | Plan, gpu: str | None = None) -> dict[str, Any]:
    """Peak memory per GPU and its breakdown, the fit on every catalog card, tokens/s on ``gpu`` and the
    cost per provider: ``POST /v1/estimate``'s answer for the same body and ``?gpu=``."""
    request = _validated(PlanRequest, plan)
    if gpu is not None and (not isinstance(gpu, str) or not gpu.strip()):
        # 5 raised AttributeError inside the name matching, and "" silently estimated no card's tokens/s.
        raise PlanError("gpu", f"a GPU name such as 'A100 80GB', or None (got {gpu!r})")
    try:
        spec = find_gpu(gpu) if gpu else None
        filled, resolved = _with_model(request.to_plan())
        report = _estimate(filled, spec)
    except EstimatorError as exc:
        raise PlanError(exc.field, exc.message) from None
    out = report.model_dump(mode="json")
    out["warnings"] = [*checkpoint_note(resolved), *out["warnings"]]
    return out


def plan(request: Mapping[str, Any] | PlanRequest, offers: Sequence[Offer] | None = None) -> dict[str, Any]:
    """The cheapest setups for the run (a plan request with its data set and epochs), with the setups
    refused and why: what a done plan of ``POST /v1/plans`` holds, on the bundled catalog or ``offers``."""
    body = _validated(PlanRequest, request)
    if body.dataset is None:
        raise PlanError("dataset", "give the data set size, {'examples': N, 'avg_tokens': T} or {'tokens': N}")
    try:
        filled, resolved = _with_model(body.to_plan())
        recommendations, rejections, warnings = recommend(
            filled,
            body.constraints,
            tuple(offers) if offers is not None else bundled_offers(),
            Settings().safety_margin,
        )
    except EstimatorError as exc:
        raise PlanError(exc.field, exc.message) from None
    return {
        "recommendations": recommendations,
        "rejections": rejections,
        "warnings": [*checkpoint_note(resolved), *warnings],
    }
