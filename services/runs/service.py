"""Runs: start tracking a plan's execution, record durable checkpoints, apply retention."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from services.catalog.gpus import find_gpu
from services.core.db import utcnow
from services.core.errors import Conflict, NotFound, Unprocessable
from services.core.pages import keyset_page
from services.core.settings import Settings
from services.estimator.estimate import estimate, resolve_architecture
from services.hub.service import stored_request
from services.nodes.schemas import RunProgress
from services.nodes.service import authenticate_node, get_node
from services.nodes.tables import NodeRow
from services.orgs.service import Principal
from services.planner.checkpoints import ScheduleInputs, checkpoint_schedule
from services.planner.costs import DEFAULT_PREEMPTION_PER_NODE_HOUR
from services.plans.schemas import PlanRequest
from services.plans.service import get_plan
from services.runs.manifest import checkpoint_layout
from services.runs.retention import RetentionPolicy, StoredCheckpoint, best_step, steps_to_delete
from services.runs.schemas import CheckpointOut, CheckpointReport, DurableAnswer, RunCreate, RunOut
from services.runs.tables import CheckpointRow, RunRow


def _step_seconds(request: PlanRequest, nodes: Sequence[NodeRow]) -> float | None:
    """The estimator's step time for the plan on the run's own cards (None on CPU-only nodes)."""
    gpu = nodes[0].gpu
    if gpu == "cpu":
        return None
    gpus = sum(max(n.gpu_count, 1) for n in nodes)
    plan = request.to_plan().model_copy(update={"gpus": gpus})
    report = estimate(plan, find_gpu(gpu))
    return report.throughput.step_seconds if report.throughput else None


def _schedule(row: RunRow, request: PlanRequest, nodes: Sequence[NodeRow], max_interval_s: float) -> dict[str, Any]:
    plan = request.to_plan()
    _name, arch = resolve_architecture(plan)
    inputs = ScheduleInputs(
        upload_bytes_per_s=row.upload_bytes_per_s or row.schedule.get("upload_bytes_per_s", 100e6),
        upload_measured=row.upload_bytes_per_s is not None,
        spot=row.spot,
        preemptions_per_node_hour=row.preemptions_per_node_hour,
        nodes=len(nodes),
        gpus=sum(max(n.gpu_count, 1) for n in nodes),
        step_seconds=_step_seconds(request, nodes),
        max_interval_s=max_interval_s,
    )
    schedule = checkpoint_schedule(
        plan, arch, inputs, RetentionPolicy.model_validate(row.retention), checkpoint_layout(row.prefix)
    )
    return schedule.model_dump(mode="json")


def create_run(session: Session, principal: Principal, plan_id: str, body: RunCreate, settings: Settings) -> RunRow:
    plan = get_plan(session, principal, plan_id)
    nodes = [_body_node(session, principal, node_id, "node_ids") for node_id in body.node_ids]
    if len({n.gpu for n in nodes}) > 1:
        raise Unprocessable("node_ids: the nodes of one run must have the same GPU model", field="node_ids")
    bucket = body.bucket or settings.s3_bucket
    if not bucket:
        raise Unprocessable("no bucket: give 'bucket' or set GPUPLAN_S3_BUCKET on the server", field="bucket")
    request = stored_request(session, PlanRequest.model_validate(plan.request))
    row = RunRow(
        organization_id=principal.organization_id,
        plan_id=plan.id,
        node_ids=list(body.node_ids),
        status="active",
        bucket=bucket,
        prefix="",
        checkpoint_dir=body.checkpoint_dir,
        spot=body.spot,
        preemptions_per_node_hour=(
            body.preemptions_per_node_hour
            if body.preemptions_per_node_hour is not None
            else request.constraints.preemptions_per_hour
            if request.constraints.preemptions_per_hour is not None
            else DEFAULT_PREEMPTION_PER_NODE_HOUR
        ),
        upload_bytes_per_s=None,
        schedule={"upload_bytes_per_s": (body.upload_mb_per_s or 100.0) * 1e6},
        retention=body.retention.model_dump(mode="json"),
    )
    session.add(row)
    session.flush()  # the id names the default prefix
    row.prefix = run_prefix(principal.organization_id, row.id, body.prefix, shared=bucket == settings.s3_bucket)
    # Two runs in one prefix share their step keys: the second one's sync failed at the first step the other had made
    # durable, and each run's retention deleted the other's objects at a shared step.
    clash = session.scalar(
        select(RunRow.id).where(
            RunRow.organization_id == principal.organization_id,
            RunRow.bucket == bucket,
            RunRow.prefix == row.prefix,
            RunRow.id != row.id,
        )
    )
    if clash is not None:
        raise Conflict(
            f"run {clash} already keeps its checkpoints in s3://{bucket}/{row.prefix}; give this run another prefix",
            field="prefix",
        )
    row.schedule = _schedule(row, request, nodes, body.max_interval_minutes * 60)
    row.schedule["max_interval_s"] = body.max_interval_minutes * 60
    row.schedule["idle"] = {"idle_minutes": body.idle_minutes, "gpu_busy_pct": body.gpu_busy_pct}
    for node in nodes:
        _attach(row, node)
    return row


def run_prefix(organization_id: str, run_id: str, given: str | None, *, shared: bool) -> str:
    """Where a run's checkpoints go in its bucket. In the server's shared bucket every organization has its
    own namespace, ``orgs/<organization id>/``, so no prefix another organization chooses can name this
    one's objects; in a bucket of the organization's own, the prefix it gives is used as given."""
    chosen = given if given is not None else f"runs/{run_id}"
    return f"orgs/{organization_id}/{chosen}" if shared else chosen


def _attach(run: RunRow, node: NodeRow) -> None:
    node.run_id = run.id
    idle = run.schedule.get("idle", {})
    node.idle_minutes = float(idle.get("idle_minutes", node.idle_minutes))
    node.gpu_busy_pct = float(idle.get("gpu_busy_pct", node.gpu_busy_pct))


def join_run(session: Session, principal: Principal, run_id: str, node_id: str, token: str | None) -> RunRow:
    """A node's agent joins a run with its node token (what `gpuplan agent --run` does at start); joining
    twice is harmless."""
    run = get_run(session, principal, run_id)
    node = _body_node(session, principal, node_id, "node_id", authenticate=True, token=token)
    if node.id not in run.node_ids:
        first = session.get(NodeRow, run.node_ids[0]) if run.node_ids else None
        if first is not None and first.gpu != node.gpu:
            raise Unprocessable(f"node_id: the run's nodes have {first.gpu}, this node has {node.gpu}", field="node_id")
        run.node_ids = [*run.node_ids, node.id]
    _attach(run, node)
    return run


def _body_node(
    session: Session,
    principal: Principal,
    node_id: str,
    field: str,
    *,
    authenticate: bool = False,
    token: str | None = None,
) -> NodeRow:
    """A node the request body names (``authenticate``: proven by its token): one the organization does not have is a
    422 on that body field, not a 404 on 'id', a field the request does not have (the path names the plan or run)."""
    try:
        if authenticate:
            return authenticate_node(session, principal, node_id, token)
        return get_node(session, principal, node_id)
    except NotFound as exc:
        raise Unprocessable(f"{field}: {exc.message}", field=field) from None


def get_run(session: Session, principal: Principal, run_id: str) -> RunRow:
    row = session.scalar(select(RunRow).where(RunRow.id == run_id, RunRow.organization_id == principal.organization_id))
    if row is None:
        raise NotFound(f"no run {run_id!r}", field="id")
    return row


def runs_page(
    session: Session, principal: Principal, plan_id: str | None, limit: int, before: str | None
) -> tuple[Sequence[RunRow], str | None]:
    """A page of the organization's runs (of one plan, if given), newest first."""
    query = select(RunRow).where(RunRow.organization_id == principal.organization_id)
    if plan_id:
        query = query.where(RunRow.plan_id == plan_id)
    return keyset_page(session, query, RunRow, limit, before)


