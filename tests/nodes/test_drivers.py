"""Provider drivers against real processes and a real HTTP endpoint on loopback."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from services.core.settings import Settings
from services.nodes.drivers import DriverError, HttpDriver, NodeTarget, NoDriver
from services.nodes.providers import make_driver

NODE = NodeTarget(id="n1", name="box", instance_id="i-0abc", hostname="box", agent_pid=None)


class _Provider(BaseHTTPRequestHandler):
    calls: ClassVar[list[tuple[str, str, str | None]]] = []
    status: ClassVar[int] = 202

    def _answer(self) -> None:
        _Provider.calls.append((self.command, self.path, self.headers.get("X-Api-Key")))
        self.send_response(_Provider.status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_POST = do_PUT = _answer

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture
def provider() -> Iterator[str]:
    _Provider.calls, _Provider.status = [], 202
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Provider)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_the_http_driver_calls_the_templated_url_with_the_auth_header(provider: str) -> None:
    settings = Settings(
        provider_driver="http",
        provider_stop_url=provider + "/v1/instances/{instance_id}/stop?node={node_id}",
        provider_start_url=provider + "/v1/instances/{instance_id}/start",
        provider_http_method="PUT",
        provider_auth_header="X-Api-Key",
        provider_auth_value="s3cr3t-token",
    )
    driver = make_driver(settings)
    assert "HTTP 202" in driver.stop(NODE) and "HTTP 202" in driver.start(NODE)
    assert _Provider.calls == [
        ("PUT", "/v1/instances/i-0abc/stop?node=n1", "s3cr3t-token"),
        ("PUT", "/v1/instances/i-0abc/start", "s3cr3t-token"),
    ]
    assert "s3cr3t-token" not in repr(settings)


def test_http_driver_failures_are_readable_and_keep_the_token_secret(provider: str) -> None:
    _Provider.status = 500
    driver = HttpDriver(provider + "/stop/{instance_id}", auth_value="Bearer s3cr3t")
    with pytest.raises(DriverError, match="HTTP 500") as failure:
        driver.stop(NODE)
    assert "s3cr3t" not in str(failure.value)
    with pytest.raises(DriverError, match="no instance id"):
        driver.stop(NodeTarget("n2", "bare", "", "bare", None))
    with pytest.raises(DriverError, match="request to the provider failed"):
        HttpDriver("http://127.0.0.1:1/stop/{instance_id}", timeout_s=2).stop(NODE)


def test_without_a_driver_nothing_is_stopped_and_the_reason_says_how_to_configure_one() -> None:
    with pytest.raises(DriverError, match="GPUPLAN_PROVIDER_DRIVER"):
        NoDriver().stop(NODE)
    with pytest.raises(DriverError, match="GPUPLAN_PROVIDER_STOP_URL"):
        make_driver(Settings(provider_driver="http"))


def test_every_template_value_stays_inside_its_path_segment(provider: str) -> None:
    attack = "x/../../../admin/wipe-all?force=true#"
    # Even where the operator's id pattern lets anything through, the id is one encoded path segment.
    driver = HttpDriver(provider + "/v1/instances/{instance_id}/stop?node={name}", instance_id_pattern=".*")
    driver.stop(NodeTarget(id="n1", name="a b&c=d", instance_id=attack, hostname="box", agent_pid=None))
    assert _Provider.calls == [
        ("POST", "/v1/instances/x%2F..%2F..%2F..%2Fadmin%2Fwipe-all%3Fforce%3Dtrue%23/stop?node=a%20b%26c%3Dd", None)
    ]
    for bad in ("..", "."):  # a whole segment of dots would still walk up the path
        with pytest.raises(DriverError, match="not a http instance id"):
            driver.stop(NodeTarget("n1", "box", bad, "box", None))
    # The default format refuses the attack outright, before any request.
    with pytest.raises(DriverError, match="not a http instance id"):
        HttpDriver(provider + "/v1/instances/{instance_id}/stop").stop(NodeTarget("n1", "box", attack, "box", None))
    # A template whose first value sits in the host cannot be steered to another host.
    with pytest.raises(DriverError, match="keep the provider's host"):
        HttpDriver("http://{instance_id}.example/stop", instance_id_pattern=".*").stop(
            NodeTarget("n1", "box", "127.0.0.1:1@evil", "box", None)
        )
    assert len(_Provider.calls) == 1
