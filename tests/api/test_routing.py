"""OffLoopRoute: which routes leave the event loop's thread, and that they still behave as FastAPI routes
(validation errors through the app's handlers, the body read once, dependencies)."""

from __future__ import annotations

import threading
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.testclient import TestClient
from pydantic import BaseModel

from services.api.errors import install_error_handlers
from services.api.routing import WORKER_LOOPS, OffLoopRoute, off_loop


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
    with TestClient(app) as client:
        client.get("/loop-thread")
        loop = loop_thread["id"]
        answer = client.post("/with-body", json={"n": 3}).json()
        assert answer["thread"] != loop and answer["n"] == 3 and answer["dep"] == "dep"
        assert client.get("/without-body").json()["thread"] == loop
        raw = client.post("/raw", content=b"x" * 1000).json()
        assert raw["thread"] != loop and raw["size"] == 1000


def test_a_validation_error_off_the_loop_is_the_api_s_422() -> None:
    app, _ = _app()
    with TestClient(app) as client:
        answer = client.post("/with-body", json={"n": "abc"})
        assert answer.status_code == 422
        assert answer.json()["message"].startswith("n: input should be a valid integer")


def test_off_loop_requests_share_a_few_long_lived_worker_loops() -> None:
    # Starting an event loop per request cost more than an estimate; the worker loops are started once.
    app, _ = _app()
    with TestClient(app) as client:
        answers = [client.post("/with-body", json={"n": i}).json() for i in range(3 * WORKER_LOOPS)]
    assert [a["n"] for a in answers] == list(range(3 * WORKER_LOOPS))
    assert {a["name"] for a in answers} == {"gpuplan-off-loop"}
    assert len({a["thread"] for a in answers}) <= WORKER_LOOPS
