"""GPU nodes, calibration jobs and the benchmark results they produce (the calibration rule that
uses them is in services/nodes/calibration.py)."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import Select, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from services.catalog.gpus import find_gpu
from services.core.db import utcnow
from services.core.errors import Conflict, NotFound, TooManyRequests, Unauthorized, Unprocessable
from services.core.pages import keyset_page
from services.estimator.errors import EstimatorError
from services.estimator.estimate import UTILISATION_SEARCH, estimate, resolve_architecture, utilisation_reproducing
from services.estimator.plan import Plan
from services.estimator.recipe import resolve_recipe
from services.estimator.throughput import flops_per_token
from services.hub.service import request_data_with_config
from services.nodes.calibration import CALIBRATION_WINDOW, catalog_name, device_check, screen, used_values
from services.nodes.idle import StopPolicy, SyncAlertPolicy
from services.nodes.instance_ids import InstanceIdError, check_instance_id
from services.nodes.lifecycle import add_event, after_heartbeat, record_sync_health
from services.nodes.processes import connection_is_from, start_ticks
from services.nodes.schemas import CalibrationRequest, CalibrationResult, Heartbeat, NodeRegistration, RunProgress
from services.nodes.tables import BenchmarkRow, CalibrationRow, NodeEventRow, NodeInstanceRow, NodeRow
from services.orgs.repository import OrganizationRepository
from services.orgs.service import Principal

# Records a heartbeat's run progress (services.runs.service.record_heartbeat_progress).
ProgressRecorder = Callable[[Session, Principal, NodeRow, RunProgress], None]


class PlanSource(Protocol):
    """The stored plans a calibration runs (services.plans.stored.STORED_PLANS): plans sit above nodes, so
    the edges hand it in. Both raise NotFound when the organization has no such plan."""

    def request(self, session: Session, principal: Principal, plan_id: str) -> dict[str, Any]: ...

    def filled(self, session: Session, principal: Principal, plan_id: str) -> tuple[dict[str, Any], Plan]:
        """The request with its model's config filled in (as JSON) and the plan it describes."""
        ...


NODE_TOKEN_HEADER = "X-Node-Token"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class Peer:
    """Where a request came from (the client's TCP address) and the server port it reached."""

    host: str
    port: int
    server_port: int


def _claim_instance(
    session: Session, principal: Principal, body: NodeRegistration, driver: str, pattern: str | None
) -> None:
    """Check the id's format and tie the instance to the organization (first registration wins)."""
    try:
        check_instance_id(body.instance_id, driver, pattern)
    except InstanceIdError as exc:
        raise Unprocessable(str(exc), field="instance_id") from None
    claim = session.scalar(select(NodeInstanceRow).where(NodeInstanceRow.instance_id == body.instance_id))
    if claim is None:
        try:
            with session.begin_nested():  # a concurrent registration of the same id loses here, not with a 500
                session.add(
                    NodeInstanceRow(
                        organization_id=principal.organization_id, instance_id=body.instance_id, provider=body.provider
                    )
                )
        except IntegrityError:
            claim = session.scalar(select(NodeInstanceRow).where(NodeInstanceRow.instance_id == body.instance_id))
    if claim is not None and claim.organization_id != principal.organization_id:
        raise Conflict(f"instance {body.instance_id!r} is registered by another organization", field="instance_id")


def register_node(
    session: Session,
    principal: Principal,
    body: NodeRegistration,
    *,
    driver: str = "none",
    instance_id_pattern: str | None = None,
    quota: int = 0,
) -> tuple[NodeRow, str]:
    """Store the node and issue its agent token (returned here once; only its hash is kept).

    A provider instance belongs to the first organization that registers it; the same organization
    registering it again (an agent restarted) replaces its older nodes of that instance. A new node counts
    against the organization's ``quota`` of nodes not stopped (0: none), checked under its row lock."""
    OrganizationRepository(session).lock(principal.organization_id)
    gpu = "cpu"
    if body.gpu.strip().lower() != "cpu":
        try:
            gpu = find_gpu(body.gpu).name
        except EstimatorError as exc:
            raise Unprocessable(f"gpu: {exc.message}", field="gpu") from None
    nvml = catalog_name(body.nvml_gpu)
    if nvml is not None and gpu != nvml:
        # --gpu names a GPU NVML cannot tell; where NVML tells, the two must agree (issue 25).
        raise Unprocessable(
            f"gpu: NVML reports {body.nvml_gpu!r} ({nvml}), not {body.gpu!r}; name the GPU only where NVML cannot",
            field="gpu",
        )
    now = utcnow()
    if body.instance_id:
        _claim_instance(session, principal, body, driver, instance_id_pattern)
        older = session.scalars(
            select(NodeRow).where(
                NodeRow.organization_id == principal.organization_id,
                NodeRow.instance_id == body.instance_id,
                # "stopping" too: a stop with the provider that then fails would put the old row back to active, to
                # be stopped again on its stale idle data while the new agent works (a probe of stop 50); its answer
                # is not recorded on a replaced row (lifecycle.record_stop).
                NodeRow.status.in_(("active", "lost", "stop_failed", "stopping")),
            )
        ).all()
        for previous in older:
            previous.status = "replaced"
            previous.token_hash = None
            add_event(session, previous, "replaced", "the instance registered again (a new agent)", now)
    check_node_quota(session, principal.organization_id, quota)
    token = secrets.token_urlsafe(32)
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
        last_heartbeat_at=now,
        gpus=[],
        job_running=False,
        commands=[],
        token_hash=hash_token(token),
        gpu_nvml=body.nvml_gpu.strip(),
    )
    session.add(node)
    session.flush()
    return node, token


