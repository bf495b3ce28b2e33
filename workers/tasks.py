"""Thin Celery tasks over the services the API uses; each opens its own session and runs holding its
lease (services/core/leases.py), which beat's lease sweep watches."""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from services.core import tracing
from services.core.db import make_engine, make_sessionmaker
from services.core.leases import run_leased
from services.core.settings import get_settings
from services.core.tasks import CeleryRunner, PendingTasks, sweep_leases
from services.datasets import service as datasets_service
from services.datasets.service import CHECK_TASK, run_check
from services.nodes.lifecycle import SWEEP_TASK, run_sweep
from services.plans import service as plans_service
from services.plans.service import ESTIMATE_TASK, TRACE_TASK, resume_unfinished, run_plan, run_trace
from workers.celery_app import TASK_QUEUES, app, make_celery

LEASE_SWEEP_TASK = "gpuplan.tasks.sweep_leases"


@functools.cache
def _sessions() -> sessionmaker[Session]:
    engine = make_engine(get_settings().sqlalchemy_url)
    tracing.instrument_engine(engine, get_settings().otlp_endpoint)
    return make_sessionmaker(engine)


@functools.cache
def _runner() -> CeleryRunner:
    return CeleryRunner(make_celery(get_settings()), TASK_QUEUES)


def _leased(name: str, subject: str, fn: Any) -> None:
    run_leased(_sessions(), name, (subject,), fn, get_settings().task_lease_s)


@app.task(
    name=ESTIMATE_TASK,
    autoretry_for=(OperationalError,),
    retry_backoff=True,
    retry_backoff_max=60,
    max_retries=5,
)
def estimate_plan(plan_id: str) -> None:
    """Estimate a stored plan and store its recommendations (a finished plan is left as it is)."""
    settings = get_settings()
    _leased(
        ESTIMATE_TASK,
        plan_id,
        lambda pid: run_plan(
            _sessions(),
            pid,
            settings.safety_margin,
            settings.task_debug_delay_s,
            cpu_budget_s=settings.plan_cpu_budget_s,
            retries=settings.retry_policy(),
        ),
    )


@app.task(name=TRACE_TASK, soft_time_limit=900, time_limit=960)
def trace_plan(plan_id: str) -> None:
    """Run the precise trace of a stored plan (needs the trace extra on this worker)."""
    _leased(TRACE_TASK, plan_id, lambda pid: run_trace(_sessions(), pid, get_settings().retry_policy()))


@app.task(
    name=CHECK_TASK,
    autoretry_for=(OperationalError,),
    retry_backoff=True,
    retry_backoff_max=60,
    max_retries=5,
)
def check_dataset(dataset_id: str) -> None:
    """Check an uploaded data set, streamed from object storage (a finished check is left as it is)."""
    _leased(CHECK_TASK, dataset_id, lambda did: run_check(_sessions(), get_settings(), did))


@app.task(name=LEASE_SWEEP_TASK)
def sweep_task_leases() -> int:
    """Beat: send again every task whose lease expired (a dead worker, a message the broker lost or never
    got); a task that killed its worker task_max_deliveries times is recorded as failed. Returns resends."""
    factory = _sessions()
    hooks = (
        functools.partial(plans_service.give_up_abandoned, factory),
        functools.partial(datasets_service.give_up_abandoned, factory),
    )
    decisions = sweep_leases(factory, _runner(), get_settings(), hooks)
    return sum(1 for d in decisions if d.action == "resend")


@app.task(name="gpuplan.plans.resume_unfinished")
def resume_stale_plans() -> int:
    """Beat: re-enqueue plans still queued or running after stale_plan_after_s (a fallback for plans
    that hold no lease row, e.g. submitted before leases existed)."""
    pending = PendingTasks()
    count = resume_unfinished(_sessions(), pending, get_settings().stale_plan_after_s)
    for name, args in pending.items:
        app.send_task(name, args=list(args))
    return count


@app.task(name="gpuplan.catalog.refresh_feeds", soft_time_limit=600, time_limit=660)
def refresh_catalog_feeds() -> int:
    """Beat: refresh the configured live price feeds; a failed one keeps its last good prices. Returns
    the number of feeds refreshed."""
    from services.catalog.feeds.refresh import refresh

    return sum(1 for outcome in refresh(_sessions(), get_settings()) if outcome.ok)


@app.task(name=SWEEP_TASK)
def sweep_idle_nodes() -> int:
    """Beat: decide for every active node (keep, stop, lost) and stop the idle ones; returns stops."""
    return len(run_sweep(_sessions(), get_settings()).stopped)
