"""The FastAPI application: routers of every domain, one error handler, the background runner."""

from __future__ import annotations

import functools
import logging
import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from sqlalchemy import text

from services.api.deps import Database
from services.api.errors import ErrorBody, install_error_handlers
from services.api.metrics import install as install_metrics
from services.api.middleware import BodyLimit, RequestLimits
from services.api.server import configure as configure_connections
from services.api.server import settle
from services.catalog.endpoints import MAX_PRICE_LIST_BYTES
from services.catalog.endpoints import router as catalog_router
from services.core import request_ids, tracing
from services.core.db import make_engine, make_sessionmaker
from services.core.settings import Settings, get_settings
from services.core.tasks import CeleryRunner, InProcessRunner, LeaseSweeper, PendingTasks
from services.dashboard.routes import install as install_dashboard
from services.dashboard.routes import refusal_page as dashboard_refusal_page
from services.datasets import service as datasets_service
from services.datasets.endpoints import router as datasets_router
from services.nodes.endpoints import router as nodes_router
from services.nodes.lifecycle import EmbeddedSweeper
from services.orgs.endpoints import router as keys_router
from services.plans.endpoints import router as plans_router
from services.plans.service import (
    ESTIMATE_TASK,
    TRACE_TASK,
    estimate_task,
    resume_unfinished,
    trace_task,
)
from services.plans.service import give_up_abandoned as plans_give_up
from services.quotes.endpoints import router as quotes_router
from services.runs.endpoints import router as runs_router


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    engine = make_engine(settings.sqlalchemy_url)
    factory = make_sessionmaker(engine)
    runner: InProcessRunner | CeleryRunner
    if settings.in_process_tasks:
        runner = InProcessRunner(
            settings.background_workers,
            {
                ESTIMATE_TASK: estimate_task(
                    factory, settings.safety_margin, settings.plan_cpu_budget_s, settings.retry_policy()
                ),
                TRACE_TASK: trace_task(factory, settings.retry_policy()),
                datasets_service.CHECK_TASK: datasets_service.check_task(factory, settings),
            },
            factory=factory,
            lease_s=settings.task_lease_s,
        )
    else:
        from workers.celery_app import TASK_QUEUES, make_celery

        runner = CeleryRunner(make_celery(settings), TASK_QUEUES)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        sweeper = None
        lease_sweeper = None
        if settings.in_process_tasks:
            pending = PendingTasks()
            resume_unfinished(factory, pending)
            datasets_service.resume_unfinished(factory, pending)
            pending.flush(runner)
            sweeper = EmbeddedSweeper(factory, settings)  # with Celery, beat runs the sweep
            sweeper.start()
            hooks = (
                functools.partial(plans_give_up, factory),
                functools.partial(datasets_service.give_up_abandoned, factory),
            )
            lease_sweeper = LeaseSweeper(factory, runner, settings, hooks)
            lease_sweeper.start()
        yield
        if lease_sweeper is not None:
            lease_sweeper.shutdown()
        if sweeper is not None:
            sweeper.shutdown()
        runner.shutdown()
        engine.dispose()

    app = FastAPI(
        title="gpuplan",
        version="0.1.0",
        description="Plan LLM fine-tuning runs: memory, speed and cost per GPU.",
        lifespan=lifespan,
        docs_url=None,  # served below from local assets: FastAPI's defaults load them from a CDN
        redoc_url=None,
    )
    install_api_docs(app)
    app.state.settings = settings
    request_ids.install_log_records()
    app.state.db = Database(factory, runner, settings)
    app.state.engine = engine
    tracing.instrument_app(app, engine, settings.otlp_endpoint)
    install_error_handlers(app)
    app.add_middleware(
        RequestLimits,
        max_bytes=settings.max_request_bytes,
        exceptions=upload_limits(),
        refusal_page=dashboard_refusal_page,
    )
    # Added last, so outermost: it also times, counts and logs the requests the body limit refuses.
    install_metrics(app, app.state.db, settings)
    app.include_router(plans_router)
    app.include_router(catalog_router)
    app.include_router(quotes_router)
    app.include_router(nodes_router)
    app.include_router(runs_router)
    install_dashboard(app)
    app.include_router(datasets_router)
    app.include_router(keys_router)

    @app.get("/healthz", operation_id="health-check", tags=["health"])
    def healthz() -> dict[str, Any]:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        return {
            "status": "ok",
            "database": engine.dialect.name,
            "tasks": "in-process" if settings.in_process_tasks else "celery",
            "process_id": os.getpid(),
        }

    document_error_responses(app)
    return app


