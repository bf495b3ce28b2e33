"""Plans: submission, reading, and the estimation work that fills in estimate and recommendations."""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from services.catalog.service import catalog_offers
from services.core.db import once_more_if_raced, unit_of_work, utcnow
from services.core.errors import Conflict, GpuplanError, NotFound, TooManyRequests, Unprocessable, with_api_hint
from services.core.idempotency import idempotency_key as checked_idempotency_key
from services.core.leases import SweepDecision, held_after_releasing_dead
from services.core.retry import DEFAULT_RETRIES, RetryPolicy, describe, is_transient
from services.core.tasks import PendingTasks
from services.datasets.repository import DatasetRepository
from services.datasets.service import location_warnings, plan_data
from services.estimator.budget import CpuBudget
from services.estimator.errors import EstimatorError
from services.estimator.estimate import estimate
from services.estimator.plan import Plan
from services.estimator.reports import Estimate
from services.estimator.resolved import ResolvedPlan, resolve_architecture
from services.export import ExportBundle
from services.export.dataset import DEFAULT_DATA, DataFormat, data_format, data_format_of_report
from services.export.replan import export_retargeted, setup_for_format
from services.hub.service import (
    DbCache,
    ResolvedModel,
    checkpoint_note,
    filled_plan,
    model_of,
    resolved_with,
    with_model_config,
)
from services.nodes.calibration import calibrated_utilisation
from services.orgs import audit
from services.orgs.repository import OrganizationRepository
from services.orgs.service import Principal
from services.planner.models import Recommendation
from services.plans.recommend import recommend
from services.plans.repository import PlanListRow, PlanRepository
from services.plans.schemas import LENGTH_PERCENTILE_KEYS, PlanCreated, PlanOut, PlanRequest, PlanSummary
from services.plans.tables import PlanRow

log = logging.getLogger("gpuplan.plans")

ESTIMATE_TASK = "gpuplan.plans.estimate"
TRACE_TASK = "gpuplan.plans.trace"
# Where the trace and the analytic estimate differ by more than this, the trace is flagged so the
# analytic model can be improved (workers issue).
TRACE_DISAGREEMENT_PCT = 15.0


def resolved_plan(session: Session, request: PlanRequest) -> tuple[Plan, ResolvedModel | None]:
    """The request's plan with its named model's config.json filled in (bundled catalog, then the Hub
    config cache; a model first seen here is fetched from the Hub and cached)."""
    return with_model_config(request.to_plan(), DbCache(session))


def resolve_request(
    session: Session, request: PlanRequest, model: ResolvedModel | None = None
) -> tuple[ResolvedPlan, ResolvedModel | None]:
    """The request's plan resolved once (model config, architecture, recipe) for the work to hand down, with
    where its model came from; ``model``: what the caller's ``model_of`` found already."""
    plan = request.to_plan()
    model = model if model is not None else model_of(plan, DbCache(session))
    return resolved_with(plan, model), model


def _check_plannable(session: Session, request: PlanRequest, model: ResolvedModel | None = None) -> str:
    """Check now what would fail the background work later (an unknown model id, a model without an
    architecture, an inference plan), so it is a 422 at submission; returns the model's name. ``model``:
    the request's model as the endpoint resolved it (else resolved here)."""
    bare = request.to_plan()
    model = model if model is not None else model_of(bare, DbCache(session))
    plan = filled_plan(bare, model)
    if plan.model.generic is not None:
        raise Unprocessable(
            "model.generic: planning setups needs the model's architecture; give model.name or model.config "
            "(POST /v1/estimate sizes generic models)",
            field="model.generic",
        )
    if not plan.is_training:
        raise Unprocessable("mode: plans are training runs; size inference with POST /v1/estimate", field="mode")
    try:
        # Parsed once: the estimation task, in this process, finds it in the parse cache.
        name, _ = resolve_architecture(plan, model.catalog if model is not None else None)
    except EstimatorError as exc:
        raise Unprocessable(with_api_hint(str(exc), exc), field=exc.field) from None
    return name


