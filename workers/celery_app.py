"""The Celery application, configured from gpuplan's settings.

Tasks are acknowledged after they finish (acks_late). Every task holds a lease row in the database,
renewed while it runs; beat's lease sweep sends again a task whose lease expired (its worker died),
within task_lease_s + lease_sweep_interval_s, long before Redis's visibility timeout would redeliver
it. Arguments are ids and plain values; each task opens its own session and treats "already done" as
success, so a redelivery is harmless.
"""

from __future__ import annotations

from datetime import timedelta

from celery import Celery, signals

from services.core import collector, tracing
from services.core.settings import Settings, get_settings

# Only queues that carry a task: calibration runs and checkpoint syncs happen on the GPU nodes (their
# agent claims calibrations over the API and syncs to S3 itself), not in a Celery worker.
QUEUES = ("estimate", "trace", "maintenance", "datacheck")
# Stable task names (the API sends by name) and the queue each runs on.
TASK_QUEUES = {
    "gpuplan.plans.estimate": "estimate",
    "gpuplan.plans.trace": "trace",
    "gpuplan.plans.resume_unfinished": "maintenance",
    "gpuplan.tasks.sweep_leases": "maintenance",
    "gpuplan.nodes.sweep_idle": "maintenance",
    "gpuplan.datasets.check": "datacheck",
    "gpuplan.catalog.refresh_feeds": "maintenance",
}


def _feed_schedule(settings: Settings) -> dict[str, dict[str, object]]:
    """Refresh the live price feeds every GPUPLAN_CATALOG_REFRESH_INTERVAL_S (none configured: no entry)."""
    if not settings.feed_names:
        return {}
    return {
        "refresh-catalog-feeds": {
            "task": "gpuplan.catalog.refresh_feeds",
            "schedule": timedelta(seconds=settings.catalog_refresh_interval_s),
            # A refresh still queued when the next one is due is superseded by it.
            "options": {"expires": settings.catalog_refresh_interval_s},
        }
    }


def make_celery(settings: Settings) -> Celery:
    if settings.redis_url is None:
        raise RuntimeError("GPUPLAN_REDIS_URL is not set: the embedded default runs tasks in process")
    app = Celery("gpuplan", broker=settings.redis_url, include=["workers.tasks"])
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        result_backend=None,
        task_ignore_result=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_time_limit=settings.task_time_limit_s,
        task_soft_time_limit=max(1, settings.task_time_limit_s - 30),
        task_default_queue="estimate",
        task_routes={name: {"queue": queue} for name, queue in TASK_QUEUES.items()},
        broker_transport_options={"visibility_timeout": settings.task_visibility_timeout_s},
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        # Beat writes its schedule file after every task it sends: `gpuplan beat --check` reads its age.
        beat_sync_every=1,
        beat_schedule={
            **_feed_schedule(settings),
            "resume-unfinished-plans": {
                "task": "gpuplan.plans.resume_unfinished",
                "schedule": timedelta(minutes=5),
            },
            "sweep-task-leases": {
                "task": "gpuplan.tasks.sweep_leases",
                "schedule": timedelta(seconds=settings.lease_sweep_interval_s),
                "options": {"expires": settings.lease_sweep_interval_s},
            },
            "sweep-idle-nodes": {
                "task": "gpuplan.nodes.sweep_idle",
                "schedule": timedelta(seconds=settings.idle_sweep_interval_s),
                # A sweep older than its interval is superseded by the next one.
                "options": {"expires": settings.idle_sweep_interval_s},
            },
        },
    )
    return app


app = make_celery(get_settings()) if get_settings().redis_url else Celery("gpuplan")


@signals.worker_process_init.connect
def _trace_worker_process(**_: object) -> None:
    """Each pool process traces its tasks when GPUPLAN_OTLP_ENDPOINT is set (an SDK per process: the
    exporter's thread does not survive the fork)."""
    tracing.instrument_worker(get_settings().otlp_endpoint)


@signals.worker_process_init.connect
def _settle_worker_process(**_: object) -> None:
    """Each pool process settles its garbage collector as the API's processes do (services.core.collector)."""
    collector.settle()
