"""Abuse limits: a per-key request rate, failed sign-ins per client address, and per-organization quotas,
answered 429 with Retry-After.

- Rate: at most GPUPLAN_RATE_LIMIT_PER_MINUTE requests per key in each fixed one-minute window. The
  counters live in Redis when GPUPLAN_REDIS_URL is set (shared by every API process: INCR and EXPIRE
  on one key per key and window, the fixed-window counter of the Redis documentation's rate-limiting
  pattern, redis.io/docs/latest/commands/incr/#pattern-rate-limiter), and in this process otherwise.
  Should Redis fail, the request is let through and the failure logged: a limiter outage must not
  take the API down with it.
- Failed sign-ins: at most GPUPLAN_AUTH_FAILURES_PER_MINUTE requests with a missing, unknown or revoked
  key (API) or API key (the dashboard's sign-in form) per client address and minute; past that, the
  address is answered 429 before its key is even looked at, in the same counters.
- Quotas live with the rows they count (plans/service.py, datasets/service.py, nodes/service.py): each
  is checked in the transaction that creates the row, under the organization's row lock, so concurrent
  requests cannot all pass the same check (the API and the dashboard share them).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any, Protocol

from services.core.errors import TooManyRequests
from services.core.settings import Settings

log = logging.getLogger("gpuplan.limits")

WINDOW_S = 60


class CounterStore(Protocol):
    def hit(self, name: str, window_s: int, now_s: float) -> int:
        """Count one request under ``name`` in the current window; returns the count so far."""
        ...

    def peek(self, name: str, window_s: int, now_s: float) -> int:
        """The count under ``name`` in the current window, without counting."""
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

    def peek(self, name: str, window_s: int, now_s: float) -> int:
        with self._lock:
            return self._counts.get((name, int(now_s // window_s)), 0)


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

    def peek(self, name: str, window_s: int, now_s: float) -> int:
        value = self._client.get(f"gpuplan:rate:{name}:{int(now_s // window_s)}")
        return int(value or 0)


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


def check_failures(counters: CounterStore, address: str, limit_per_minute: int, now_s: float | None = None) -> None:
    """429 for a client address that failed to authenticate ``limit_per_minute`` times this minute (0: no
    limit), checked before its key is: a guesser learns nothing more until the window ends."""
    if limit_per_minute <= 0:
        return
    now_s = time.time() if now_s is None else now_s
    try:
        count = counters.peek(f"addr:{address}", WINDOW_S, now_s)
    except Exception as exc:
        log.warning("rate limiter unavailable (%s); request let through", exc)
        return
    if count >= limit_per_minute:
        retry = math.ceil(WINDOW_S - now_s % WINDOW_S)
        raise TooManyRequests(
            f"rate limit: {limit_per_minute} failed sign-ins per minute per client address; retry in {retry} s",
            retry_after_s=retry,
            field="authorization",
        )


def record_failure(counters: CounterStore, address: str, now_s: float | None = None) -> None:
    """Count one failed authentication from ``address``."""
    try:
        counters.hit(f"addr:{address}", WINDOW_S, time.time() if now_s is None else now_s)
    except Exception as exc:
        log.warning("rate limiter unavailable (%s); failure not counted", exc)
