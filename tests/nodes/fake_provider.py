"""A loopback HTTP server standing in for a provider's API: it records every request it gets (method,
raw path, headers, body) and answers with a canned status and JSON body, after ``delay_s`` if set."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Call:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class FakeProvider:
    url: str
    calls: list[Call] = field(default_factory=list)
    status: int = 200
    answer: Any = field(default_factory=dict)
    echo_auth: bool = False  # a careless provider that repeats the credential in its error
    delay_s: float = 0.0  # a slow provider: it sleeps this long before it answers


def serve(provider_holder: list[FakeProvider]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            provider = provider_holder[0]
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = raw.decode(errors="replace")
            headers = {k.lower(): v for k, v in self.headers.items()}
            provider.calls.append(Call(self.command, self.path, headers, body))
            if provider.delay_s:
                time.sleep(provider.delay_s)
            answer = provider.answer
            if provider.echo_auth:
                answer = {"error": f"bad credential {headers.get('authorization', '')}"}
            payload = json.dumps(answer).encode()
            self.send_response(provider.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _answer

        def log_message(self, *args: object) -> None:
            return None

    return Handler


def running_provider() -> Iterator[FakeProvider]:
    holder: list[FakeProvider] = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), serve(holder))
    holder.append(FakeProvider(f"http://127.0.0.1:{server.server_address[1]}"))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield holder[0]
    finally:
        server.shutdown()
        server.server_close()