def checkpoints(session: Session, run: RunRow) -> Sequence[CheckpointRow]:
    return session.scalars(
        select(CheckpointRow).where(CheckpointRow.run_id == run.id).order_by(CheckpointRow.step)
    ).all()


def _stored(rows: Sequence[CheckpointRow]) -> list[StoredCheckpoint]:
    # What the bucket may still hold: a checkpoint retention deleted is gone, not to be deleted again.
    return [StoredCheckpoint(r.step, r.status == "durable", r.metric, r.final) for r in rows if r.status != "deleted"]


def record_durable(session: Session, principal: Principal, run_id: str, body: CheckpointReport) -> DurableAnswer:
    """A checkpoint's manifest is in the bucket: record it, advance the last durable step, and answer
    which older checkpoints retention lets go. Reporting the same manifest twice is harmless."""
    run = get_run(session, principal, run_id)
    manifest = body.manifest
    if manifest.run_id != run.id:
        raise Unprocessable(f"the manifest belongs to run {manifest.run_id!r}, not {run.id!r}", field="manifest.run_id")
    existing = session.scalar(
        select(CheckpointRow).where(CheckpointRow.run_id == run.id, CheckpointRow.step == manifest.step)
    )
    data = manifest.model_dump(mode="json")
    if existing is None:
        session.add(
            CheckpointRow(
                organization_id=run.organization_id,
                run_id=run.id,
                step=manifest.step,
                status="durable",
                manifest=data,
                size_bytes=manifest.total_bytes,
                metric=manifest.metric,
                final=manifest.final,
            )
        )
    elif existing.status == "deleted":
        raise Conflict(f"step {manifest.step} was deleted by retention; save a new checkpoint", field="manifest.step")
    elif existing.manifest["files"] != data["files"]:
        raise Conflict(f"step {manifest.step} is already durable with other files", field="manifest.step")
    else:
        # The same files again: a repeated report, or the manifest rewritten to mark it final.
        existing.final = existing.final or manifest.final
        existing.metric = manifest.metric if manifest.metric is not None else existing.metric
        # The stored manifest says what the row says: a repeat without the metric kept the row's metric and
        # stored a manifest without it (best_step rested on a metric its manifest no longer had).
        existing.manifest = {**data, "final": existing.final, "metric": existing.metric}
    session.flush()
    rows = checkpoints(session, run)
    durable = [r.step for r in rows if r.status == "durable"]
    run.last_durable_step = max(durable) if durable else None
    if body.upload_bytes_per_s is not None and existing is None:
        # The measured bandwidth replaces the assumption, and the interval follows it. A report of a step already
        # durable (a retry whose answer was lost, a manifest marked final) measured no new upload.
        previous = run.upload_bytes_per_s
        run.upload_bytes_per_s = (
            body.upload_bytes_per_s if previous is None else 0.5 * (previous + body.upload_bytes_per_s)
        )
        nodes = [n for n in (session.get(NodeRow, i) for i in run.node_ids) if n is not None]
        if nodes:
            max_interval_s = float(run.schedule.get("max_interval_s", 3600.0))
            schedule = _schedule(
                run,
                stored_request(session, PlanRequest.model_validate(get_plan(session, principal, run.plan_id).request)),
                nodes,
                max_interval_s,
            )
            run.schedule = {**run.schedule, **schedule, "max_interval_s": max_interval_s}
    policy = RetentionPolicy.model_validate(run.retention)
    return DurableAnswer(last_durable_step=run.last_durable_step, delete_steps=steps_to_delete(_stored(rows), policy))