def create_served_app(settings: Settings | None = None) -> FastAPI:
    """The app as `gpuplan serve` runs it (also uvicorn's factory in each worker process): with the
    access log written to stderr when GPUPLAN_ACCESS_LOG is on, and this process's connection timeouts."""
    settings = settings or get_settings()
    configure_connections(settings)
    access = logging.getLogger("gpuplan.access")
    if settings.access_log and not access.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(process)d access %(message)s"))
        access.addHandler(handler)
        access.setLevel(logging.INFO)
        access.propagate = False
    return settle(create_app(settings))


# Swagger UI and ReDoc's files, as fastapi-offline packages them (the swagger-ui-dist and redoc
# releases' own bundles), served by gpuplan so /docs and /redoc work with no network.
DOCS_ASSETS = "/docs-assets"


def install_api_docs(app: FastAPI) -> None:
    from importlib.resources import files

    from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
    from fastapi.responses import HTMLResponse
    from fastapi.staticfiles import StaticFiles

    app.mount(DOCS_ASSETS, StaticFiles(directory=str(files("fastapi_offline") / "static")), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url="/openapi.json",
            title="gpuplan API",
            swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{DOCS_ASSETS}/favicon.png",
        )

    @app.get("/redoc", include_in_schema=False)
    def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url="/openapi.json",
            title="gpuplan API",
            redoc_js_url=f"{DOCS_ASSETS}/redoc.standalone.js",
            redoc_favicon_url=f"{DOCS_ASSETS}/favicon.png",
            with_google_fonts=False,
        )


def upload_limits() -> tuple[BodyLimit, ...]:
    """The routes exempt from GPUPLAN_MAX_REQUEST_BYTES, each with the limit it keeps instead."""
    dataset = r"/v1/datasets/[A-Za-z0-9_-]{1,64}"
    return (
        # Streamed and refused by the route itself past the part size (GPUPLAN_DATASET_PART_BYTES).
        BodyLimit("PUT", re.compile(dataset + r"/parts/[^/]+"), None, "data set part: the upload's part size"),
        # Streamed and refused by the route past TOKENIZER_MAX_BYTES (a tokenizer.json is often 10+ MB).
        BodyLimit("PUT", re.compile(dataset + r"/tokenizer"), None, "tokenizer.json: TOKENIZER_MAX_BYTES"),
        # A price list of thousands of offers can pass 1 MiB; it keeps the import's own limit.
        BodyLimit(
            "POST", re.compile(r"/v1/(admin|platform)/catalog/offers"), MAX_PRICE_LIST_BYTES, "price list import"
        ),
    )


_ERROR_RESPONSES: dict[int, str] = {
    400: "malformed request (e.g. a Content-Length that is not a number)",
    401: "missing or unknown API key",
    403: "the key may not do this",
    404: "no such resource in the caller's organization",
    409: "conflicts with the resource's state",
    413: "request body over GPUPLAN_MAX_REQUEST_BYTES (or the route's own limit)",
    422: "invalid input: the message names the field and what is allowed",
    429: "over a rate limit or quota: Retry-After gives the seconds to wait",
    503: "a setting or service the request needs is not configured",
}


def document_error_responses(app: FastAPI) -> None:
    """Declare the error answers every API operation can give, with their body, in the OpenAPI schema
    (so clients and schemathesis know every status code the API answers)."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        schema = generate()
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components.setdefault("ErrorBody", ErrorBody.model_json_schema(ref_template="#/components/schemas/{model}"))
        body = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
        for operations in schema.get("paths", {}).values():
            for method, operation in operations.items():
                if method not in ("get", "put", "post", "delete", "patch"):
                    continue
                responses = operation.setdefault("responses", {})
                for status, description in _ERROR_RESPONSES.items():
                    # FastAPI's own 422 describes its {"detail": [...]} body; ours is ErrorBody.
                    if str(status) not in responses or status == 422:
                        responses[str(status)] = {"description": description, "content": body}
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
