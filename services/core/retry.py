"""Transient faults of the database and Redis: what counts as one, and a bounded retry with backoff.

A dropped connection (a failover, ``pg_terminate_backend``), a serialization failure or a deadlock says
nothing about the work: the same work succeeds on a fresh connection. Such a fault must not fail a
plan or a data check for good; anything else (a bug, a bad input) is not retried.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from sqlalchemy.exc import DBAPIError, OperationalError

log = logging.getLogger("gpuplan.retry")

T = TypeVar("T")

# SQLSTATE classes PostgreSQL documents as safe to retry (Appendix A, "PostgreSQL Error Codes"):
# 40001 serialization_failure, 40P01 deadlock_detected; class 08 is a connection exception.
_RETRYABLE_SQLSTATES = frozenset(("40001", "40P01"))


def _sqlstate(exc: DBAPIError) -> str | None:
    orig = exc.orig
    state = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    return str(state) if state else None


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is a database or Redis fault that the same work survives on a new connection."""
    if isinstance(exc, DBAPIError):
        if exc.connection_invalidated or isinstance(exc, OperationalError):
            return True
        state = _sqlstate(exc)
        return state is not None and (state in _RETRYABLE_SQLSTATES or state.startswith("08"))
    try:
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import TimeoutError as RedisTimeoutError
    except ImportError:  # pragma: no cover - redis comes with celery[redis]
        return False
    return isinstance(exc, RedisConnectionError | RedisTimeoutError)


def describe(exc: BaseException) -> str:
    """One line for a person: the error's class and the first line of its message."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first[:200]}" if first else type(exc).__name__


def backoff_s(attempt: int, base_s: float, max_s: float) -> float:
    """Exponential backoff before retry ``attempt`` (1-based): base, 2 x base, 4 x base, ... capped."""
    return float(min(max_s, base_s * 2 ** (attempt - 1)))


def retry_transient(
    fn: Callable[[], T],
    *,
    attempts: int,
    base_s: float,
    max_s: float,
    on_retry: Callable[[int, BaseException], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Run ``fn``; on a transient fault wait and run it again, at most ``attempts`` times in all. The
    last transient fault (or any other error at once) is raised to the caller."""
    attempt = 1
    while True:
        try:
            return fn()
        except Exception as exc:
            if not is_transient(exc) or attempt >= attempts:
                raise
            log.warning("transient fault (attempt %d of %d): %s", attempt, attempts, describe(exc))
            if on_retry is not None:
                try:
                    on_retry(attempt, exc)
                except Exception as note_exc:  # the note is best effort: the database may still be down
                    log.warning("could not record the retry: %s", describe(note_exc))
            sleep(backoff_s(attempt, base_s, max_s))
            attempt += 1


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a task retries a transient fault (settings: transient_retry_*)."""

    attempts: int = 5
    base_s: float = 0.5
    max_s: float = 30.0

    def run(self, fn: Callable[[], T], on_retry: Callable[[int, BaseException], None] | None = None) -> T:
        return retry_transient(fn, attempts=self.attempts, base_s=self.base_s, max_s=self.max_s, on_retry=on_retry)


DEFAULT_RETRIES = RetryPolicy()