def submit(
    session: Session,
    principal: Principal,
    request: PlanRequest,
    idempotency_key: str | None,
    pending: PendingTasks,
    plans_per_hour: int = 0,
    model: ResolvedModel | None = None,
) -> tuple[PlanRow, bool]:
    """Store a plan and enqueue its estimation; returns (row, created). A repeated Idempotency-Key with
    the same body returns the first plan; with a different body it is a conflict. A new plan counts
    against the organization's ``plans_per_hour`` quota (0: none), checked under its row lock. ``model``:
    the request's model as the caller resolved it before the transaction (``model_of``)."""
    OrganizationRepository(session).lock(principal.organization_id)
    if request.dataset_id is not None:
        request = with_dataset(session, principal.organization_id, request)
    if request.dataset is None and request.data is None:
        raise Unprocessable(
            "dataset: give the data set size, {'examples': N, 'avg_tokens': T} or {'tokens': N}, or the "
            "dataset_id of a checked data set, so time and cost can be planned",
            field="dataset",
        )
    repo = PlanRepository(session)
    body = request.model_dump(mode="json", exclude_none=True)
    if "safety_margin" not in request.constraints.model_fields_set:
        # Left to the server (GPUPLAN_SAFETY_MARGIN, services.plans.recommend): stored as 0.0 it read as the user's
        # own on every later reading, and the server's margin was ignored by the estimation and the quotes.
        body.get("constraints", {}).pop("safety_margin", None)
    idempotency_key = checked_idempotency_key(idempotency_key)
    if idempotency_key is not None:
        existing = repo.by_idempotency_key(principal.organization_id, idempotency_key)
        if existing is not None:
            if existing.request != body:
                raise Conflict("Idempotency-Key was already used with a different plan body", field="Idempotency-Key")
            return existing, False
    check_plans_per_hour(session, principal.organization_id, plans_per_hour)
    name = _check_plannable(session, request, model)
    row = repo.add(
        PlanRow(
            organization_id=principal.organization_id,
            status="queued",
            request=body,
            model_name=name,
            method=request.method,
            idempotency_key=idempotency_key,
        )
    )
    pending.enqueue(ESTIMATE_TASK, row.id)
    # One audit row per plan created, from the API or the dashboard (a replayed Idempotency-Key is not one).
    actor = f"key:{principal.key_prefix}" if principal.key_prefix else "key"
    audit.record(session, principal.organization_id, actor, "plan.create", f"plan:{row.id}", detail={"model": name})
    return row, True


def submit_idempotent(
    transaction: Callable[[], AbstractContextManager[tuple[Session, PendingTasks]]],
    principal: Principal,
    request: PlanRequest,
    idempotency_key: str | None,
    plans_per_hour: int = 0,
    model: ResolvedModel | None = None,
) -> tuple[PlanCreated, bool]:
    """:func:`submit` in its own transaction, safe under concurrent requests with one Idempotency-Key.

    Two requests with a new key both find no plan and both insert; the database's unique constraint
    (organization, key) lets one commit and fails the other with an IntegrityError. The loser runs
    again in a fresh transaction, where it finds the winner's plan: one plan, and every request
    answers with it (or 409 when its body differs).
    """

    def once() -> tuple[PlanCreated, bool]:
        with transaction() as (session, pending):
            row, created = submit(session, principal, request, idempotency_key, pending, plans_per_hour, model)
            return PlanCreated(id=row.id, status=row.status), created

    return once_more_if_raced(once, idempotency_key is not None)


def check_plans_per_hour(session: Session, organization_id: str, quota: int) -> None:
    """429 when the organization created ``quota`` plans in the last hour; Retry-After is when the
    oldest of them leaves the hour."""
    if quota <= 0:
        return
    since = utcnow() - timedelta(hours=1)
    recent = (
        select(PlanRow.created_at)
        .where(PlanRow.organization_id == organization_id, PlanRow.created_at >= since)
        .order_by(PlanRow.created_at.desc())
        .limit(quota)
        .subquery()
    )
    count, oldest = session.execute(select(func.count(), func.min(recent.c.created_at)).select_from(recent)).one()
    if count >= quota:
        retry = 1 if oldest is None else math.ceil((oldest + timedelta(hours=1) - utcnow()).total_seconds())
        raise TooManyRequests(
            f"quota: {quota} plans per hour per organization; retry in {max(retry, 1)} s",
            retry_after_s=retry,
            field="plans_per_hour",
        )


