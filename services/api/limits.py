"""Abuse limits: a per-key request rate and per-organization quotas, answered 429 with Retry-After.

- Rate: at most GPUPLAN_RATE_LIMIT_PER_MINUTE requests per key in each fixed one-minute window. The
  counters live in Redis when GPUPLAN_REDIS_URL is set (shared by every API process: INCR and EXPIRE
  on one key per key and window, the fixed-window counter of the Redis documentation's rate-limiting
  pattern, redis.io/docs/latest/commands/incr/#pattern-rate-limiter), and in this process otherwise.
  Should Redis fail, the request is let through and the failure logged: a limiter outage must not
  take the API down with it.
- Quotas are counted from the stored rows themselves, so they hold across processes and restarts and
  a replayed or refused request costs nothing: plans created in the last hour, data sets stored and
  their bytes, nodes not stopped.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from datetime import timedelta
from typing import Any, Protocol

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from services.core.db import utcnow
from services.core.errors import TooManyRequests
from services.core.settings import Settings
from services.datasets.tables import DatasetRow
from services.nodes.tables import NodeRow
from services.plans.tables import PlanRow

log = logging.getLogger("gpuplan.limits")

WINDOW_S = 60
# The routes whose POST uses a quota (route templates).
QUOTA_ROUTES = frozenset({"/v1/plans", "/v1/datasets", "/v1/nodes"})


class CounterStore(Protocol):
    def hit(self, name: str, window_s: int, now_s: float) -> int:
        """Count one request under ``name`` in the current window; returns the count so far."""
        ...


class InProcessCounters:
    """Fixed-window counters in this process (the embedded default)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, int], int] = {}
        self._current_window = -1

    def hit(self, name: str, window_s: int, now_s: float) -> int:
        window = int(now_s // window_s)
        with self._lock:
            if window != self._current_window:  # drop the windows that have passed
                self._counts = {k: v for k, v in self._counts.items() if k[1] >= window}
                self._current_window = window
            count = self._counts.get((name, window), 0) + 1
            self._counts[(name, window)] = count
            return count


class RedisCounters:
    """Fixed-window counters in Redis, shared by every API process."""

    def __init__(self, url: str) -> None:
        import redis

        self._client: Any = redis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)

    def hit(self, name: str, window_s: int, now_s: float) -> int:
        window = int(now_s // window_s)
        key = f"gpuplan:rate:{name}:{window}"
        pipe = self._client.pipeline()
        pipe.incr(key)
        pipe.expire(key, window_s + 5)
        count, _ = pipe.execute()
        return int(count)


def make_counters(settings: Settings) -> CounterStore:
    return RedisCounters(settings.redis_url) if settings.redis_url else InProcessCounters()


def check_rate(counters: CounterStore, key_id: str, limit_per_minute: int, now_s: float | None = None) -> None:
    """429 once a key has made ``limit_per_minute`` requests in this minute (0: no limit)."""
    if limit_per_minute <= 0:
        return
    now_s = time.time() if now_s is None else now_s
    try:
        count = counters.hit(f"key:{key_id}", WINDOW_S, now_s)
    except Exception as exc:  # redis errors: fail open, loudly
        log.warning("rate limiter unavailable (%s); request let through", exc)
        return
    if count > limit_per_minute:
        retry = math.ceil(WINDOW_S - now_s % WINDOW_S)
        raise TooManyRequests(
            f"rate limit: {limit_per_minute} requests per minute per key; retry in {retry} s",
            retry_after_s=retry,
            field="authorization",
        )


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


def check_dataset_quota(session: Session, organization_id: str, settings: Settings, new_bytes: int = 0) -> None:
    """429 when the organization stores its quota of data sets, or ``new_bytes`` more would pass its byte quota."""
    count, stored = session.execute(
        select(func.count(), func.coalesce(func.sum(DatasetRow.size_bytes), 0)).where(
            DatasetRow.organization_id == organization_id
        )
    ).one()
    if settings.quota_datasets and count >= settings.quota_datasets:
        raise TooManyRequests(
            f"quota: {settings.quota_datasets} stored data sets per organization; delete one first",
            retry_after_s=3600,
            field="datasets",
        )
    if settings.quota_dataset_bytes and int(stored) + new_bytes > settings.quota_dataset_bytes:
        raise TooManyRequests(
            f"quota: {settings.quota_dataset_bytes:,} stored data set bytes per organization "
            f"({int(stored):,} stored, {new_bytes:,} asked)",
            retry_after_s=3600,
            field="size_bytes",
        )


def check_node_quota(session: Session, organization_id: str, quota: int) -> None:
    """429 when the organization has ``quota`` nodes that are not stopped."""
    if quota <= 0:
        return
    count = session.scalar(
        select(func.count()).where(
            NodeRow.organization_id == organization_id, NodeRow.status.not_in(("stopped", "replaced"))
        )
    )
    if (count or 0) >= quota:
        raise TooManyRequests(
            f"quota: {quota} nodes per organization; stop one first", retry_after_s=3600, field="nodes"
        )


def check_route_quota(session: Session, organization_id: str, method: str, route: str, settings: Settings) -> None:
    """The quota a request would use, by its route: creating plans, data sets or nodes."""
    if method != "POST":
        return
    if route == "/v1/plans":
        check_plans_per_hour(session, organization_id, settings.quota_plans_per_hour)
    elif route == "/v1/datasets":
        check_dataset_quota(session, organization_id, settings)
    elif route == "/v1/nodes":
        check_node_quota(session, organization_id, settings.quota_nodes)
