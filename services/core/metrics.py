"""Prometheus metrics shared by the API, the task runners and the sweeps (prometheus_client's default
registry; with several processes, set PROMETHEUS_MULTIPROC_DIR and /metrics aggregates them, as in
prometheus.github.io/client_python/multiprocess/). Names follow Prometheus' naming guide: base
units (seconds), ``_total`` on counters."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

# Latency buckets from 1 ms to 10 s: POST /v1/estimate aims at p99 < 50 ms, list pages at a few ms.
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

HTTP_REQUESTS = Counter(
    "gpuplan_http_requests_total", "API requests by route template, method and status", ["method", "route", "status"]
)
HTTP_LATENCY = Histogram(
    "gpuplan_http_request_duration_seconds",
    "API request latency by route template and method",
    ["method", "route"],
    buckets=LATENCY_BUCKETS_S,
)
TASK_DURATION = Histogram(
    "gpuplan_task_duration_seconds",
    "background task run time by task name and outcome",
    ["task", "outcome"],
    buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600),
)
LEASE_EXPIRIES = Counter(
    "gpuplan_task_lease_expiries_total", "task leases that expired, by task and the state it was in", ["task", "state"]
)
SWEEP_DECISIONS = Counter(
    "gpuplan_sweep_decisions_total",
    "decisions of the lease sweep (resend, abandon) and the idle sweep (keep, stop, stop_failed, lost)",
    ["sweep", "decision"],
)
NODE_STOP_ATTEMPTS = Counter(
    "gpuplan_node_stop_attempts_total",
    "provider stop calls by driver and outcome (ok: the provider confirmed; error: it refused, failed or timed out)",
    ["driver", "outcome"],
)
NODE_STOPS_INEFFECTIVE = Counter(
    "gpuplan_node_stops_ineffective_total",
    "stops the provider confirmed after which the node kept heartbeating past the grace period",
)
NODE_STOPS_GIVEN_UP = Counter(
    "gpuplan_node_stop_failed_total", "nodes marked stop_failed: every stop attempt failed or changed nothing"
)
NODE_SYNC_ALERTS = Counter(
    "gpuplan_node_sync_alerts_total",
    "sync alerts raised: a node's sync passes kept failing, or its checkpoints stayed not durable, past the threshold",
    ["cause"],
)
RATE_LIMITED = Counter("gpuplan_rate_limited_total", "requests answered 429, by limit", ["limit"])


def serve_multiprocess_metrics(host: str, port: int) -> None:
    """A Celery worker's /metrics on ``host:port`` (GPUPLAN_WORKER_METRICS_PORT): the samples of all its
    pool processes, written under PROMETHEUS_MULTIPROC_DIR."""
    from prometheus_client import multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    start_http_server(port, addr=host, registry=registry)
