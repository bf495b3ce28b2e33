"""Thin Celery tasks over the services the API uses; each opens its own session."""

from __future__ import annotations

import functools

from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from services.core.db import make_engine, make_sessionmaker
from services.core.settings import get_settings
from services.core.tasks import PendingTasks
from services.datasets.service import CHECK_TASK, run_check
from services.nodes.lifecycle import SWEEP_TASK, run_sweep
from services.plans.service import ESTIMATE_TASK, TRACE_TASK, resume_unfinished, run_plan, run_trace
from workers.celery_app import app


@functools.cache
def _sessions() -> sessionmaker[Session]:
    return make_sessionmaker(make_engine(get_settings().sqlalchemy_url))


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
    run_plan(
        _sessions(),
        plan_id,
        settings.safety_margin,
        settings.task_debug_delay_s,
        cpu_budget_s=settings.plan_cpu_budget_s,
    )


@app.task(name=TRACE_TASK, soft_time_limit=900, time_limit=960)
def trace_plan(plan_id: str) -> None:
    """Run the precise trace of a stored plan (needs the trace extra on this worker)."""
    run_trace(_sessions(), plan_id)


@app.task(
    name=CHECK_TASK,
    autoretry_for=(OperationalError,),
    retry_backoff=True,
    retry_backoff_max=60,
    max_retries=5,
)
def check_dataset(dataset_id: str) -> None:
    """Check an uploaded data set, streamed from object storage (a finished check is left as it is)."""
    run_check(_sessions(), get_settings(), dataset_id)


@app.task(name="gpuplan.plans.resume_unfinished")
def resume_stale_plans() -> int:
    """Beat: re-enqueue plans that are still queued or running (a lost message, a dead worker)."""
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
