"""The S3 client from settings talks to a real S3-compatible server over HTTP, and keeps its secret."""

from __future__ import annotations

import http.server
import os
import socket
import threading
import time
from typing import Any, ClassVar

import pytest
from botocore.exceptions import ReadTimeoutError

from services.core.errors import ConfigurationError
from services.core.settings import Settings
from services.storage.s3 import default_location, make_s3_client
from tests.conftest import S3_TEST_CREDENTIALS


def test_round_trip_through_the_loopback_server(s3_settings: Settings) -> None:
    client = make_s3_client(s3_settings)
    location = default_location(s3_settings, "/runs/abc/")
    key = location.key("step-10", "adapter.safetensors")
    assert key == "runs/abc/step-10/adapter.safetensors"
    client.put_object(Bucket=location.bucket, Key=key, Body=b"weights")
    assert client.get_object(Bucket=location.bucket, Key=key)["Body"].read() == b"weights"


def test_the_secret_never_appears_in_a_repr(s3_settings: Settings) -> None:
    assert "gpuplan-test-secret" not in repr(s3_settings)
    assert "gpuplan-test-secret" not in str(s3_settings.model_dump())


def test_no_bucket_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="GPUPLAN_S3_BUCKET"):
        default_location(Settings())


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"s3_endpoint_url": "127.0.0.1:9000"}, "Invalid endpoint: 127.0.0.1:9000"),  # the scheme left out
        ({"s3_region": "us east 1"}, "region_name 'us east 1'"),
    ],
)
def test_an_endpoint_or_region_boto3_refuses_is_a_configuration_error(fields: dict[str, str], message: str) -> None:
    """A probe: botocore's ValueError went through `gpuplan sync` and `gpuplan restore` as a traceback."""
    with pytest.raises(ConfigurationError, match=message) as raised:
        make_s3_client(Settings(**fields))
    assert "GPUPLAN_S3_ENDPOINT_URL or GPUPLAN_S3_REGION" in raised.value.message


class _Silent:
    """A loopback endpoint that accepts TCP connections and never answers (a hung S3 gateway); counts them."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self._server.settimeout(0.05)  # close() on another thread does not wake a blocked accept() on Linux
        self.url = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        self.accepted: list[socket.socket] = []
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            self.accepted.append(conn)

    def close(self) -> None:
        self._closing.set()
        self._thread.join(timeout=5)
        self._server.close()
        for conn in self.accepted:
            conn.close()


def _settings(endpoint: str) -> Settings:
    return Settings(s3_endpoint_url=endpoint, **S3_TEST_CREDENTIALS)


def test_an_endpoint_that_never_answers_fails_after_attempts_times_the_read_timeout() -> None:
    """A probe: an endpoint accepting connections and answering nothing held `gpuplan sync` for 183 s (6 attempts x
    30 s) before its one-line error. The real client, its timeouts made small: each attempt waits out the read
    timeout, the three attempts are made, and the call fails soon after."""
    silent = _Silent()
    try:
        client = make_s3_client(_settings(silent.url), connect_timeout_s=0.5, read_timeout_s=0.5)
        started = time.monotonic()
        with pytest.raises(ReadTimeoutError):
            client.head_object(Bucket="b", Key="k")
        elapsed = time.monotonic() - started
    finally:
        silent.close()
    assert len(silent.accepted) == 3  # retried, as standard mode retries a timeout
    assert 1.5 <= elapsed < 6, elapsed


def test_the_default_client_gives_up_on_a_silent_endpoint_within_a_minute() -> None:
    config = make_s3_client(_settings("http://127.0.0.1:9")).meta.config
    assert config.retries == {"total_max_attempts": 3, "mode": "standard"}
    assert config.retries["total_max_attempts"] * config.read_timeout <= 60
    assert config.retries["total_max_attempts"] * config.connect_timeout <= 60


class _Flaky(http.server.BaseHTTPRequestHandler):
    """Answers HEAD with throttling (503 SlowDown), then a 500, then 200: what standard mode retries."""

    answers: ClassVar[list[tuple[int, bytes]]] = []

    def do_HEAD(self) -> None:
        status, code = self.answers.pop(0) if self.answers else (200, b"")
        self.send_response(status)
        if code:
            self.send_header("x-amz-error-code", code.decode())  # a HEAD answer has no body to name it in
        self.send_header("ETag", '"d41d8cd98f00b204e9800998ecf8427e"')
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        return None


def test_throttling_and_5xx_answers_are_still_retried() -> None:
    _Flaky.answers = [(503, b"SlowDown"), (500, b"InternalError")]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        client = make_s3_client(_settings(f"http://127.0.0.1:{server.server_address[1]}"))
        head = client.head_object(Bucket="b", Key="k")
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
    assert head["ResponseMetadata"]["HTTPStatusCode"] == 200 and not _Flaky.answers
    assert head["ResponseMetadata"]["RetryAttempts"] == 2


def test_a_part_whose_sending_outlasts_the_read_timeout_is_uploaded() -> None:
    """The read timeout runs from the body's last byte handed to the socket: a large part over a slow link takes
    longer than it to send, and is not cut for it (only a store silent after the body is)."""
    body = os.urandom(6 * 2**20)
    received: list[int] = []

    def slow_store(server: socket.socket) -> None:
        conn, _ = server.accept()
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, got = data.split(b"\r\n\r\n", 1)
            length = next(
                int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
            )
            if b"100-continue" in head.lower():
                conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
            size, slow_until = len(got), time.monotonic() + 2.5
            while size < length:
                chunk = conn.recv(32768)
                if not chunk:
                    return
                size += len(chunk)
                if time.monotonic() < slow_until:
                    time.sleep(0.02)  # a slow link (about 1.6 MB/s) for longer than the read timeout, then fast
            received.append(size)
            conn.sendall(b'HTTP/1.1 200 OK\r\nETag: "etag"\r\nContent-Length: 0\r\n\r\n')

    server = socket.create_server(("127.0.0.1", 0))
    thread = threading.Thread(target=slow_store, args=(server,), daemon=True)
    thread.start()
    try:
        client = make_s3_client(
            _settings(f"http://127.0.0.1:{server.getsockname()[1]}"),
            max_attempts=1,
            connect_timeout_s=2,
            read_timeout_s=1,
        )
        started = time.monotonic()
        answer = client.upload_part(Bucket="b", Key="k", UploadId="u", PartNumber=1, Body=body)
        elapsed = time.monotonic() - started
    finally:
        server.close()
        thread.join(timeout=10)
    assert answer["ETag"] == '"etag"' and received == [len(body)]
    assert elapsed > 2, elapsed  # longer than twice the read timeout, and no timeout