def with_dataset(session: Session, organization_id: str, request: PlanRequest) -> PlanRequest:
    """The request sized from its checked data set: examples and average tokens, and the recommended
    seq_len unless the request set one (404 for an unknown data set, 409 for one not checked yet)."""
    if request.dataset is not None or request.data is not None:
        raise Unprocessable(
            "dataset_id: the checked data set gives the size; leave out 'dataset' and 'data'", field="dataset_id"
        )
    data = plan_data(session, organization_id, str(request.dataset_id))
    fields = request.model_dump(mode="json", exclude_unset=True)
    fields["dataset"] = {
        "examples": data.examples,
        "avg_tokens": data.avg_tokens,
        **dict(zip(LENGTH_PERCENTILE_KEYS, data.length_percentiles, strict=True)),
    }
    if "seq_len" not in request.model_fields_set:
        fields["seq_len"] = data.recommended_seq_len
    return PlanRequest.model_validate(fields)


def get_plan(session: Session, principal: Principal, plan_id: str) -> PlanRow:
    row = PlanRepository(session).get_for_org(principal.organization_id, plan_id)
    if row is None:
        raise NotFound(f"no plan {plan_id!r}", field="id")
    return row


def list_plans(session: Session, principal: Principal, limit: int, before: str | None) -> list[PlanListRow]:
    return list(PlanRepository(session).list_for_org(principal.organization_id, limit, before))


def export(
    session: Session, principal: Principal, plan_id: str, fmt: str, index: int, data_format: str | None = None
) -> ExportBundle:
    """Export recommendation ``index`` of a done plan in format ``fmt``, planned again when the format runs
    another framework or sharding (services/export/replan.py), reading the rows in ``data_format`` or the
    format the data check found in the plan's data set."""
    row = get_plan(session, principal, plan_id)
    if row.status != "done":
        raise Conflict(f"plan {plan_id} is {row.status}; export a plan once it is done", field="id")
    recs = [Recommendation.model_validate(r) for r in row.recommendations or []]
    if not recs:  # "use 0..0" named an index that does not exist
        raise Unprocessable(
            "recommendation: the plan has no recommended setup to export; its rejections say why no setup fits",
            field="recommendation",
        )
    if index >= len(recs):
        raise Unprocessable(
            f"recommendation: the plan has {len(recs)} recommendation(s); use 0..{len(recs) - 1}",
            field="recommendation",
        )
    request = PlanRequest.model_validate(row.request)
    bare = request.to_plan()
    model = model_of(bare, DbCache(session))  # outside the try: a Hub failure keeps its own status
    # The margin the stored setups were sized with: usable = memory x (1 - margin).
    margin = round(1.0 - recs[index].usable_gib / recs[index].gpu_memory_gib, 6)
    offers = catalog_offers(session, principal.organization_id)
    utilisation = calibrated_utilisation(session, principal.organization_id, bare.method)

    try:
        data = _export_data_format(session, principal.organization_id, request, data_format)
        resolved = resolved_with(bare, model)

        def replan(target: Plan) -> list[Recommendation]:
            variant = resolved.variant(target)  # another framework, the same model: not resolved again
            found, _, _ = recommend(variant, request.constraints, offers, margin, utilisation=utilisation)
            return [Recommendation.model_validate(r) for r in found]

        return export_retargeted(setup_for_format(resolved, fmt, recs, replan, index), fmt, data)
    except EstimatorError as exc:
        raise Unprocessable(exc.message, field=exc.field) from None