def check_node_quota(session: Session, organization_id: str, quota: int) -> None:
    """429 when the organization has ``quota`` nodes that are not stopped (under its row lock)."""
    if quota <= 0:
        return
    session.flush()  # nodes this registration replaced no longer count
    count = session.scalar(
        select(func.count()).where(
            NodeRow.organization_id == organization_id, NodeRow.status.not_in(("stopped", "replaced"))
        )
    )
    if (count or 0) >= quota:
        raise TooManyRequests(
            f"quota: {quota} nodes per organization; stop one first", retry_after_s=3600, field="nodes"
        )


def authenticate_node(session: Session, principal: Principal, node_id: str, token: str | None) -> NodeRow:
    """The organization's node, when the request carries the token its registration issued."""
    node = get_node(session, principal, node_id)
    if not token:
        raise Unauthorized(
            f"missing {NODE_TOKEN_HEADER}: a node's agent sends the token its registration returned",
            field=NODE_TOKEN_HEADER,
        )
    if node.token_hash is None or not hmac.compare_digest(node.token_hash, hash_token(token)):
        raise Unauthorized(f"wrong {NODE_TOKEN_HEADER} for node {node.id}", field=NODE_TOKEN_HEADER)
    return node


def _prove_pid(session: Session, node: NodeRow, pid: int, peer: Peer | None, at: datetime) -> None:
    """Keep the agent's pid only when this machine can see that the authenticated request came from it
    (a node on another host has no pid the server could signal; nothing is recorded for it)."""
    previous = (node.verified_pid, node.verified_pid_start_ticks)
    node.verified_pid = node.verified_pid_start_ticks = None
    if node.hostname != socket.gethostname():
        return
    ticks = start_ticks(pid)
    if peer is not None and ticks is not None and connection_is_from(pid, peer.host, peer.port, peer.server_port):
        node.verified_pid, node.verified_pid_start_ticks = pid, ticks
        if previous != (pid, ticks):
            add_event(session, node, "pid_verified", f"agent process {pid} proved itself with the node token", at)
        return
    last = session.scalar(
        select(NodeEventRow)
        .where(NodeEventRow.node_id == node.id, NodeEventRow.kind.in_(("pid_verified", "pid_refused")))
        .order_by(NodeEventRow.created_at.desc(), NodeEventRow.id.desc())
        .limit(1)
    )
    if last is None or last.kind != "pid_refused" or last.details.get("pid") != pid:
        reason = (
            f"agent pid {pid} not proven: the authenticated heartbeat did not come over a local connection held by "
            "that process; the local driver will not signal it"
        )
        add_event(session, node, "pid_refused", reason, at, {"pid": pid})


def get_node(session: Session, principal: Principal, node_id: str) -> NodeRow:
    node = session.scalar(
        select(NodeRow).where(NodeRow.id == node_id, NodeRow.organization_id == principal.organization_id)
    )
    if node is None:
        raise NotFound(f"no node {node_id!r}", field="id")
    return node


def list_nodes(session: Session, principal: Principal) -> Sequence[NodeRow]:
    """Every node of the organization, oldest first (the dashboard; the API pages them)."""
    query = select(NodeRow).where(NodeRow.organization_id == principal.organization_id)
    return session.scalars(query.order_by(NodeRow.created_at, NodeRow.id)).all()


def nodes_page(
    session: Session, principal: Principal, limit: int, before: str | None
) -> tuple[Sequence[NodeRow], str | None]:
    query = select(NodeRow).where(NodeRow.organization_id == principal.organization_id)
    return keyset_page(session, query, NodeRow, limit, before, newest_first=False)


