"""Abuse limits: a per-key request rate, failed sign-ins per client address, and per-organization quotas,
answered 429 with Retry-After.

- Rate: at most GPUPLAN_RATE_LIMIT_PER_MINUTE requests per key in any 60 seconds: a moving window (the
  `limits` library's MovingWindowRateLimiter: each hit's time is kept, and a request is let through when
  fewer than the limit fall in the 60 s before it), so no burst of twice the limit straddles the edge of
  a fixed minute. The hits live in Redis when GPUPLAN_REDIS_URL is set (shared by every API process; the
  library's Lua scripts make each check-and-add atomic), and in this process otherwise (the same window,
  kept here: see :class:`InProcessCounters`). Should Redis
  fail, the request is let through and the failure logged: a limiter outage must not take the API down
  with it.
- Failed sign-ins: at most GPUPLAN_AUTH_FAILURES_PER_MINUTE requests with a missing, unknown or revoked
  key (API) or API key (the dashboard's sign-in form) per client address in any 60 seconds; past that,
  the address is answered 429 before its key is even looked at, in the same store.
- Quotas live with the rows they count (plans/service.py, datasets/service.py, nodes/service.py): each
  is checked in the transaction that creates the row, under the organization's row lock, so concurrent
  requests cannot all pass the same check (the API and the dashboard share them).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from typing import Protocol

from limits import RateLimitItemPerMinute
from limits.storage import Storage, storage_from_string
from limits.strategies import MovingWindowRateLimiter

from services.core.errors import TooManyRequests
from services.core.settings import Settings

log = logging.getLogger("gpuplan.limits")

WINDOW_S = 60
NAMESPACE = "gpuplan"


class Counters(Protocol):
    """Moving-window counts of named events (a key's requests, an address's failed sign-ins)."""

    def hit(self, name: str, limit_per_minute: int) -> bool:
        """Count one event under ``name`` if fewer than the limit fell in the last minute; False: refused."""
        ...

    def allows(self, name: str, limit_per_minute: int) -> bool:
        """Whether one more event under ``name`` would be within the limit (nothing counted)."""
        ...

    def retry_after_s(self, name: str, limit_per_minute: int) -> int:
        """Seconds until the oldest event of the window leaves it (at least 1)."""
        ...


class StorageCounters:
    """:class:`Counters` in a storage of the `limits` library (Redis)."""

    def __init__(self, storage: Storage) -> None:
        self.limiter = MovingWindowRateLimiter(storage)

    def hit(self, name: str, limit_per_minute: int) -> bool:
        return bool(self.limiter.hit(RateLimitItemPerMinute(limit_per_minute, namespace=NAMESPACE), name))

    def allows(self, name: str, limit_per_minute: int) -> bool:
        return bool(self.limiter.test(RateLimitItemPerMinute(limit_per_minute, namespace=NAMESPACE), name))

    def retry_after_s(self, name: str, limit_per_minute: int) -> int:
        stats = self.limiter.get_window_stats(RateLimitItemPerMinute(limit_per_minute, namespace=NAMESPACE), name)
        return max(1, min(WINDOW_S, math.ceil(stats.reset_time - time.time())))


class InProcessCounters:
    """:class:`Counters` in this process, the same moving window: per name, the times of its events in the last minute,
    oldest first.

    The library's MemoryStorage inserted each hit at the front of a list (a copy of the whole window:
    thousands of entries at a high limit) and started a Timer thread to expire entries about once per
    request; here a hit appends to a deque and expired times leave from its head as the name is next
    counted, so a request costs a few microseconds whatever the limit. Names whose window has emptied
    are dropped in a sweep every ``SWEEP_EVERY`` counts, so the table holds only recent names.
    """

    SWEEP_EVERY = 4096

    def __init__(self) -> None:
        self._events: dict[str, deque[float]] = {}
        self._lock = threading.Lock()
        self._until_sweep = self.SWEEP_EVERY

    def _window(self, name: str, now: float) -> deque[float] | None:
        """``name``'s events still in the window (an event counts while it is less than WINDOW_S old)."""
        events = self._events.get(name)
        if events is not None:
            edge = now - WINDOW_S
            while events and events[0] <= edge:
                events.popleft()
        return events

    def _sweep(self, now: float) -> None:
        self._until_sweep = self.SWEEP_EVERY
        for name in list(self._events):
            if not self._window(name, now):
                del self._events[name]

    def hit(self, name: str, limit_per_minute: int) -> bool:
        now = time.time()  # wall time, as the library and Redis keep (tests move it)
        with self._lock:
            self._until_sweep -= 1
            if self._until_sweep <= 0:
                self._sweep(now)
            events = self._window(name, now)
            if events is None:
                events = self._events[name] = deque()
            if len(events) >= limit_per_minute:
                return False
            events.append(now)
            return True

    def allows(self, name: str, limit_per_minute: int) -> bool:
        with self._lock:
            events = self._window(name, time.time())
            return events is None or len(events) < limit_per_minute

    def retry_after_s(self, name: str, limit_per_minute: int) -> int:
        now = time.time()
        with self._lock:
            events = self._window(name, now)
            # The oldest event that keeps the count at the limit leaves the window first.
            oldest = events[max(0, len(events) - limit_per_minute)] if events else now
        return max(1, min(WINDOW_S, math.ceil(oldest + WINDOW_S - now)))


