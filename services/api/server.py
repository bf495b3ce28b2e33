"""How `gpuplan serve` runs uvicorn: connection timeouts and a cap on connections (issue 21 item 7).

uvicorn closes an idle keep-alive connection (``timeout_keep_alive``) and answers 503 past
``limit_concurrency`` connections or requests, but it waits for ever for a client that sends its request
headers or body slowly (slowloris), so 20 such clients held 20 connections as long as they liked.
:class:`TimedHttpProtocol` adds the two missing timeouts to uvicorn's httptools protocol:

- header timeout: the request line and headers must be complete this many seconds after the connection
  opened, or after the previous response (nginx ``client_header_timeout``);
- body timeout: while a body is being read, at most this many seconds may pass between two reads of it
  (nginx ``client_body_timeout``), so a slow but steady upload is not cut off.

Past either, the client gets ``408 Request Timeout`` when no response has started, and the connection is
closed (the application sees ``http.disconnect``).
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from services.core import collector
from services.core.settings import Settings

if TYPE_CHECKING:
    from fastapi import FastAPI

# The work a request does on a worker thread holds the GIL; the event loop's thread gets it back at the
# switch interval (5 ms by default), several times for each request it answers. 1 ms halved the /healthz
# median beside two threads importing price lists (figures in docs/security.md, "Work and waiting").
GIL_SWITCH_INTERVAL_S = 0.001

_TIMEOUT_RESPONSE = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
    b"content-length: 24\r\n\r\nrequest took too long.\r\n"
)


@dataclass(frozen=True)
class HttpTimeouts:
    header_s: float
    body_s: float


class TimedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a header timeout and a body (between-reads) timeout."""

    timeouts: ClassVar[HttpTimeouts] = HttpTimeouts(header_s=15.0, body_s=30.0)  # configure() sets the settings

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._timed_out)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _timed_out(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self.cycle is None or not self.cycle.response_started:
            self.transport.write(_TIMEOUT_RESPONSE)
        self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.timeouts.header_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._arm(self.timeouts.body_s)

    def on_body(self, body: bytes) -> None:
        super().on_body(body)
        self._arm(self.timeouts.body_s)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm(self.timeouts.header_s)  # the next request's headers


def configure(settings: Settings) -> None:
    """Give the protocol this process's timeouts, and the GIL its switch interval (each uvicorn worker
    process builds its app, and so calls this, before it accepts a connection)."""
    TimedHttpProtocol.timeouts = HttpTimeouts(settings.http_header_timeout_s, settings.http_body_timeout_s)
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)


def settle(app: FastAPI) -> FastAPI:
    """After the app is built, the process's garbage collector settles (services.core.collector.settle): what the
    app built lives as long as the process and is frozen out of collections."""
    collector.settle()
    return app


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """The keyword arguments of ``uvicorn.run`` that bound connections."""
    return {
        "http": f"{TimedHttpProtocol.__module__}:{TimedHttpProtocol.__qualname__}",
        "timeout_keep_alive": settings.http_keep_alive_s,
        "limit_concurrency": settings.http_max_connections,
    }