def _export_data_format(session: Session, organization_id: str, request: PlanRequest, given: str | None) -> DataFormat:
    """The row format to export: as given, else the data check's of the plan's data set, else plain text."""
    if given is not None:
        return data_format(given, "data_format")
    if request.dataset_id is None:
        return DEFAULT_DATA
    dataset = DatasetRepository(session).get_for_org(organization_id, request.dataset_id)
    if dataset is None or dataset.report is None:
        raise Unprocessable(
            f"dataset_id: data set {request.dataset_id} has no check report; give data_format", field="dataset_id"
        )
    return data_format_of_report(dataset.report, dataset.name)


def request_trace(session: Session, principal: Principal, plan_id: str, pending: PendingTasks) -> PlanRow:
    """Queue the precise trace of a plan (one at a time; a finished trace is replaced)."""
    row = get_plan(session, principal, plan_id)
    if row.trace_status in ("queued", "running"):
        return row
    row.trace_status = "queued"
    pending.enqueue(TRACE_TASK, row.id)
    return row


def run_trace(factory: sessionmaker[Session], plan_id: str, retries: RetryPolicy = DEFAULT_RETRIES) -> None:
    """Trace a plan and store the result beside its analytic estimate; a transient database fault is
    retried with backoff, and the trace fails only after ``retries.attempts``."""
    try:
        retries.run(lambda: _run_trace_once(factory, plan_id))
    except Exception as exc:
        if not is_transient(exc):
            raise
        _store_trace(
            factory, plan_id, None, f"the database failed {retries.attempts} times; last error: {describe(exc)}"
        )


def _run_trace_once(factory: sessionmaker[Session], plan_id: str) -> None:
    with unit_of_work(factory) as session:
        row = PlanRepository(session).get(plan_id)
        if row is None or row.trace_status not in ("queued", "running"):
            return
        row.trace_status = "running"
        try:
            bare = PlanRequest.model_validate(row.request).to_plan()
            model = model_of(bare, DbCache(session))
            plan = filled_plan(bare, model)
        except GpuplanError as exc:
            row.trace = {"error": exc.message}
            row.trace_status = "failed"
            return
    try:
        from services.trace.tracer import TraceUnavailable, trace_plan
    except ImportError:
        _store_trace(
            factory, plan_id, None, "the trace extra (torch, transformers, peft) is not installed on the worker"
        )
        return
    try:
        # Resolved once here and handed to the trace; a plan the trace refuses (inference, generic) goes bare.
        result = trace_plan(resolved_with(bare, model) if plan.is_training and plan.model.generic is None else plan)
    except (TraceUnavailable, EstimatorError, ValueError) as exc:
        _store_trace(factory, plan_id, None, str(exc))
        return
    except Exception as exc:
        if is_transient(exc):
            raise
        log.exception("trace of plan %s failed", plan_id)
        _store_trace(factory, plan_id, None, f"internal error while tracing: {type(exc).__name__}")
        return
    data = dataclasses.asdict(result)
    data["flagged"] = abs(result.disagreement_pct) > TRACE_DISAGREEMENT_PCT
    if data["flagged"]:
        log.warning("plan %s: trace and analytic estimate differ by %.1f%%", plan_id, result.disagreement_pct)
    _store_trace(factory, plan_id, data, None)


def _store_trace(factory: sessionmaker[Session], plan_id: str, data: dict[str, Any] | None, error: str | None) -> None:
    with unit_of_work(factory) as session:
        row = PlanRepository(session).get(plan_id)
        if row is None:
            return
        row.trace = data if data is not None else {"error": error}
        row.trace_status = "done" if data is not None else "failed"


def trace_task(factory: sessionmaker[Session], retries: RetryPolicy = DEFAULT_RETRIES) -> Callable[[str], None]:
    def run(plan_id: str) -> None:
        run_trace(factory, plan_id, retries)

    return run


