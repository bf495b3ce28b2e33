"""The request-limits middleware on raw ASGI messages: what clients like httpx never send."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.types import Message, Receive, Scope, Send

from services.api.middleware import RequestLimits


def _call(scope_extra: dict[str, Any], chunks: list[bytes]) -> tuple[int, dict[str, Any], bool]:
    reached = False

    async def app(_scope: Scope, receive: Receive, send: Send) -> None:
        nonlocal reached
        reached = True
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    pending = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
    sent: list[Message] = []

    async def receive() -> Message:
        return pending.pop(0) if pending else {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/plans", "query_string": b"", "headers": [], **scope_extra}
    asyncio.run(RequestLimits(app, max_bytes=1024)(scope, receive, send))
    body = json.loads(sent[1]["body"]) if not reached else {}
    return int(sent[0]["status"]), body, reached


def test_a_nul_byte_in_a_header_value_is_refused_naming_the_header() -> None:
    status, body, reached = _call({"headers": [(b"idempotency-key", b"a\x00b")]}, [b"{}"])
    assert (status, body["field"], reached) == (422, "idempotency-key", False)


def test_a_chunked_body_is_refused_as_it_passes_the_limit_without_reaching_the_app() -> None:
    status, body, reached = _call({"headers": [(b"content-type", b"application/json")]}, [b" " * 600] * 10)
    assert (status, reached) == (413, False) and "more than 1,024 bytes" in body["message"]


def test_a_declared_length_over_the_limit_is_refused_before_reading() -> None:
    status, _, reached = _call({"headers": [(b"content-length", b"5000000")]}, [])
    assert (status, reached) == (413, False)


def test_a_body_within_the_limit_is_replayed_to_the_app() -> None:
    status, _, reached = _call({"headers": [(b"content-type", b"application/json")]}, [b'{"a":', b" 1}"])
    assert (status, reached) == (200, True)
