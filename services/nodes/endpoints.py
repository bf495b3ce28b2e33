from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request, Response

from services.api.deps import DbDep, PageCursor, PageLimit, PrincipalDep, SettingsDep
from services.api.routing import OffLoopRoute
from services.core.pages import DEFAULT_LIMIT
from services.nodes import service
from services.nodes.lifecycle import list_events, stop_policy, sync_alert_policy
from services.nodes.schemas import (
    BenchmarkList,
    BenchmarkOut,
    CalibrationFailure,
    CalibrationOut,
    CalibrationRequest,
    CalibrationResult,
    Heartbeat,
    NodeEventOut,
    NodeList,
    NodeOut,
    NodeRegistered,
    NodeRegistration,
)
from services.nodes.tables import BenchmarkRow, CalibrationRow, NodeRow
from services.plans.stored import STORED_PLANS
from services.runs.service import record_heartbeat_progress

# Bodies are validated off the event loop (services/api/routing.py).
router = APIRouter(prefix="/v1", tags=["nodes"], route_class=OffLoopRoute)

# The token a node's registration returned; every heartbeat and report of its agent carries it.
NodeTokenDep = Annotated[
    str | None,
    Header(alias=service.NODE_TOKEN_HEADER, max_length=200, description="the token the node's registration returned"),
]
NODE_AUTH: dict[int | str, dict[str, Any]] = {401: {"description": "missing or wrong API key or X-Node-Token"}}


def _peer(request: Request) -> service.Peer | None:
    client, server = request.client, request.scope.get("server")
    if client is None or not server or server[1] is None:
        return None
    return service.Peer(client.host, client.port, int(server[1]))


def _node(row: NodeRow) -> NodeOut:
    return NodeOut.model_validate(row, from_attributes=True)


def _calibration(row: CalibrationRow, plan: dict[str, object] | None = None) -> CalibrationOut:
    out = CalibrationOut.model_validate(row, from_attributes=True)
    return out.model_copy(update={"plan": plan}) if plan is not None else out


def _benchmark(row: BenchmarkRow) -> BenchmarkOut:
    return BenchmarkOut.model_validate(row, from_attributes=True)


@router.post(
    "/nodes",
    operation_id="nodes-register",
    status_code=201,
    response_model=NodeRegistered,
    responses={409: {"description": "the instance is registered by another organization"}},
)
def register(body: NodeRegistration, db: DbDep, principal: PrincipalDep, settings: SettingsDep) -> NodeRegistered:
    """Register a node; the answer carries its agent token, once (only its hash is stored)."""
    with db.transaction() as (session, _pending):
        node, token = service.register_node(
            session,
            principal,
            body,
            driver=settings.provider_driver,
            instance_id_pattern=settings.provider_instance_id_pattern,
            quota=settings.quota_nodes,
        )
        return NodeRegistered(**_node(node).model_dump(), node_token=token)


@router.get("/nodes", operation_id="nodes-list", response_model=NodeList)
def list_nodes(
    db: DbDep, principal: PrincipalDep, limit: PageLimit = DEFAULT_LIMIT, before: PageCursor = None
) -> NodeList:
    """The organization's nodes, oldest first, a page at a time (``next_cursor`` names the next page)."""
    with db.transaction() as (session, _pending):
        rows, cursor = service.nodes_page(session, principal, limit, before)
        return NodeList(items=[_node(n) for n in rows], next_cursor=cursor)


@router.get("/nodes/{node_id}", operation_id="nodes-get", response_model=NodeOut)
def get_node(node_id: str, db: DbDep, principal: PrincipalDep) -> NodeOut:
    with db.transaction() as (session, _pending):
        return _node(service.get_node(session, principal, node_id))