def to_out(row: PlanRow) -> PlanOut:
    return PlanOut(
        id=row.id,
        status=row.status,
        created_at=row.created_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        request=row.request,
        estimate=row.estimate,
        recommendations=row.recommendations or [],
        rejections=row.rejections or [],
        warnings=row.warnings or [],
        error=row.error,
        attempts=row.attempts or 0,
        trace_status=row.trace_status,
        trace=row.trace,
    )


def to_summary(row: PlanRow | PlanListRow) -> PlanSummary:
    """A list entry: a stored plan or a summary row (PlanRepository.list_for_org)."""
    return PlanSummary(
        id=row.id,
        status=row.status,
        model=row.model_name,
        method=row.method,
        created_at=row.created_at,
        cheapest=row.cheapest,
    )


def compute(
    session: Session,
    request: PlanRequest,
    safety_margin: float,
    organization_id: str,
    cpu_budget_s: float | None = None,
) -> dict[str, Any]:
    """The estimate and the planner's recommendations for a plan (pure work over the live catalog),
    with the organization's calibrated utilisation where its nodes measured the card and method, in at
    most ``cpu_budget_s`` of CPU time (WorkBudgetExceeded beyond it)."""
    plan, resolved = resolve_request(session, request)
    budget = CpuBudget(cpu_budget_s)
    report = estimate(plan, budget=budget)
    offers = catalog_offers(session, organization_id)
    utilisation = calibrated_utilisation(session, organization_id, plan.plan.method)
    recs, rejections, warnings = recommend(
        plan, request.constraints, offers, safety_margin, utilisation=utilisation, budget=budget
    )
    warnings = [*checkpoint_note(resolved), *warnings]
    if request.dataset_id is not None:
        try:
            data = plan_data(session, organization_id, request.dataset_id)
        except GpuplanError as exc:
            return _result(report, recs, rejections, [*warnings, f"data set warnings unavailable: {exc.message}"])
        countries = {(o.provider, o.region): o.country for o in offers}
        places = [(r["provider"], r["region"], countries.get((r["provider"], r["region"]), "")) for r in recs]
        warnings = [*warnings, *data.warnings, *location_warnings(data, places)]
    return _result(report, recs, rejections, warnings)


def _result(
    report: Estimate, recs: list[dict[str, Any]], rejections: list[dict[str, Any]], warnings: list[str]
) -> dict[str, Any]:
    return {
        "estimate": report.model_dump(mode="json"),
        "recommendations": recs,
        "rejections": rejections,
        # The estimate and the planner both warn of the plan's own assumptions (no LoRA settings, a seq_len
        # past the model's positions): each once.
        "warnings": list(dict.fromkeys([*report.warnings, *warnings])),
    }


def estimate_task(
    factory: sessionmaker[Session],
    safety_margin: float,
    cpu_budget_s: float | None = None,
    retries: RetryPolicy = DEFAULT_RETRIES,
) -> Callable[[str], None]:
    """The estimation task bound to this process's session factory."""

    def run(plan_id: str) -> None:
        run_plan(factory, plan_id, safety_margin, cpu_budget_s=cpu_budget_s, retries=retries)

    return run


def resume_unfinished(factory: sessionmaker[Session], pending: PendingTasks, stale_after_s: float = 0.0) -> int:
    """Re-enqueue plans left queued or running: at start in process (in-process tasks die with it), or
    by the beat for plans unfinished longer than ``stale_after_s`` (a lost message, a dead worker).
    A plan a live worker holds the lease of is left to it: with several API processes, one starting
    must not resume another's work in flight."""
    with unit_of_work(factory) as session:
        older_than = utcnow() - timedelta(seconds=stale_after_s) if stale_after_s else None
        held = held_after_releasing_dead(session, ESTIMATE_TASK)
        repo = PlanRepository(session)
        ids = [plan_id for plan_id in repo.unfinished_ids(older_than) if plan_id not in held]
        repo.requeue_running(ids)
    for plan_id in ids:
        pending.enqueue(ESTIMATE_TASK, plan_id)
    return len(ids)


