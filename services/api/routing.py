"""Routes whose whole request runs off the event loop (issue 21 item 1).

FastAPI parses a JSON body (``json.loads``), validates it against the route's pydantic models and
serializes the answer in the event loop's own thread, and an ``async def`` endpoint runs there too; only
a plain ``def`` endpoint is moved to a worker thread. A large body shaped to be slow (a config.json of
thousands of keys, a price list of thousands of rows) then stalls every other request of the process,
``/healthz`` included. An :class:`OffLoopRoute` reads the body on the loop (that is I/O) and runs all the
rest, from parsing to the rendered response, on a worker thread in an event loop of its own; the main
loop only waits for it. The thread holds the GIL while it computes, so the loop runs in the GIL's switch
intervals (1 ms under `gpuplan serve`, services/api/server.py).

The worker loops are long-lived threads per process, each running an anyio event loop: starting a loop
per request cost more than the estimate itself. Each request still opens its own FastAPI exit stacks in
the worker loop, so nothing a request enters crosses loops.

A worker loop's thread is already off the main loop, so an off-loop route's plain ``def`` endpoint (and
the API key dependency, services/api/deps.py) runs in it directly, with the response's validation: FastAPI
would send each of them to yet another worker thread and back, and those hand-overs, contending for the
GIL, cost more CPU than the estimate. A worker loop then serves one such request at a time, so requests
go to an idle loop, and more loops are started while all are busy, up to ``MOST_WORKER_LOOPS`` (past
that, to the least busy one): one slow body holds up at most the requests queued behind it on its loop,
and never the main loop.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import inspect
import threading
from collections.abc import Callable, Coroutine
from contextlib import AsyncExitStack
from typing import Any, TypeVar

import anyio
from fastapi import Request, Response
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool

from services.api.query import refuse_repeats, single_valued_query

# The exit stacks FastAPI keeps in the scope: its request wrapper opens them in the main loop, where the
# handler's dependencies would then be entered from the other loop; the worker loop opens its own.
_STACK_KEYS = ("fastapi_middleware_astack", "fastapi_inner_astack", "fastapi_function_astack")

Handler = Callable[[Request], Coroutine[Any, Any, Response]]
F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

# At most this many worker loops per process: as many requests computing at once (they share the GIL, so
# more would not answer sooner); anyio's own thread pool has 40 threads.
MOST_WORKER_LOOPS = 32

# Set in the worker loops' threads: code there may block (it holds up only its own loop).
_here = threading.local()


def on_worker_loop() -> bool:
    """Whether this thread is one of the worker loops'."""
    return bool(getattr(_here, "worker_loop", False))


async def run_blocking(function: Callable[..., T], *args: Any) -> T:
    """``function(*args)``, which may block: right here on a worker loop, on a worker thread otherwise."""
    if on_worker_loop():
        return function(*args)
    return await run_in_threadpool(function, *args)


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


class _Loop:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.busy = 0  # requests handed to it and not finished


class _WorkerLoops:
    """Daemon threads each running an anyio event loop, started as requests need them in each process (a
    process forked or spawned by the server starts its own)."""

    def __init__(self, most: int) -> None:
        self._most = most
        self._lock = threading.Lock()
        self._loops: list[_Loop] = []

    def _start(self) -> _Loop:
        ready = threading.Event()
        box: list[asyncio.AbstractEventLoop] = []

        async def serve() -> None:
            # anyio's run: its root task keeps the loop's worker threads alive between requests.
            _here.worker_loop = True
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
        return _Loop(box[0])

    def take(self) -> _Loop:
        """An idle loop, a new one while there are fewer than the most, else the least busy; counted busy
        until :meth:`done`."""
        with self._lock:
            chosen = next((loop for loop in self._loops if loop.busy == 0), None)
            if chosen is None and len(self._loops) < self._most:
                chosen = self._start()
                self._loops.append(chosen)
            if chosen is None:
                chosen = min(self._loops, key=lambda loop: loop.busy)
            chosen.busy += 1
            return chosen

    def done(self, loop: _Loop) -> None:
        with self._lock:
            loop.busy -= 1

    def started(self) -> int:
        return len(self._loops)


_LOOPS = _WorkerLoops(MOST_WORKER_LOOPS)


async def run_in_worker_loop(handler: Handler, request: Request) -> Response:
    """Run ``handler(request)`` to its response on a worker loop. Handing it over never blocks the caller's
    loop (``run_coroutine_threadsafe`` only schedules), which then just awaits the result; a cancelled wait
    cancels the request there."""
    loop = _LOOPS.take()
    future = asyncio.run_coroutine_threadsafe(_run_with_own_stacks(handler, request), loop.loop)
    # Counted done when it is done there (a cancelled wait here may leave it running a while).
    future.add_done_callback(lambda _: _LOOPS.done(loop))
    return await asyncio.wrap_future(future)


def _in_place(endpoint: Callable[..., Any]) -> Callable[..., Any]:
    """A plain ``def`` endpoint as a coroutine function that runs it in the calling thread (a worker loop's:
    see the module docstring); FastAPI reads the original's signature through ``__wrapped__``."""

    @functools.wraps(endpoint)
    async def run_here(**arguments: Any) -> Any:
        return await run_blocking(functools.partial(endpoint, **arguments))

    return run_here


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

    def __init__(self, path: str, endpoint: Callable[..., Any], **options: Any) -> None:
        super().__init__(path, endpoint, **options)
        if self._leaves_loop() and not inspect.iscoroutinefunction(endpoint):
            # Built again around the endpoint that runs in the worker loop's thread (same signature, name,
            # docstring and marks), so FastAPI neither sends it nor the response's validation elsewhere.
            super().__init__(path, _in_place(endpoint), **options)

    def _leaves_loop(self) -> bool:
        return self.body_field is not None or bool(getattr(self.endpoint, "gpuplan_off_loop", False))

    def get_route_handler(self) -> Handler:
        handler = super().get_route_handler()
        # Every API route is built with this class, so the check that a single-valued query parameter is
        # given once (services/api/query.py) is made here, for all of them, before the request is read.
        single = single_valued_query(self.dependant)
        leaves_loop = self._leaves_loop()

        async def run(request: Request) -> Response:
            refuse_repeats(request, single)
            if not leaves_loop:
                return await handler(request)
            await request.body()  # read here; FastAPI's handler reads the cached bytes
            return await run_in_worker_loop(handler, request)

        return run
