"""GPU nodes, calibration jobs and the benchmark results they produce (the calibration rule that
uses them is in services/nodes/calibration.py)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from services.catalog.gpus import find_gpu
from services.core.db import utcnow
from services.core.errors import Conflict, NotFound, Unprocessable
from services.estimator.errors import EstimatorError
from services.estimator.estimate import estimate, resolve_architecture
from services.estimator.recipe import resolve_recipe
from services.estimator.throughput import flops_per_token
from services.hub.service import request_data_with_config, stored_request
from services.nodes.lifecycle import after_heartbeat
from services.nodes.schemas import CalibrationRequest, CalibrationResult, Heartbeat, NodeRegistration
from services.nodes.tables import BenchmarkRow, CalibrationRow, NodeRow
from services.orgs.service import Principal
from services.plans.schemas import PlanRequest
from services.plans.service import get_plan


def register_node(session: Session, principal: Principal, body: NodeRegistration) -> NodeRow:
    gpu = "cpu"
    if body.gpu.strip().lower() != "cpu":
        try:
            gpu = find_gpu(body.gpu).name
        except EstimatorError as exc:
            raise Unprocessable(exc.message, field="gpu") from None
    node = NodeRow(
        organization_id=principal.organization_id,
        name=body.name,
        gpu=gpu,
        gpu_count=body.gpu_count,
        gpu_memory_gib=body.gpu_memory_gib,
        driver=body.driver,
        cuda=body.cuda,
        provider=body.provider,
        usd_per_hour=body.usd_per_hour,
        instance_id=body.instance_id,
        hostname=body.hostname,
        agent_pid=body.agent_pid,
        last_heartbeat_at=utcnow(),
        gpus=[],
        job_running=False,
        commands=[],
    )
    session.add(node)
    session.flush()
    return node


def get_node(session: Session, principal: Principal, node_id: str) -> NodeRow:
    node = session.scalar(
        select(NodeRow).where(NodeRow.id == node_id, NodeRow.organization_id == principal.organization_id)
    )
    if node is None:
        raise NotFound(f"no node {node_id!r}", field="id")
    return node


def list_nodes(session: Session, principal: Principal) -> Sequence[NodeRow]:
    return session.scalars(
        select(NodeRow).where(NodeRow.organization_id == principal.organization_id).order_by(NodeRow.created_at)
    ).all()


def heartbeat(
    session: Session,
    principal: Principal,
    node_id: str,
    body: Heartbeat,
    lost_after_s: float,
    now: datetime | None = None,
) -> tuple[NodeRow, list[str]]:
    """Store what the node reports, move its idle timer, record run progress; returns the node and the
    commands waiting for its agent (each delivered once)."""
    from services.runs.service import get_run, record_progress

    node = get_node(session, principal, node_id)
    node.gpus = [g.model_dump() for g in body.gpus]
    node.job_running = body.job_running
    node.uploading = body.uploading
    node.interactive_idle_s = body.interactive_idle_s
    node.unsynced_checkpoints = body.unsynced_checkpoints
    if body.progress is not None:
        run = get_run(session, principal, body.progress.run_id)
        if node.id not in run.node_ids:
            raise Unprocessable(f"node {node.id} is not part of run {run.id}", field="progress.run_id")
        record_progress(run, body.progress.step, body.progress.loss)
    after_heartbeat(session, node, now or utcnow(), lost_after_s)
    commands, node.commands = list(node.commands or []), []
    return node, commands


def request_calibration(
    session: Session, principal: Principal, node_id: str, body: CalibrationRequest
) -> CalibrationRow:
    node = get_node(session, principal, node_id)
    plan = get_plan(session, principal, body.plan_id)
    row = CalibrationRow(
        organization_id=principal.organization_id,
        node_id=node.id,
        plan_id=plan.id,
        status="queued",
        warmup_steps=body.warmup_steps,
        timed_steps=body.timed_steps,
    )
    session.add(row)
    session.flush()
    return row


def claim_next(session: Session, principal: Principal, node_id: str) -> tuple[CalibrationRow, dict[str, object]] | None:
    """The node's oldest queued calibration, now running, with the plan to run (None: nothing to do)."""
    node = get_node(session, principal, node_id)
    row = session.scalar(
        select(CalibrationRow)
        .where(CalibrationRow.node_id == node.id, CalibrationRow.status == "queued")
        .order_by(CalibrationRow.created_at)
        .limit(1)
        .with_for_update(skip_locked=True)
    )
    if row is None:
        return None
    row.status = "running"
    row.started_at = utcnow()
    plan = get_plan(session, principal, row.plan_id)
    return row, request_data_with_config(session, plan.request)


