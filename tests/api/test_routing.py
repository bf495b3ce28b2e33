"""OffLoopRoute: which routes leave the event loop's thread, and that they still behave as FastAPI routes
(validation errors through the app's handlers, the body read once, dependencies)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Request
from pydantic import BaseModel

from services.api.errors import install_error_handlers
from services.api.routing import MOST_WORKER_LOOPS, OffLoopRoute, off_loop
from tests.conftest import bounded_test_client


class Body(BaseModel):
    n: int


def dependency() -> str:
    return "dep"


def _app() -> tuple[FastAPI, dict[str, int]]:
    loop_thread: dict[str, int] = {}
    app = FastAPI()
    install_error_handlers(app)
    router = APIRouter(route_class=OffLoopRoute)

    @app.get("/loop-thread")
    async def where_is_the_loop() -> dict[str, int]:
        loop_thread["id"] = threading.get_ident()
        return loop_thread

    @router.post("/with-body")
    async def with_body(body: Body, dep: Annotated[str, Depends(dependency)]) -> dict[str, Any]:
        return {"thread": threading.get_ident(), "name": threading.current_thread().name, "n": body.n, "dep": dep}

    @router.get("/without-body")
    async def without_body() -> dict[str, Any]:
        return {"thread": threading.get_ident()}

    @router.post("/raw")
    @off_loop
    async def raw(request: Request) -> dict[str, Any]:
        return {"thread": threading.get_ident(), "size": len(await request.body())}

    app.include_router(router)
    return app, loop_thread


def test_routes_with_a_body_or_marked_run_off_the_loop_and_others_on_it() -> None:
    app, loop_thread = _app()
    with bounded_test_client(app) as client:
        client.get("/loop-thread")
        loop = loop_thread["id"]
        answer = client.post("/with-body", json={"n": 3}).json()
        assert answer["thread"] != loop and answer["n"] == 3 and answer["dep"] == "dep"
        assert client.get("/without-body").json()["thread"] == loop
        raw = client.post("/raw", content=b"x" * 1000).json()
        assert raw["thread"] != loop and raw["size"] == 1000


def test_a_validation_error_off_the_loop_is_the_api_s_422() -> None:
    app, _ = _app()
    with bounded_test_client(app) as client:
        answer = client.post("/with-body", json={"n": "abc"})
        assert answer.status_code == 422
        assert answer.json()["message"].startswith("n: input should be a valid integer")


def test_off_loop_requests_share_a_few_long_lived_worker_loops() -> None:
    # Starting an event loop per request cost more than an estimate; the worker loops are started once.
    app, _ = _app()
    with bounded_test_client(app) as client:
        answers = [client.post("/with-body", json={"n": i}).json() for i in range(3 * MOST_WORKER_LOOPS)]
    assert [a["n"] for a in answers] == list(range(3 * MOST_WORKER_LOOPS))
    assert {a["name"] for a in answers} == {"gpuplan-off-loop"}
    assert len({a["thread"] for a in answers}) <= MOST_WORKER_LOOPS


def test_a_plain_endpoint_runs_in_its_worker_loop_and_a_slow_one_holds_up_no_other_request() -> None:
    # A plain def endpoint off the loop runs in the worker loop's own thread (not sent to yet another
    # thread), so a loop serves one such request at a time: the next request goes to an idle loop.
    app = FastAPI()
    router = APIRouter(route_class=OffLoopRoute)
    gate = threading.Event()

    @router.post("/plain")
    def plain(body: Body, dep: Annotated[str, Depends(dependency)]) -> dict[str, Any]:
        if body.n == 0:
            gate.wait(10)
        return {"name": threading.current_thread().name, "n": body.n, "dep": dep}

    app.include_router(router)
    with bounded_test_client(app) as client, ThreadPoolExecutor(1) as pool:
        slow = pool.submit(client.post, "/plain", json={"n": 0})
        time.sleep(0.3)  # it has taken a loop and waits there
        start = time.monotonic()
        fast = client.post("/plain", json={"n": 1}).json()
        waited_s = time.monotonic() - start
        held = not gate.is_set()
        gate.set()
        assert slow.result().json()["n"] == 0
    assert held and waited_s < 5
    assert fast == {"name": "gpuplan-off-loop", "n": 1, "dep": "dep"}
