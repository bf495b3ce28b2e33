"""Observability at the edge: one pure-ASGI middleware that times every request, counts it by route
template and status (Prometheus), writes the access log line, and records the audit event of a
successful mutating node, run or catalog request; and GET /metrics in the Prometheus text format."""

from __future__ import annotations

import hmac
import logging
import os
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest
from sqlalchemy import func, select
from starlette.concurrency import run_in_threadpool

from services.api.deps import Database
from services.core import request_ids, tracing
from services.core.db import unit_of_work
from services.core.errors import Unauthorized
from services.core.leases import TaskLease
from services.core.metrics import HTTP_LATENCY, HTTP_REQUESTS, RATE_LIMITED
from services.core.settings import Settings
from services.nodes.tables import NodeRow
from services.orgs import audit
from services.orgs.service import Principal

access_log = logging.getLogger("gpuplan.access")
log = logging.getLogger("gpuplan.metrics")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# Mutating API calls that are actions worth an audit line (heartbeats and checkpoint reports are the
# agent's routine and stay out, or the log would be mostly them).
AUDITED_PREFIXES = ("/v1/nodes", "/v1/runs", "/v1/plans/{plan_id}/runs", "/v1/catalog", "/v1/calibrations")
NOT_AUDITED = frozenset({"nodes-heartbeat", "nodes-claim-calibration", "runs-checkpoint-durable"})


def _route_of(scope: Scope) -> tuple[str, str | None]:
    route = scope.get("route")
    if route is None:
        return "unmatched", None
    return str(getattr(route, "path", "unmatched")), getattr(route, "operation_id", None)


class ObservabilityMiddleware:
    def __init__(self, app: ASGIApp, db: Database) -> None:
        self.app = app
        self.db = db

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500
        incoming = next((v for k, v in scope.get("headers", []) if k == b"x-request-id"), b"")
        rid = request_ids.request_id(incoming.decode("latin-1"))
        scope.setdefault("state", {})["request_id"] = rid
        token = request_ids.current.set(rid)
        tracing.annotate_current_span(rid)

        async def capture(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"x-request-id"]
                message = {**message, "headers": [*headers, (b"x-request-id", rid.encode())]}
            await send(message)

        try:
            await self.app(scope, receive, capture)
        finally:
            elapsed_s = time.perf_counter() - started
            method = str(scope.get("method", ""))
            route, operation_id = _route_of(scope)
            HTTP_REQUESTS.labels(method, route, str(status)).inc()
            HTTP_LATENCY.labels(method, route).observe(elapsed_s)
            if status == 429:
                RATE_LIMITED.labels("api").inc()
            principal = (scope.get("state") or {}).get("principal")
            client = scope.get("client")
            addr = client[0] if client else None
            who = f"key:{principal.key_prefix}" if isinstance(principal, Principal) else "-"
            access_log.info(
                "%s %s %s %d %.1fms %s %s request_id=%s",
                addr or "-",
                method,
                scope.get("path", ""),
                status,
                elapsed_s * 1e3,
                who,
                route,
                rid,
            )
            if (
                isinstance(principal, Principal)
                and method in ("POST", "PUT", "PATCH", "DELETE")
                and status < 400
                and route.startswith(AUDITED_PREFIXES)
                and operation_id not in NOT_AUDITED
            ):
                await run_in_threadpool(self._audit, principal, operation_id or route, scope, addr)
            request_ids.current.reset(token)

    def _audit(self, principal: Principal, operation: str, scope: Scope, addr: str | None) -> None:
        params = scope.get("path_params") or {}
        target = ",".join(f"{k}:{v}" for k, v in sorted(params.items())) or None
        try:
            with unit_of_work(self.db.factory) as session:
                audit.record(
                    session,
                    principal.organization_id,
                    f"key:{principal.key_prefix}",
                    operation.replace("-", ".", 1),
                    target,
                    addr,
                    {"method": scope.get("method"), "path": scope.get("path")},
                )
        except Exception:  # the action is done; a lost audit line is logged, not turned into an error
            log.exception("could not record the audit event of %s", operation)


def _queue_depth(db: Database, settings: Settings) -> bytes:
    """Per-scrape gauges: task leases by state from the database, and each Celery queue's length."""
    registry = CollectorRegistry()
    leases = Gauge("gpuplan_task_leases", "background tasks holding a lease, by state", ["state"], registry=registry)
    with unit_of_work(db.factory) as session:
        rows = session.execute(select(TaskLease.status, func.count()).group_by(TaskLease.status)).all()
        counts = {str(status): int(count) for status, count in rows}
    for state in ("queued", "running", "abandoned"):
        leases.labels(state).set(counts.get(state, 0))
    _sync_gauges(db, registry)
    if settings.redis_url:
        depth = Gauge("gpuplan_queue_depth", "messages waiting in each Celery queue", ["queue"], registry=registry)
        try:
            import redis

            from workers.celery_app import QUEUES

            client: Any = redis.Redis.from_url(settings.redis_url, socket_timeout=0.5, socket_connect_timeout=0.5)
            for queue in QUEUES:
                depth.labels(queue).set(int(client.llen(queue)))
        except Exception as exc:  # the broker is down: say so through the missing series, not a 500
            log.warning("queue depth unavailable: %s", exc)
    return generate_latest(registry)


def _sync_gauges(db: Database, registry: CollectorRegistry) -> None:
    """Nodes whose checkpoint sync fails or has raised its alert, and the bytes not durable on live nodes
    (what losing them now would lose), over every organization: the operator's view."""
    live = NodeRow.status.in_(("active", "stopping", "stop_failed"))
    with unit_of_work(db.factory) as session:
        failing, alerted, pending = session.execute(
            select(
                func.count(NodeRow.sync_error),
                func.count(NodeRow.sync_alert),
                func.coalesce(func.sum(NodeRow.sync_pending_bytes), 0),
            ).where(live)
        ).one()
    Gauge("gpuplan_nodes_sync_failing", "live nodes whose last sync pass failed", registry=registry).set(failing)
    Gauge("gpuplan_nodes_sync_alert", "live nodes whose sync alert is raised", registry=registry).set(alerted)
    Gauge("gpuplan_unsynced_bytes", "bytes of checkpoints not durable yet on live nodes", registry=registry).set(
        int(pending)
    )


def _registry_text() -> bytes:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return generate_latest(registry)
    return generate_latest()


def install(app: FastAPI, db: Database, settings: Settings) -> None:
    app.add_middleware(ObservabilityMiddleware, db=db)

    @app.get("/metrics", operation_id="metrics-scrape", tags=["health"], response_class=PlainTextResponse)
    def metrics(request: Request) -> PlainTextResponse:
        """Prometheus metrics; when GPUPLAN_METRICS_TOKEN is set, send it as a Bearer token."""
        if settings.metrics_token is not None:
            expected = f"Bearer {settings.metrics_token.get_secret_value()}"
            given = request.headers.get("authorization") or ""
            if not hmac.compare_digest(given.encode(), expected.encode()):
                raise Unauthorized("metrics: send 'Authorization: Bearer <GPUPLAN_METRICS_TOKEN>'")
        body = _registry_text() + _queue_depth(db, settings)
        return PlainTextResponse(body, media_type=CONTENT_TYPE_LATEST)