def _calibration(session: Session, principal: Principal, calibration_id: str) -> CalibrationRow:
    row = session.scalar(
        select(CalibrationRow).where(
            CalibrationRow.id == calibration_id, CalibrationRow.organization_id == principal.organization_id
        )
    )
    if row is None:
        raise NotFound(f"no calibration {calibration_id!r}", field="id")
    return row


def submit_result(session: Session, principal: Principal, calibration_id: str, body: CalibrationResult) -> BenchmarkRow:
    """Store what the node measured beside the prediction; a second report of a finished job is a 409."""
    row = _calibration(session, principal, calibration_id)
    if row.status != "running":
        raise Conflict(f"calibration {calibration_id} is {row.status}, not running", field="id")
    node = get_node(session, principal, row.node_id)
    request = stored_request(session, PlanRequest.model_validate(get_plan(session, principal, row.plan_id).request))
    plan = request.to_plan()
    name, arch = resolve_architecture(plan)
    predicted_mem = predicted_tps = mfu = utilisation = None
    if node.gpu != "cpu":
        spec = find_gpu(node.gpu)
        report = estimate(plan, spec)
        predicted_mem = report.memory.peak_allocated_gib
        predicted_tps = report.throughput.tokens_per_s if report.throughput else None
        per_gpu = body.tokens_per_s / max(plan.gpus, 1)
        fpt = flops_per_token(plan, arch, resolve_recipe(plan))
        peak = spec.dense_tflops(plan.precision) * 1e12
        mfu = fpt.model_flops * per_gpu / peak
        utilisation = fpt.hardware * per_gpu / peak
    bench = BenchmarkRow(
        organization_id=principal.organization_id,
        node_id=node.id,
        calibration_id=row.id,
        gpu=node.gpu,
        model_name=name,
        method=plan.method,
        plan=request.model_dump(mode="json", exclude_none=True),
        peak_allocated_gib=body.peak_allocated_gib,
        peak_reserved_gib=body.peak_reserved_gib,
        tokens_per_s=body.tokens_per_s,
        mfu=mfu,
        hardware_utilisation=utilisation,
        predicted_peak_allocated_gib=predicted_mem,
        predicted_tokens_per_s=predicted_tps,
        device=body.device,
    )
    session.add(bench)
    session.flush()
    row.status = "done"
    row.benchmark_id = bench.id
    row.finished_at = utcnow()
    return bench


def fail_calibration(session: Session, principal: Principal, calibration_id: str, error: str) -> CalibrationRow:
    row = _calibration(session, principal, calibration_id)
    if row.status != "running":
        raise Conflict(f"calibration {calibration_id} is {row.status}, not running", field="id")
    row.status = "failed"
    row.error = error
    row.finished_at = utcnow()
    return row


def list_benchmarks(
    session: Session, principal: Principal, gpu: str | None, model: str | None, method: str | None
) -> Sequence[BenchmarkRow]:
    query = select(BenchmarkRow).where(BenchmarkRow.organization_id == principal.organization_id)
    if gpu:
        try:
            query = query.where(BenchmarkRow.gpu == (gpu if gpu.lower() == "cpu" else find_gpu(gpu).name))
        except EstimatorError as exc:
            raise Unprocessable(exc.message, field="gpu") from None
    if model:
        query = query.where(BenchmarkRow.model_name == model)
    if method:
        query = query.where(BenchmarkRow.method == method)
    return session.scalars(query.order_by(BenchmarkRow.created_at.desc())).all()
