"""Connection limits (issue 21 item 7: 20 slow clients held 20 connections for as long as they liked):
a real `gpuplan serve` on loopback with 1 s timeouts. A client that sends its headers or its body too
slowly, or idles on a keep-alive connection, is disconnected within the timeout; past the connection
cap a request is answered 503, and once the slow clients are gone the server answers again."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.api.served import Served, serve

TIMEOUT_S = 1.0
# A disconnection is expected within the timeout plus this much (a loaded shared machine).
SLACK_S = 3.0


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp_path: Path = tmp_path_factory.mktemp("connections")
    settings = {
        "http_header_timeout_s": str(TIMEOUT_S),
        "http_body_timeout_s": str(TIMEOUT_S),
        "http_keep_alive_s": "1",
        "http_max_connections": "8",
    }
    with serve(f"sqlite:///{tmp_path / 'gpuplan.db'}", tmp_path, settings) as server:
        yield server


def _connect(served: Served) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", served.port), timeout=5)
    sock.settimeout(0.05)
    return sock


def _trickle_until_closed(sock: socket.socket, data: bytes, every_s: float, limit_s: float) -> tuple[bytes, float]:
    """Send ``data`` a byte every ``every_s`` (then nothing) until the server closes the connection;
    returns what the server sent and the seconds it took."""
    start = time.monotonic()
    received = b""
    sent = 0
    next_send = start
    while time.monotonic() - start < limit_s:
        now = time.monotonic()
        if sent < len(data) and now >= next_send:
            try:
                sock.sendall(data[sent : sent + 1])
            except OSError:
                break
            sent += 1
            next_send = now + every_s
        try:
            chunk = sock.recv(4096)
        except TimeoutError:
            continue
        except OSError:
            break
        if not chunk:
            break
        received += chunk
    return received, time.monotonic() - start


def test_slow_headers_are_cut_off_with_408(served: Served) -> None:
    with _connect(served) as sock:
        request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 200 + b"\r\n\r\n"
        received, took = _trickle_until_closed(sock, request, every_s=0.2, limit_s=TIMEOUT_S + SLACK_S + 5)
    print(f"slow headers: closed after {took:.2f} s")
    assert received.startswith(b"HTTP/1.1 408"), received
    assert TIMEOUT_S * 0.9 <= took <= TIMEOUT_S + SLACK_S, took


def test_a_body_that_stops_arriving_is_cut_off(served: Served) -> None:
    head = (
        f"POST /v1/estimate HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {served.key}\r\n"
        "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    ).encode()
    with _connect(served) as sock:
        sock.sendall(head + b'{"model": ')
        received, took = _trickle_until_closed(sock, b"", every_s=1.0, limit_s=TIMEOUT_S + SLACK_S + 5)
    print(f"stalled body: closed after {took:.2f} s")
    assert received.startswith(b"HTTP/1.1 408"), received
    assert took <= TIMEOUT_S + SLACK_S, took


def test_a_slow_but_steady_body_is_not_cut_off(served: Served) -> None:
    """The body timeout is between reads: a body trickling in over 2.5 s (past the 1 s timeout) is read."""
    body = b'{"x": "' + b"a" * 8 + b'"}'
    head = (
        f"POST /v1/estimate HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {served.key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    with _connect(served) as sock:
        sock.sendall(head)
        received, took = _trickle_until_closed(sock, body, every_s=0.15, limit_s=TIMEOUT_S + SLACK_S + 10)
    assert took >= 0.15 * (len(body) - 1)
    assert received.startswith(b"HTTP/1.1 422"), received  # the estimate's answer: the body was read


def test_an_idle_keep_alive_connection_is_closed(served: Served) -> None:
    with _connect(served) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        received, took = _trickle_until_closed(sock, b"", every_s=1.0, limit_s=1 + SLACK_S + 5)
    print(f"idle keep-alive: closed after {took:.2f} s")
    assert received.startswith(b"HTTP/1.1 200"), received
    assert took <= 1 + SLACK_S, took


def test_past_the_connection_cap_requests_get_503_until_slow_clients_are_dropped(served: Served) -> None:
    held = [_connect(served) for _ in range(20)]
    try:
        for sock in held:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # headers never finished
        over = httpx.get(f"{served.base}/healthz", timeout=5)
        assert over.status_code == 503
        start = time.monotonic()
        deadline = start + TIMEOUT_S + SLACK_S
        while True:
            answer = httpx.get(f"{served.base}/healthz", timeout=5)
            if answer.status_code == 200:
                print(f"connection cap: 503 past it, 200 again {time.monotonic() - start:.2f} s later")
                break
            assert time.monotonic() < deadline, "the held connections were not dropped"
            time.sleep(0.1)
        for sock in held:  # each was answered 408 and closed
            sock.settimeout(1)
            assert sock.recv(4096).startswith(b"HTTP/1.1 408")
    finally:
        for sock in held:
            sock.close()
