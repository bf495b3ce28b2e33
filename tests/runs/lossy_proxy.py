"""An HTTP proxy in front of the loopback S3 server that loses the answer to chosen requests: the request reaches the
store and is carried out, then the client's connection is closed before any answer (a timeout or a dropped connection
after the store committed), so the client retries a request that already happened."""

from __future__ import annotations

import http.client
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit


class LossyProxy:
    def __init__(self, upstream: str, lose: Callable[[str, str], bool]) -> None:
        """``lose(method, path)``: whether to lose the answer to this request (checked for every request)."""
        target = urlsplit(upstream)
        self.lost: list[str] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {k: v for k, v in self.headers.items() if k.lower() != "expect"}
                upstream_conn = http.client.HTTPConnection(target.hostname or "", target.port or 80, timeout=30)
                upstream_conn.request(self.command, self.path, body=body, headers=headers)
                answer = upstream_conn.getresponse()
                data = answer.read()
                upstream_conn.close()
                if proxy_lose(self.command, self.path):
                    proxy.lost.append(f"{self.command} {self.path}")
                    self.close_connection = True
                    return  # carried out by the store; its answer never reaches the client
                self.send_response_only(answer.status, answer.reason)
                for key, value in answer.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                # A HEAD answer keeps the object's length; any other carries the body read.
                length = answer.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length or str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        def proxy_lose(method: str, path: str) -> bool:
            return lose(method, path)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