def record_deleted(session: Session, principal: Principal, run_id: str, step: int) -> CheckpointRow:
    run = get_run(session, principal, run_id)
    row = session.scalar(select(CheckpointRow).where(CheckpointRow.run_id == run.id, CheckpointRow.step == step))
    if row is None:
        raise NotFound(f"run {run_id} has no checkpoint at step {step}", field="step")
    if row.status == "durable":
        newest = run.last_durable_step
        if newest is None or step >= newest:
            raise Conflict(f"step {step} is the newest durable checkpoint; it cannot be deleted", field="step")
        row.status = "deleted"
        row.deleted_at = utcnow()
    return row


def record_progress(run: RunRow, step: int | None, loss: float | None) -> None:
    if step is not None:
        run.progress_step = step
        run.progress_loss = loss
        run.progress_at = utcnow()


def record_heartbeat_progress(session: Session, principal: Principal, node: NodeRow, progress: RunProgress) -> None:
    """The run progress a node's heartbeat reports (services.nodes.service.heartbeat calls this): the node
    must be part of the run; a run id that names no run of the organization is a 422 on that field, the node
    being the resource the request names (it named ``id``: a probe of stop 50)."""
    try:
        run = get_run(session, principal, progress.run_id)
    except NotFound as exc:
        raise Unprocessable(f"progress.run_id: {exc.message}", field="progress.run_id") from None
    if node.id not in run.node_ids:
        raise Unprocessable(f"progress.run_id: node {node.id} is not part of run {run.id}", field="progress.run_id")
    record_progress(run, progress.step, progress.loss)


def to_out(session: Session, run: RunRow) -> RunOut:
    rows = checkpoints(session, run)
    policy = RetentionPolicy.model_validate(run.retention)
    return RunOut(
        id=run.id,
        plan_id=run.plan_id,
        node_ids=list(run.node_ids),
        status=run.status,
        bucket=run.bucket,
        prefix=run.prefix,
        checkpoint_dir=run.checkpoint_dir,
        spot=run.spot,
        schedule=run.schedule,
        last_durable_step=run.last_durable_step,
        best_step=best_step(_stored(rows), policy.metric_mode),
        progress_step=run.progress_step,
        progress_loss=run.progress_loss,
        progress_at=run.progress_at,
        upload_bytes_per_s=run.upload_bytes_per_s,
        created_at=run.created_at,
        checkpoints=[CheckpointOut.model_validate(r, from_attributes=True) for r in rows],
    )
