"""Routes whose whole request runs off the event loop (issue 21 item 1).

FastAPI parses a JSON body (``json.loads``), validates it against the route's pydantic models and
serializes the answer in the event loop's own thread, and an ``async def`` endpoint runs there too; only
a plain ``def`` endpoint is moved to a worker thread. A large body shaped to be slow (a config.json of
thousands of keys, a price list of thousands of rows) then stalls every other request of the process,
``/healthz`` included. An :class:`OffLoopRoute` reads the body on the loop (that is I/O) and runs all the
rest, from parsing to the rendered response, on a worker thread in an event loop of its own; the main
loop only waits for it. The thread holds the GIL while it computes, so the loop runs in the GIL's switch
intervals (1 ms under `gpuplan serve`, services/api/server.py).

Each request gets a fresh loop, so nothing created in it (FastAPI's exit stacks, anyio's worker
threads, which stop when that loop's root task ends) outlives the request or crosses loops.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from contextlib import AsyncExitStack
from typing import Any, TypeVar

import anyio
import anyio.to_thread
from fastapi import Request, Response
from fastapi.routing import APIRoute

# The exit stacks FastAPI keeps in the scope: its request wrapper opens them in the main loop, where the
# handler's dependencies would then be entered from the other loop; the worker loop opens its own.
_STACK_KEYS = ("fastapi_middleware_astack", "fastapi_inner_astack", "fastapi_function_astack")

Handler = Callable[[Request], Coroutine[Any, Any, Response]]
F = TypeVar("F", bound=Callable[..., Any])


def run_in_own_loop(handler: Handler, request: Request) -> Response:
    """Run ``handler(request)`` to its response in a new event loop in this (worker) thread."""
    scope = request.scope
    saved = {key: scope[key] for key in _STACK_KEYS if key in scope}

    async def main() -> Response:
        async with AsyncExitStack() as middleware, AsyncExitStack() as inner, AsyncExitStack() as function:
            scope.update(zip(_STACK_KEYS, (middleware, inner, function), strict=True))
            return await handler(request)

    try:
        return anyio.run(main)
    finally:
        for key in _STACK_KEYS:
            scope.pop(key, None)
        scope.update(saved)


def off_loop(endpoint: F) -> F:
    """Mark an endpoint without a body model (one that reads the raw body, or works hard) to run off the
    loop too. Put it under the route decorator."""
    endpoint.__dict__["gpuplan_off_loop"] = True
    return endpoint


class OffLoopRoute(APIRoute):
    """An APIRoute whose parsing, validation, endpoint and serialization run on a worker thread when it
    reads a JSON body into a model (its validation is the work a large body makes) or its endpoint is
    marked :func:`off_loop`. Other routes keep the plain handler (a plain ``def`` endpoint still runs on
    FastAPI's thread pool), and so do the streamed uploads, which must not be read whole first."""

    def get_route_handler(self) -> Handler:
        handler = super().get_route_handler()
        if self.body_field is None and not getattr(self.endpoint, "gpuplan_off_loop", False):
            return handler

        async def run_off_loop(request: Request) -> Response:
            await request.body()  # read here; FastAPI's handler reads the cached bytes
            return await anyio.to_thread.run_sync(run_in_own_loop, handler, request)

        return run_off_loop
