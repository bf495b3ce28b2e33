"""Request limits enforced before routing, parsing and authentication (issue 15.4, 15.5).

One pure ASGI middleware, outermost after Starlette's error handler:

- the body size: a declared ``Content-Length`` over the route's limit is answered 413 at once, without
  reading the body; a body streamed without one (chunked) is counted as it arrives and answered 413 as
  soon as it passes the limit. The limit is ``GPUPLAN_MAX_REQUEST_BYTES`` (1 MiB) everywhere except the
  routes that stream uploads and keep their own limits (data set parts and tokenizer, price lists);
- JSON bodies (and bodies sent without a Content-Type that parse as JSON, which FastAPI reads as
  JSON) are parsed once here with :mod:`services.core.json_limits`: malformed JSON gets a message
  with its line and column, and over-deep nesting, non-finite or huge numbers, NUL characters and
  lone surrogates are a 422 naming the field, before any handler, database or serializer sees them;
- text and form bodies, the path, the query parameters and header values may not carry a NUL
  character (Postgres text refuses it, which was a 500).

Refusals are JSON, except where ``refusal_page`` answers a page for the path (the dashboard's HTML pages).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

import anyio.to_thread
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.core.json_limits import JsonInputError, JsonSyntaxError, check_text
from services.core.json_limits import loads as load_json

_BODY_METHODS = frozenset(("POST", "PUT", "PATCH", "DELETE"))
# Bodies up to this size are checked in the loop's thread (about 6 ms at most); larger ones on a worker
# thread. A typical plan body is 0.6 KB.
INLINE_CHECK_BYTES = 64 * 1024


@dataclass(frozen=True)
class BodyLimit:
    """Routes (by method and path pattern) whose body limit differs from the global one.

    ``max_bytes`` None: the route reads its body as a stream and enforces its own limit (so the
    middleware neither buffers nor inspects it).
    """

    method: str
    path: re.Pattern[str]
    max_bytes: int | None
    why: str


# (path, status, message) -> the refusal as a page for a browser, or None for the API's JSON body.
RefusalPage = Callable[[str, int, str], Response | None]


class _Refused(Exception):
    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(body.get("message", ""))
        self.status = status
        self.body = body


def _invalid(field: str, message: str) -> _Refused:
    return _Refused(422, {"error": "invalid", "message": f"{field}: {message}", "field": field})


def _too_large(limit: int, detail: str) -> _Refused:
    return _Refused(
        413,
        {
            "error": "too_large",
            "message": f"body: {detail}; at most {limit:,} bytes are accepted here (GPUPLAN_MAX_REQUEST_BYTES)",
            "field": "body",
        },
    )


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return str(value.decode("latin-1"))
    return None


def _is_json(content_type: str | None) -> bool:
    if content_type is None:
        return True  # FastAPI reads a body without a Content-Type as JSON
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


class RequestLimits:
    """The ASGI middleware; see the module docstring."""

    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int,
        exceptions: Sequence[BodyLimit] = (),
        refusal_page: RefusalPage | None = None,
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.exceptions = tuple(exceptions)
        self.refusal_page = refusal_page

    def _limit(self, method: str, path: str) -> int | None:
        for rule in self.exceptions:
            if rule.method == method and rule.path.fullmatch(path):
                return rule.max_bytes
        return self.max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            self._check_path_and_query(scope)
            method = scope["method"]
            limit = self._limit(method, scope["path"])
            has_body = method in _BODY_METHODS or _header(scope, b"content-length") not in (None, "0")
            if limit is None or not has_body:
                await self.app(scope, receive, send)
                return
            body, disconnected = await self._read(scope, receive, limit)
            if len(body) > INLINE_CHECK_BYTES:
                # A checked parse costs about 90 ms per MB: off the event loop (issue 21 item 1).
                await anyio.to_thread.run_sync(self._check_body, scope, body)
            else:
                self._check_body(scope, body)
        except _Refused as refused:
            page = None
            if self.refusal_page is not None:
                page = self.refusal_page(scope["path"], refused.status, str(refused.body.get("message", "")))
            if page is None:
                await _send_json(send, refused.status, refused.body)
            else:
                if refused.status == 413:
                    page.headers["connection"] = "close"  # the rest of the body is not read
                await page(scope, receive, send)
            return
        if disconnected:
            return

        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    @staticmethod
    def _check_path_and_query(scope: Scope) -> None:
        try:
            check_text("path", scope["path"])
        except JsonInputError as exc:
            raise _invalid(exc.field, exc.message) from None
        for name, value in scope.get("headers", ()):
            if b"\x00" in value:  # e.g. an Idempotency-Key, stored in a text column
                raise _invalid(name.decode("latin-1"), "a header value may not contain a NUL byte")
        raw = scope.get("query_string", b"").decode("latin-1")
        if not raw:
            return
        for name, value in parse_qsl(raw, keep_blank_values=True, encoding="utf-8", errors="replace"):
            try:
                check_text(name, value)
                check_text("query", name)
            except JsonInputError as exc:
                raise _invalid(exc.field, exc.message) from None

    async def _read(self, scope: Scope, receive: Receive, limit: int) -> tuple[bytes, bool]:
        declared = _header(scope, b"content-length")
        if declared is not None:
            if not declared.strip().isdigit():
                raise _Refused(
                    400, {"error": "bad_request", "message": "Content-Length: not a number", "field": "Content-Length"}
                )
            if int(declared) > limit:
                raise _too_large(limit, f"Content-Length {int(declared):,} bytes is too large")
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return b"", True
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise _too_large(limit, f"more than {limit:,} bytes sent")
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks), False

    @staticmethod
    def _check_body(scope: Scope, body: bytes) -> None:
        if not body:
            return
        content_type = _header(scope, b"content-type")
        if _is_json(content_type):
            try:
                load_json(body)
                return
            except JsonSyntaxError as exc:
                # Without a Content-Type the route decides: FastAPI's JSON routes answer their own
                # (readable) error, and routes that read raw bodies (price lists) read it as text.
                if content_type is not None:
                    raise _invalid(exc.field, exc.message) from None
            except JsonInputError as exc:
                raise _invalid(exc.field, exc.message) from None
        media = (content_type or "").split(";", 1)[0].strip().lower()
        if media == "application/x-www-form-urlencoded":
            text = body.decode("latin-1")
            for name, value in parse_qsl(text, keep_blank_values=True, encoding="utf-8", errors="replace"):
                try:
                    check_text(name, value)
                except JsonInputError as exc:
                    raise _invalid(exc.field, exc.message) from None
        elif (content_type is None or media.startswith("text/")) and b"\x00" in body:
            raise _invalid("body", "contains a NUL byte, which no database text column stores")


async def _send_json(send: Send, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode("utf-8")
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode("ascii"))]
    if status == 413:
        headers.append((b"connection", b"close"))  # the rest of the body is not read
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})