def in_process_counters() -> Counters:
    return InProcessCounters()


def redis_counters(url: str) -> Counters:
    # The library's Redis storage: short timeouts, so a broker that hangs costs a request little.
    storage = storage_from_string(url, socket_timeout=0.5, socket_connect_timeout=0.5)
    assert isinstance(storage, Storage)  # a redis:// URL names the synchronous storage
    return StorageCounters(storage)


def make_counters(settings: Settings) -> Counters:
    return redis_counters(settings.redis_url) if settings.redis_url else in_process_counters()


def check_rate(counters: Counters, key_id: str, limit_per_minute: int) -> None:
    """429 once a key has made ``limit_per_minute`` requests in the last 60 seconds (0: no limit)."""
    if limit_per_minute <= 0:
        return
    name = f"key:{key_id}"
    try:
        allowed = counters.hit(name, limit_per_minute)
        retry = 0 if allowed else counters.retry_after_s(name, limit_per_minute)
    except Exception as exc:  # redis errors: fail open, loudly
        log.warning("rate limiter unavailable (%s); request let through", exc)
        return
    if not allowed:
        raise TooManyRequests(
            f"rate limit: {limit_per_minute} requests per minute per key; retry in {retry} s",
            retry_after_s=retry,
            field="authorization",
        )


def check_failures(counters: Counters, address: str, limit_per_minute: int) -> None:
    """429 for a client address that failed to authenticate ``limit_per_minute`` times in the last 60
    seconds (0: no limit), checked before its key is: a guesser learns nothing more until they age out."""
    if limit_per_minute <= 0:
        return
    name = f"addr:{address}"
    try:
        if counters.allows(name, limit_per_minute):
            return
        retry = counters.retry_after_s(name, limit_per_minute)
    except Exception as exc:
        log.warning("rate limiter unavailable (%s); request let through", exc)
        return
    raise TooManyRequests(
        f"rate limit: {limit_per_minute} failed sign-ins per minute per client address; retry in {retry} s",
        retry_after_s=retry,
        field="authorization",
    )


def record_failure(counters: Counters, address: str, limit_per_minute: int) -> None:
    """Count one failed authentication from ``address`` (counted up to the limit: past it, it is refused
    before authentication anyway)."""
    if limit_per_minute <= 0:
        return
    try:
        counters.hit(f"addr:{address}", limit_per_minute)
    except Exception as exc:
        log.warning("rate limiter unavailable (%s); failure not counted", exc)