@router.post("/nodes/{node_id}/heartbeat", operation_id="nodes-heartbeat", response_model=NodeOut, responses=NODE_AUTH)
def heartbeat(
    node_id: str,
    body: Heartbeat,
    db: DbDep,
    principal: PrincipalDep,
    settings: SettingsDep,
    request: Request,
    token: NodeTokenDep = None,
) -> NodeOut:
    """The agent's report (with its node token); the answer carries the commands waiting for it (e.g. ``sync``)."""
    with db.transaction() as (session, _pending):
        node, commands = service.heartbeat(
            session,
            principal,
            node_id,
            body,
            settings.node_lost_after_s,
            token=token,
            peer=_peer(request),
            stops=stop_policy(settings),
            sync_alerts=sync_alert_policy(settings),
            record_progress=record_heartbeat_progress,
        )
        return _node(node).model_copy(update={"commands": commands})


@router.get("/nodes/{node_id}/events", operation_id="nodes-events")
def node_events(
    node_id: str, db: DbDep, principal: PrincipalDep, limit: Annotated[int, Query(ge=1, le=1000)] = 200
) -> dict[str, list[NodeEventOut]]:
    """Every keep-alive and shutdown decision about the node, newest first, with its reason."""
    with db.transaction() as (session, _pending):
        node = service.get_node(session, principal, node_id)
        events = list_events(session, node, limit)
        return {"items": [NodeEventOut.model_validate(e, from_attributes=True) for e in events]}


@router.post(
    "/nodes/{node_id}/calibrations", operation_id="nodes-calibrate", status_code=202, response_model=CalibrationOut
)
def request_calibration(node_id: str, body: CalibrationRequest, db: DbDep, principal: PrincipalDep) -> CalibrationOut:
    with db.transaction() as (session, _pending):
        return _calibration(service.request_calibration(session, principal, node_id, body, plans=STORED_PLANS))


@router.post(
    "/nodes/{node_id}/calibrations/next",
    operation_id="nodes-claim-calibration",
    response_model=None,
    responses=NODE_AUTH,
)
def claim(
    node_id: str, db: DbDep, principal: PrincipalDep, response: Response, token: NodeTokenDep = None
) -> CalibrationOut | None:
    """For the node's agent: the next queued calibration, now running (204 when there is none)."""
    with db.transaction() as (session, _pending):
        claimed = service.claim_next(session, principal, node_id, token, plans=STORED_PLANS)
        if claimed is None:
            response.status_code = 204
            return None
        row, plan = claimed
        return _calibration(row, plan)


@router.post(
    "/calibrations/{calibration_id}/result",
    operation_id="calibrations-result",
    response_model=BenchmarkOut,
    responses=NODE_AUTH,
)
def result(
    calibration_id: str, body: CalibrationResult, db: DbDep, principal: PrincipalDep, token: NodeTokenDep = None
) -> BenchmarkOut:
    with db.transaction() as (session, _pending):
        return _benchmark(service.submit_result(session, principal, calibration_id, body, token, plans=STORED_PLANS))


@router.post(
    "/calibrations/{calibration_id}/failure",
    operation_id="calibrations-failure",
    response_model=CalibrationOut,
    responses=NODE_AUTH,
)
def failure(
    calibration_id: str, body: CalibrationFailure, db: DbDep, principal: PrincipalDep, token: NodeTokenDep = None
) -> CalibrationOut:
    with db.transaction() as (session, _pending):
        return _calibration(service.fail_calibration(session, principal, calibration_id, body.error, token))


@router.get("/benchmarks", operation_id="benchmarks-list", response_model=BenchmarkList)
def list_benchmarks(
    db: DbDep,
    principal: PrincipalDep,
    gpu: Annotated[str | None, Query(max_length=100)] = None,
    model: Annotated[str | None, Query(max_length=200)] = None,
    method: Annotated[str | None, Query(pattern="^(full|lora|qlora)$")] = None,
    limit: PageLimit = DEFAULT_LIMIT,
    before: PageCursor = None,
) -> BenchmarkList:
    """The organization's calibration results, newest first, a page at a time."""
    with db.transaction() as (session, _pending):
        rows, cursor = service.benchmarks_page(session, principal, gpu, model, method, limit, before)
        return BenchmarkList(items=[_benchmark(b) for b in rows], next_cursor=cursor)