def run_plan(
    factory: sessionmaker[Session],
    plan_id: str,
    safety_margin: float,
    debug_delay_s: float = 0.0,
    *,
    cpu_budget_s: float | None = None,
    retries: RetryPolicy = DEFAULT_RETRIES,
) -> None:
    """queued -> running -> done/failed. A retried or duplicated delivery of a finished plan does nothing.
    A plan whose search needs more than ``cpu_budget_s`` of CPU fails with a message naming what to narrow.
    A transient database fault is retried with backoff; the plan fails only after ``retries.attempts``."""
    try:
        retries.run(
            lambda: _run_plan_once(factory, plan_id, safety_margin, debug_delay_s, cpu_budget_s),
            on_retry=lambda attempt, exc: _note_retry(factory, plan_id, attempt, retries.attempts, exc),
        )
    except Exception as exc:
        if not is_transient(exc):
            raise
        _finish(
            factory,
            plan_id,
            error=f"the database failed {retries.attempts} times while estimating; last error: {describe(exc)}",
        )


def _run_plan_once(
    factory: sessionmaker[Session],
    plan_id: str,
    safety_margin: float,
    debug_delay_s: float,
    cpu_budget_s: float | None,
) -> None:
    with unit_of_work(factory) as session:
        row = PlanRepository(session).get(plan_id)
        if row is None or row.status in ("done", "failed"):
            return
        row.status = "running"
        row.started_at = utcnow()
        row.attempts = (row.attempts or 0) + 1
        request = PlanRequest.model_validate(row.request)
        organization_id = row.organization_id
    try:
        with unit_of_work(factory) as session:
            result = compute(session, request, safety_margin, organization_id, cpu_budget_s)
    except (EstimatorError, ValueError) as exc:
        _finish(factory, plan_id, error=str(exc))
        return
    except GpuplanError as exc:  # the model's config could not be fetched again (a Hub error)
        _finish(factory, plan_id, error=exc.message)
        return
    except Exception as exc:
        if is_transient(exc):
            raise  # retried by run_plan
        log.exception("plan %s failed", plan_id)
        _finish(factory, plan_id, error=f"internal error while estimating: {type(exc).__name__}")
        return
    if debug_delay_s:
        time.sleep(debug_delay_s)
    _finish(factory, plan_id, result=result)


def _note_retry(factory: sessionmaker[Session], plan_id: str, attempt: int, attempts: int, exc: BaseException) -> None:
    """Show why a running plan is taking longer: the fault of the attempt that is retried."""
    with unit_of_work(factory) as session:
        row = PlanRepository(session).get(plan_id)
        if row is not None and row.status == "running":
            row.error = f"attempt {attempt} of {attempts} met a transient fault, retrying: {describe(exc)}"


def _finish(
    factory: sessionmaker[Session], plan_id: str, *, result: dict[str, Any] | None = None, error: str | None = None
) -> None:
    with unit_of_work(factory) as session:
        row = PlanRepository(session).get(plan_id)
        if row is None or row.status in ("done", "failed"):
            return
        if result is not None:
            row.estimate = result["estimate"]
            row.recommendations = result["recommendations"]
            row.cheapest = (result["recommendations"] or [None])[0]
            row.rejections = result["rejections"]
            row.warnings = result["warnings"]
            row.status = "done"
        else:
            row.error = error
            row.status = "failed"
        row.finished_at = utcnow()


def give_up_abandoned(factory: sessionmaker[Session], decision: SweepDecision) -> None:
    """A lease sweep hook: a plan task delivered too often without finishing (each delivery killed its
    worker) is recorded as failed, so the plan does not stay running forever."""
    if decision.action != "abandon":
        return
    reason = f"the worker died {decision.deliveries} times while running this task; gave up"
    if decision.task_name == ESTIMATE_TASK:
        _finish(factory, decision.subject_id, error=reason)
    elif decision.task_name == TRACE_TASK:
        with unit_of_work(factory) as session:
            row = PlanRepository(session).get(decision.subject_id)
            if row is None or row.trace_status not in ("queued", "running"):
                return
        _store_trace(factory, decision.subject_id, None, reason)
