"""OpenTelemetry traces when GPUPLAN_OTLP_ENDPOINT is set: a loopback OTLP/HTTP collector receives the
request's span (with its request id) and the database statements under it; without an endpoint nothing
is traced."""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from services.api.app import create_app
from services.core import tracing
from services.core.settings import Settings
from tests.conftest import bounded_test_client, require_service
from tests.databases import migrate


class Collector:
    """An OTLP/HTTP trace collector on loopback: decodes every POST /v1/traces into its spans."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                for resource in request.resource_spans:
                    for scope in resource.scope_spans:
                        collector.spans.extend(scope.spans)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def attributes(self, span: Any) -> dict[str, Any]:
        return {a.key: a.value.string_value or a.value.int_value for a in span.attributes}


@pytest.fixture(scope="module")
def collector() -> Iterator[Collector]:
    have = importlib.util.find_spec("opentelemetry.sdk") is not None
    require_service("the otel extra", have, "pip install -e '.[otel]' (bash infra/dev.sh test installs it)")
    running = Collector()
    yield running
    tracing.shutdown()  # no exporter left behind for the tests that follow
    running.server.shutdown()


def test_a_request_is_traced_with_its_request_id_and_its_database_statements(
    collector: Collector, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'traced.db'}"
    migrate(url)
    with bounded_test_client(create_app(Settings(database_url=url, otlp_endpoint=collector.url))) as client:
        answer = client.get("/v1/plans", headers={"Authorization": "Bearer gp_unknown"})
        assert answer.status_code == 401
        rid = answer.headers["x-request-id"]
    tracing.flush()
    server = [s for s in collector.spans if collector.attributes(s).get("gpuplan.request_id") == rid]
    assert server, [s.name for s in collector.spans]
    assert "/v1/plans" in server[0].name
    trace_id = server[0].trace_id
    statements = [s for s in collector.spans if s.trace_id == trace_id and "db.system" in collector.attributes(s)]
    assert statements, "the key lookup's SELECT is a span of the request's trace"


def test_without_an_endpoint_nothing_is_traced(tmp_path: Path) -> None:
    assert tracing.instrument_app(object(), object(), None) is False
    assert tracing.instrument_worker(None) is False
