"""Routes whose whole request runs off the event loop (issue 21 item 1).

FastAPI parses a JSON body (``json.loads``), validates it against the route's pydantic models and
serializes the answer in the event loop's own thread, and an ``async def`` endpoint runs there too; only
a plain ``def`` endpoint is moved to a worker thread. A large body shaped to be slow (a config.json of
thousands of keys, a price list of thousands of rows) then stalls every other request of the process,
``/healthz`` included. An :class:`OffLoopRoute` reads the body on the loop (that is I/O) and runs all the
rest, from parsing to the rendered response, on a worker thread in an event loop of its own; the main
loop only waits for it. The thread holds the GIL while it computes, so the loop runs in the GIL's switch
intervals (1 ms under `gpuplan serve`, services/api/server.py).

The worker loops are a few long-lived threads per process, each running an anyio event loop: starting a
loop per request cost more than the estimate itself, and the loop's root task keeps anyio's worker threads
(where the plain ``def`` dependencies and endpoints run) alive between requests. Each request still opens
its own FastAPI exit stacks in the worker loop, so nothing a request enters crosses loops. Requests go
round-robin over the loops, so one slow body stalls at most the requests queued behind it on one of them,
never the main loop.
"""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import threading
from collections.abc import Callable, Coroutine
from contextlib import AsyncExitStack
from typing import Any, TypeVar

import anyio
from fastapi import Request, Response
from fastapi.routing import APIRoute

# The exit stacks FastAPI keeps in the scope: its request wrapper opens them in the main loop, where the
# handler's dependencies would then be entered from the other loop; the worker loop opens its own.
_STACK_KEYS = ("fastapi_middleware_astack", "fastapi_inner_astack", "fastapi_function_astack")

Handler = Callable[[Request], Coroutine[Any, Any, Response]]
F = TypeVar("F", bound=Callable[..., Any])


# Worker loops per process: more than one, so a slow body holds up only the requests behind it on its loop.
WORKER_LOOPS = 4


async def _run_with_own_stacks(handler: Handler, request: Request) -> Response:
    """``handler(request)`` in the worker loop, with FastAPI's exit stacks opened in that loop."""
    scope = request.scope
    saved = {key: scope[key] for key in _STACK_KEYS if key in scope}
    try:
        async with AsyncExitStack() as middleware, AsyncExitStack() as inner, AsyncExitStack() as function:
            scope.update(zip(_STACK_KEYS, (middleware, inner, function), strict=True))
            return await handler(request)
    finally:
        for key in _STACK_KEYS:
            scope.pop(key, None)
        scope.update(saved)


class _WorkerLoops:
    """Daemon threads each running an anyio event loop, started on first use in each process (a process
    forked or spawned by the server starts its own)."""

    def __init__(self, count: int) -> None:
        self._count = count
        self._lock = threading.Lock()
        self._loops: list[asyncio.AbstractEventLoop] = []
        self._next = itertools.count()

    def _start(self) -> asyncio.AbstractEventLoop:
        ready = threading.Event()
        box: list[asyncio.AbstractEventLoop] = []

        async def serve() -> None:
            # anyio's run: its root task keeps the loop's worker threads alive between requests.
            box.append(asyncio.get_running_loop())
            ready.set()
            await anyio.sleep_forever()

        # uvloop where it is installed (uvicorn[standard] brings it, and runs the main loop on it): each
        # hand-over to a worker thread and back costs less CPU on it (about 75 against 95 us).
        options = {"use_uvloop": importlib.util.find_spec("uvloop") is not None}
        threading.Thread(
            target=anyio.run, args=(serve,), kwargs={"backend_options": options}, name="gpuplan-off-loop", daemon=True
        ).start()
        ready.wait()
        return box[0]

    def loop(self) -> asyncio.AbstractEventLoop:
        if len(self._loops) < self._count:
            with self._lock:
                while len(self._loops) < self._count:
                    self._loops.append(self._start())
        return self._loops[next(self._next) % self._count]


_LOOPS = _WorkerLoops(WORKER_LOOPS)


async def run_in_worker_loop(handler: Handler, request: Request) -> Response:
    """Run ``handler(request)`` to its response on a worker loop. Handing it over never blocks the caller's
    loop (``run_coroutine_threadsafe`` only schedules), which then just awaits the result; a cancelled wait
    cancels the request there."""
    future = asyncio.run_coroutine_threadsafe(_run_with_own_stacks(handler, request), _LOOPS.loop())
    return await asyncio.wrap_future(future)


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
            return await run_in_worker_loop(handler, request)

        return run_off_loop
