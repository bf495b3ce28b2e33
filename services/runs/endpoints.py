from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from services.api.deps import DbDep, PageCursor, PageLimit, PrincipalDep, SettingsDep
from services.api.routing import OffLoopRoute
from services.core.errors import Forbidden
from services.core.pages import DEFAULT_LIMIT
from services.nodes.endpoints import NODE_AUTH, NodeTokenDep
from services.runs import service
from services.runs.schemas import (
    CheckpointOut,
    CheckpointReport,
    DurableAnswer,
    RunCreate,
    RunJoin,
    RunList,
    RunOut,
)

# Bodies are validated off the event loop (services/api/routing.py).
router = APIRouter(prefix="/v1", tags=["runs"], route_class=OffLoopRoute)


@router.post("/plans/{plan_id}/runs", operation_id="runs-create", status_code=201, response_model=RunOut)
def create_run(plan_id: str, body: RunCreate, db: DbDep, principal: PrincipalDep, settings: SettingsDep) -> RunOut:
    """Start tracking a run of the plan: its nodes, bucket and checkpoint schedule."""
    with db.transaction() as (session, _pending):
        run = service.create_run(session, principal, plan_id, body, settings)
        return service.to_out(session, run)


@router.get("/runs", operation_id="runs-list", response_model=RunList)
def list_runs(
    db: DbDep,
    principal: PrincipalDep,
    plan_id: Annotated[str | None, Query(max_length=64)] = None,
    limit: PageLimit = DEFAULT_LIMIT,
    before: PageCursor = None,
) -> RunList:
    """The organization's runs, newest first, a page at a time (``next_cursor`` names the next page)."""
    with db.transaction() as (session, _pending):
        rows, cursor = service.runs_page(session, principal, plan_id, limit, before)
        return RunList(items=[service.to_out(session, r) for r in rows], next_cursor=cursor)


@router.get("/runs/{run_id}", operation_id="runs-get", response_model=RunOut)
def get_run(run_id: str, db: DbDep, principal: PrincipalDep) -> RunOut:
    """The schedule, the last durable step and every checkpoint with its manifest."""
    with db.transaction() as (session, _pending):
        return service.to_out(session, service.get_run(session, principal, run_id))


@router.post("/runs/{run_id}/nodes", operation_id="runs-join", response_model=RunOut, responses=NODE_AUTH)
def join_run(run_id: str, body: RunJoin, db: DbDep, principal: PrincipalDep, token: NodeTokenDep = None) -> RunOut:
    """A node joins the run (its agent started with ``--run``, with the node token); its idle policy becomes
    the run's."""
    if "agent" in principal.scopes and body.node_id != principal.node_id:
        raise Forbidden(f"this agent key acts for node {principal.node_id} only", field="node_id")
    with db.transaction() as (session, _pending):
        return service.to_out(session, service.join_run(session, principal, run_id, body.node_id, token))


@router.post("/runs/{run_id}/checkpoints", operation_id="runs-checkpoint-durable", response_model=DurableAnswer)
def checkpoint_durable(run_id: str, body: CheckpointReport, db: DbDep, principal: PrincipalDep) -> DurableAnswer:
    """For the node: a checkpoint's manifest is in the bucket. Answers what retention lets go."""
    with db.transaction() as (session, _pending):
        return service.record_durable(session, principal, run_id, body)


@router.post(
    "/runs/{run_id}/checkpoints/{step}/deleted", operation_id="runs-checkpoint-deleted", response_model=CheckpointOut
)
def checkpoint_deleted(
    run_id: str, step: Annotated[int, Path(ge=0, le=2**31 - 1)], db: DbDep, principal: PrincipalDep
) -> CheckpointOut:
    """For the node: retention deleted this checkpoint from the bucket."""
    with db.transaction() as (session, _pending):
        return CheckpointOut.model_validate(
            service.record_deleted(session, principal, run_id, step), from_attributes=True
        )
