from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Response

from services.api.deps import DbDep, PrincipalDep, SettingsDep
from services.api.routing import OffLoopRoute
from services.catalog.gpus import find_gpu
from services.core.idempotency import MAX_KEY_CHARS
from services.estimator.budget import CpuBudget
from services.estimator.estimate import estimate
from services.export import Format
from services.export.dataset import DataKind
from services.hub.service import FactoryCache, checkpoint_note, model_of, with_model_config
from services.nodes.calibration import calibrated_utilisation
from services.plans import service
from services.plans.schemas import PlanCreated, PlanList, PlanOut, PlanRequest

# Bodies are parsed and validated off the event loop (services/api/routing.py).
router = APIRouter(prefix="/v1", tags=["plans"], route_class=OffLoopRoute)


@router.post("/estimate", operation_id="plans-estimate")
def estimate_now(
    body: PlanRequest,
    db: DbDep,
    principal: PrincipalDep,
    settings: SettingsDep,
    gpu: Annotated[str | None, Query(max_length=100, description="GPU for tokens/s, e.g. 'A100 80GB'")] = None,
) -> dict[str, Any]:
    """Estimate a plan synchronously, without storing it (with the organization's calibration of the
    GPU and method, when its nodes measured one)."""
    spec = find_gpu(gpu) if gpu else None
    if body.dataset_id is not None:
        with db.transaction() as (session, _pending):
            body = service.with_dataset(session, principal.organization_id, body)
    plan, resolved = with_model_config(body.to_plan(), FactoryCache(db.factory))
    utilisation: tuple[float, str] | tuple[None, None] = (None, None)
    if spec is not None:
        with db.transaction() as (session, _pending):
            utilisation = calibrated_utilisation(session, principal.organization_id, plan.method).get(
                spec.name, (None, None)
            )
    report = estimate(
        plan,
        spec,
        utilisation=utilisation[0],
        utilisation_source=utilisation[1],
        budget=CpuBudget(settings.estimate_cpu_budget_s),
    )
    out = report.model_dump(mode="json")
    out["warnings"] = [*checkpoint_note(resolved), *out["warnings"]]
    return out


@router.post("/plans", operation_id="plans-create", status_code=202, response_model=PlanCreated)
def create_plan(
    body: PlanRequest,
    db: DbDep,
    principal: PrincipalDep,
    response: Response,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key", max_length=MAX_KEY_CHARS)] = None,
) -> PlanCreated:
    # A model named by its Hub id is fetched (and cached) before the plan's transaction opens; what was found
    # is handed to the submission, which does not look it up again.
    model = model_of(body.to_plan(), FactoryCache(db.factory))
    result, created = service.submit_idempotent(
        db.transaction, principal, body, idempotency_key, db.settings.quota_plans_per_hour, model
    )
    response.headers["Location"] = f"/v1/plans/{result.id}"
    if not created:
        response.status_code = 200
    return result


@router.get("/plans", operation_id="plans-list", response_model=PlanList)
def list_plans(
    db: DbDep,
    principal: PrincipalDep,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    before: Annotated[str | None, Query(max_length=64, description="cursor: the last id of the previous page")] = None,
) -> PlanList:
    with db.transaction() as (session, _pending):
        rows = service.list_plans(session, principal, limit, before)
        items = [service.to_summary(r) for r in rows]
    return PlanList(items=items, next_cursor=items[-1].id if len(items) == limit else None)


@router.post("/plans/{plan_id}/trace", operation_id="plans-trace", status_code=202, response_model=PlanOut)
def trace_plan(plan_id: str, db: DbDep, principal: PrincipalDep) -> PlanOut:
    """Queue the precise trace (one real training step under fake tensors); GET the plan for the result."""
    with db.transaction() as (session, pending):
        out = service.to_out(service.request_trace(session, principal, plan_id, pending))
    return out


@router.get("/plans/{plan_id}/export", operation_id="plans-export")
def export_plan(
    plan_id: str,
    db: DbDep,
    principal: PrincipalDep,
    format: Annotated[Format, Query(description="hf-trainer, accelerate, deepspeed, torchtune or axolotl")],
    recommendation: Annotated[int, Query(ge=0, le=1000, description="index into the plan's recommendations")] = 0,
    data_format: Annotated[
        DataKind | None,
        Query(description="the rows of train.jsonl; default: what the data check found in the plan's data set"),
    ] = None,
) -> dict[str, Any]:
    """Ready-to-run training configs for one of the plan's recommended setups (planned again for the format
    when it runs another framework or sharding; the notes say what changed)."""
    with db.transaction() as (session, _pending):
        bundle = service.export(session, principal, plan_id, format, recommendation, data_format)
    return {"format": bundle.format, "files": bundle.files, "command": bundle.command, "notes": bundle.notes}


@router.get("/plans/{plan_id}", operation_id="plans-get", response_model=PlanOut)
def get_plan(plan_id: str, db: DbDep, principal: PrincipalDep) -> PlanOut:
    with db.transaction() as (session, _pending):
        return service.to_out(service.get_plan(session, principal, plan_id))
