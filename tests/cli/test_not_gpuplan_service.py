"""`gpuplan plans` pointed (--api) at a server that is not gpuplan, on a loopback port: another web server's
200 HTML page was a JSONDecodeError traceback (or a KeyError one for JSON of another shape)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.cli.test_input_probes import PLAN, _gpuplan, _one_line_error

ANSWERS = {"/html": (b"<html><body>Sign in</body></html>", "text/html"), "/list": (b"[]", "application/json")}


class _NotGpuplan(BaseHTTPRequestHandler):
    """Answers every request 200 with the page its path's first segment names (an HTML page or a JSON array)."""

    def _answer(self) -> None:
        body, kind = ANSWERS["/" + self.path.strip("/").split("/", 1)[0]]
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # http.server's spelling
        self._answer()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def not_gpuplan() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NotGpuplan)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("page", ["html", "list"])
@pytest.mark.parametrize("command", ["get", "submit"])
def test_plans_against_a_server_that_is_not_gpuplan_is_one_line(
    tmp_path: Path, not_gpuplan: str, page: str, command: str
) -> None:
    api = f"{not_gpuplan}/{page}"
    args = ("plans", "get", "abc") if command == "get" else ("plans", "submit", "--plan", str(PLAN))
    done = _gpuplan(tmp_path, *args, "--api", api, "--key", "gp_x")
    _one_line_error(done, f"--api {api}: the answer")
    assert "is not a gpuplan service's" in done.stderr


@pytest.mark.parametrize("page", ["html", "list"])
def test_data_upload_against_a_server_that_is_not_gpuplan_is_one_line(
    tmp_path: Path, not_gpuplan: str, page: str
) -> None:
    (tmp_path / "train.jsonl").write_text('{"text": "an ordinary row"}\n', encoding="utf-8")
    api = f"{not_gpuplan}/{page}"
    done = _gpuplan(tmp_path, "data", "upload", "train.jsonl", "--api", api, "--key", "gp_x")
    _one_line_error(done, "is not a gpuplan service's; check --api")