def heartbeat(
    session: Session,
    principal: Principal,
    node_id: str,
    body: Heartbeat,
    lost_after_s: float,
    now: datetime | None = None,
    *,
    token: str | None,
    peer: Peer | None = None,
    stops: StopPolicy | None = None,
    sync_alerts: SyncAlertPolicy | None = None,
    record_progress: ProgressRecorder,
) -> tuple[NodeRow, list[str]]:
    """Store what the node's agent reports (with the node token), move its idle timer, record run
    progress and the sync's health; returns the node and the commands waiting for its agent (each delivered
    once). ``stops`` says how long a stopped node may still report before its stop counts as failed, and
    ``sync_alerts`` when a failing or lagging sync raises the node's alert (the settings'). The run's
    progress is recorded by ``record_progress`` (services.runs.service.record_heartbeat_progress): runs
    sit above nodes, so the edge hands it in."""
    node = authenticate_node(session, principal, node_id, token)
    at = now or utcnow()
    node.agent_verified_at = at
    if body.agent_pid is not None:
        _prove_pid(session, node, body.agent_pid, peer, at)
        node.agent_pid = body.agent_pid
    node.gpus = [g.model_dump() for g in body.gpus]
    node.job_running = body.job_running
    node.uploading = body.uploading
    node.interactive_idle_s = body.interactive_idle_s
    node.unsynced_checkpoints = body.unsynced_checkpoints
    if body.progress is not None:
        record_progress(session, principal, node, body.progress)
    record_sync_health(session, node, body.sync, at, sync_alerts or SyncAlertPolicy())
    after_heartbeat(session, node, at, lost_after_s, stops, body.heartbeat_interval_s)
    commands, node.commands = list(node.commands or []), []
    return node, commands


def request_calibration(
    session: Session, principal: Principal, node_id: str, body: CalibrationRequest, *, plans: PlanSource
) -> CalibrationRow:
    node = get_node(session, principal, node_id)
    try:
        plans.request(session, principal, body.plan_id)  # the plan must be the organization's
    except NotFound as exc:  # a body field: a 422 on it, not a 404 on 'id' (the path names the node)
        raise Unprocessable(f"plan_id: {exc.message}", field="plan_id") from None
    row = CalibrationRow(
        organization_id=principal.organization_id,
        node_id=node.id,
        plan_id=body.plan_id,
        status="queued",
        warmup_steps=body.warmup_steps,
        timed_steps=body.timed_steps,
    )
    session.add(row)
    session.flush()
    return row


def list_calibrations(session: Session, principal: Principal, limit: int = 20) -> Sequence[CalibrationRow]:
    """The organization's latest calibration jobs, newest first."""
    return session.scalars(
        select(CalibrationRow)
        .where(CalibrationRow.organization_id == principal.organization_id)
        .order_by(CalibrationRow.created_at.desc(), CalibrationRow.id.desc())
        .limit(limit)
    ).all()


def claim_next(
    session: Session, principal: Principal, node_id: str, token: str | None, *, plans: PlanSource
) -> tuple[CalibrationRow, dict[str, object]] | None:
    """The node's oldest queued calibration, now running, with the plan to run (None: nothing to do)."""
    node = authenticate_node(session, principal, node_id, token)
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
    return row, request_data_with_config(session, plans.request(session, principal, row.plan_id))


def _calibration(session: Session, principal: Principal, calibration_id: str) -> CalibrationRow:
    row = session.scalar(
        select(CalibrationRow).where(
            CalibrationRow.id == calibration_id, CalibrationRow.organization_id == principal.organization_id
        )
    )
    if row is None:
        raise NotFound(f"no calibration {calibration_id!r}", field="id")
    return row


