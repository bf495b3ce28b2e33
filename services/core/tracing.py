"""OpenTelemetry traces, when an OTLP endpoint is configured (GPUPLAN_OTLP_ENDPOINT, e.g.
http://collector:4318): spans for every API request (FastAPI), database statement (SQLAlchemy),
outgoing HTTP call (httpx: the Hub, providers' APIs), S3 call (botocore) and Celery task, exported over
OTLP/HTTP in batches. Each request's span carries its request id (``gpuplan.request_id``,
services/core/request_ids.py), so a trace is found from the id a user quotes. Without an endpoint nothing
is imported or patched. The packages are the ``otel`` extra (pip install 'gpuplan[otel]')."""

from __future__ import annotations

import logging
import threading
from typing import Any

from services.core.errors import ConfigurationError

log = logging.getLogger("gpuplan.tracing")

_lock = threading.Lock()
_provider: Any = None  # the process's TracerProvider, once configured
_instrumented: set[str] = set()


def _sdk(endpoint: str, service_name: str) -> Any:
    global _provider
    with _lock:
        if _provider is not None:
            return _provider
        try:
            from opentelemetry import trace
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError as exc:
            raise ConfigurationError(
                f"GPUPLAN_OTLP_ENDPOINT is set but OpenTelemetry is not installed ({exc.name}): "
                "pip install 'gpuplan[otel]'"
            ) from None
        provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint.rstrip("/") + "/v1/traces")))
        trace.set_tracer_provider(provider)
        _provider = provider
        return provider


def _once(name: str) -> bool:
    with _lock:
        if name in _instrumented:
            return False
        _instrumented.add(name)
        return True


def _clients(provider: Any) -> None:
    """httpx and botocore calls of this process (global patches, applied once)."""
    if _once("clients"):
        from opentelemetry.instrumentation.botocore import BotocoreInstrumentor
        from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

        HTTPXClientInstrumentor().instrument(tracer_provider=provider)
        BotocoreInstrumentor().instrument(tracer_provider=provider)  # type: ignore[no-untyped-call]


def instrument_app(app: Any, engine: Any, endpoint: str | None, service_name: str = "gpuplan-api") -> bool:
    """Trace the API app and its database engine; False (nothing done) without an endpoint."""
    if not endpoint:
        return False
    provider = _sdk(endpoint, service_name)
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    # The request id goes on the server span from the API's outermost middleware (annotate_current_span).
    FastAPIInstrumentor.instrument_app(app, tracer_provider=provider)
    _instrument_engine(engine, provider)
    _clients(provider)
    log.info("tracing to %s", endpoint)
    return True


def instrument_worker(endpoint: str | None, service_name: str = "gpuplan-worker") -> bool:
    """Trace Celery tasks (and the worker's httpx and S3 calls); False without an endpoint."""
    if not endpoint:
        return False
    provider = _sdk(endpoint, service_name)
    if _once("celery"):
        from opentelemetry.instrumentation.celery import CeleryInstrumentor

        CeleryInstrumentor().instrument(tracer_provider=provider)  # type: ignore[no-untyped-call]
    _clients(provider)
    return True


def _instrument_engine(engine: Any, provider: Any) -> None:
    from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor

    # The instrumentation declares sqlalchemy < 2.1 and would refuse 2.1; it only listens to the engine's
    # before/after cursor events, which 2.1 keeps (the test checks the statements' spans arrive).
    SQLAlchemyInstrumentor().instrument(engine=engine, tracer_provider=provider, skip_dep_check=True)


def instrument_engine(engine: Any, endpoint: str | None) -> None:
    """Trace a database engine made outside the API app (the worker's)."""
    if endpoint:
        _instrument_engine(engine, _sdk(endpoint, "gpuplan-worker"))


def annotate_current_span(request_id: str) -> None:
    """Put the request id on the span being recorded, if tracing is on (the API's outermost middleware
    calls it, inside the server span)."""
    if _provider is None:
        return
    from opentelemetry import trace

    span = trace.get_current_span()
    if span.is_recording():
        span.set_attribute("gpuplan.request_id", request_id)


def flush(timeout_ms: int = 5000) -> None:
    """Export what is buffered (tests; a process about to exit)."""
    if _provider is not None:
        _provider.force_flush(timeout_ms)


def shutdown() -> None:
    """Flush, stop exporting and take the global patches off (a test that traced, before the next runs)."""
    global _provider
    if _provider is None:
        return
    if "clients" in _instrumented:
        from opentelemetry.instrumentation.botocore import BotocoreInstrumentor
        from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

        HTTPXClientInstrumentor().uninstrument()
        BotocoreInstrumentor().uninstrument()  # type: ignore[no-untyped-call]
    _instrumented.clear()
    _provider.shutdown()
    _provider = None
