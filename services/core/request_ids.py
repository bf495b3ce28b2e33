"""The request id: one per API request, taken from the caller's ``X-Request-ID`` when it is a sane token,
else made here; sent back on the response, written in the access log line and carried by every log
record made while the request is served (``%(request_id)s``, "-" outside a request), so one plan can be
followed from the request through the log."""

from __future__ import annotations

import logging
import re
import uuid
from contextvars import ContextVar

HEADER = "x-request-id"
_ACCEPTED = re.compile(r"^[A-Za-z0-9._:-]{1,64}\Z")  # a caller's id is echoed only if it is this plain
current: ContextVar[str] = ContextVar("gpuplan_request_id", default="-")


def request_id(incoming: str | None) -> str:
    """The caller's id when it is 1-64 plain characters, else a new one (32 hex digits)."""
    if incoming and _ACCEPTED.match(incoming):
        return incoming
    return uuid.uuid4().hex


_factory = logging.getLogRecordFactory()


def _record(*args: object, **kwargs: object) -> logging.LogRecord:
    record = _factory(*args, **kwargs)
    record.request_id = current.get()
    return record


def install_log_records() -> None:
    """Every log record carries ``request_id`` (idempotent)."""
    if logging.getLogRecordFactory() is not _record:
        logging.setLogRecordFactory(_record)