def submit_result(
    session: Session,
    principal: Principal,
    calibration_id: str,
    body: CalibrationResult,
    token: str | None,
    *,
    plans: PlanSource,
) -> BenchmarkRow:
    """Store what the node measured beside the prediction; a second report of a finished job is a 409."""
    row = _calibration(session, principal, calibration_id)
    node = authenticate_node(session, principal, row.node_id, token)
    if row.status != "running":
        raise Conflict(f"calibration {calibration_id} is {row.status}, not running", field="id")
    request, plan = plans.filled(session, principal, row.plan_id)
    name, arch = resolve_architecture(plan)
    predicted_mem = predicted_tps = mfu = utilisation = gemm_utilisation = None
    met = True
    notes = list(body.notes)
    if node.gpu != "cpu" and body.comparable:
        spec = find_gpu(node.gpu)
        measured = measured_plan(plan, body.gpus)
        report = estimate(measured, spec)
        predicted_mem = report.memory.peak_allocated_gib
        predicted_tps = report.throughput.tokens_per_s if report.throughput else None
        per_gpu = body.tokens_per_s / body.gpus
        fpt = flops_per_token(measured, arch, resolve_recipe(measured))
        peak = spec.dense_tflops(measured.precision) * 1e12
        mfu = fpt.model_flops * per_gpu / peak
        utilisation = fpt.hardware * per_gpu / peak
        reproduced = utilisation_reproducing(measured, spec, per_gpu)
        if reproduced is not None:
            gemm_utilisation, met = reproduced
            if not met:
                side = "above" if gemm_utilisation >= UTILISATION_SEARCH[1] else "below"
                notes.append(
                    f"measured {per_gpu:.0f} tokens/s per GPU is {side} what the estimate gives at any GEMM "
                    f"utilisation from {UTILISATION_SEARCH[0]} to {UTILISATION_SEARCH[1]} (its other terms and "
                    f"floors bind); calibrated at {gemm_utilisation}"
                )
    verified, reason = device_check(node.gpu, node.gpu_count, node.gpu_nvml, body.device, body.gpus)
    if reason is None and not body.comparable:
        reason = "not comparable: the node could not run the plan as planned (see the notes)"
    if reason is None:
        others = used_values(session, principal.organization_id, plan.method, node.gpu).get(node.gpu, [])
        reason = screen(find_gpu(node.gpu), gemm_utilisation, met, others[:CALIBRATION_WINDOW])
    bench = BenchmarkRow(
        organization_id=principal.organization_id,
        node_id=node.id,
        calibration_id=row.id,
        gpu=node.gpu,
        model_name=name,
        method=plan.method,
        plan=request,
        peak_allocated_gib=body.peak_allocated_gib,
        peak_reserved_gib=body.peak_reserved_gib,
        tokens_per_s=body.tokens_per_s,
        mfu=mfu,
        hardware_utilisation=utilisation,
        gemm_utilisation=gemm_utilisation,
        predicted_peak_allocated_gib=predicted_mem,
        predicted_tokens_per_s=predicted_tps,
        device=body.device,
        measured_gpus=body.gpus,
        comparable=body.comparable,
        notes=notes,
        gpu_count=node.gpu_count,
        verified=verified,
        used=reason is None,
        unused_reason=reason,
    )
    session.add(bench)
    session.flush()
    row.status = "done"
    row.benchmark_id = bench.id
    row.finished_at = utcnow()
    return bench


def measured_plan(plan: Plan, gpus: int) -> Plan:
    """The plan as the calibration ran it: on ``gpus`` GPUs (the agent runs one, unsharded), so that the
    measured tokens/s, per GPU, meet the prediction for the same setup rather than the plan's N-GPU total;
    and on rows of exactly seq_len (the agent's synthetic batches), not the padded rows of the plan's data."""
    update: dict[str, object] = {"padding": "packed"}
    if gpus == 1 and plan.gpus != 1:
        update.update(gpus=1, sharding="none", cpu_offload=False)
    elif gpus != plan.gpus:
        update["gpus"] = gpus
    return plan.model_copy(update=update)


def fail_calibration(
    session: Session, principal: Principal, calibration_id: str, error: str, token: str | None
) -> CalibrationRow:
    row = _calibration(session, principal, calibration_id)
    authenticate_node(session, principal, row.node_id, token)
    if row.status != "running":
        raise Conflict(f"calibration {calibration_id} is {row.status}, not running", field="id")
    row.status = "failed"
    row.error = error
    row.finished_at = utcnow()
    return row


def list_benchmarks(
    session: Session, principal: Principal, gpu: str | None, model: str | None, method: str | None
) -> Sequence[BenchmarkRow]:
    return session.scalars(
        _benchmarks_query(principal, gpu, model, method).order_by(BenchmarkRow.created_at.desc())
    ).all()


def benchmarks_page(
    session: Session,
    principal: Principal,
    gpu: str | None,
    model: str | None,
    method: str | None,
    limit: int,
    before: str | None,
) -> tuple[Sequence[BenchmarkRow], str | None]:
    return keyset_page(session, _benchmarks_query(principal, gpu, model, method), BenchmarkRow, limit, before)


def _benchmarks_query(
    principal: Principal, gpu: str | None, model: str | None, method: str | None
) -> Select[BenchmarkRow]:
    query = select(BenchmarkRow).where(BenchmarkRow.organization_id == principal.organization_id)
    if gpu:
        try:
            query = query.where(BenchmarkRow.gpu == (gpu if gpu.lower() == "cpu" else find_gpu(gpu).name))
        except EstimatorError as exc:
            raise Unprocessable(f"gpu: {exc.message}", field="gpu") from None
    if model:
        query = query.where(BenchmarkRow.model_name == model)
    if method:
        query = query.where(BenchmarkRow.method == method)
    return query
