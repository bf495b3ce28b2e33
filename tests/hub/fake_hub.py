"""A loopback fake of the Hugging Face Hub's file endpoints, serving files the tests make.

It answers ``HEAD`` and ``GET /{repo_id}/resolve/{revision}/{filename}`` (a ``Range`` GET with 206) the way
huggingface_hub expects (huggingface_hub/file_download.py and utils/_http.py::hf_raise_for_status):
``X-Repo-Commit`` and ``ETag`` on every file, ``Content-Length`` (``X-Linked-Size`` for files kept in LFS),
and the error shapes of the real Hub: 401 with ``X-Error-Code: RepoNotFound`` for an unknown (or private)
repo, 401/403 with ``X-Error-Code: GatedRepo`` for a gated repo without an accepted token, 404 with
``X-Error-Code: EntryNotFound`` for a missing file.
"""

from __future__ import annotations

import hashlib
import json
import threading
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote


@dataclass
class FakeRepo:
    files: dict[str, bytes]
    gated_token: str | None = None  # gated: only this bearer token is let through
    lfs: frozenset[str] = frozenset()
    commit: str = field(default_factory=lambda: uuid.uuid4().hex + "00000000")


class FakeHub:
    def __init__(self) -> None:
        self.repos: dict[str, FakeRepo] = {}
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Authorization)
        self.delay_s = 0.0
        self._lock = threading.Lock()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_HEAD(self) -> None:
                hub._answer(self, body=False)

            def do_GET(self) -> None:
                hub._answer(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def add_model(
        self,
        repo_id: str,
        config: dict[str, Any] | bytes,
        *,
        index: dict[str, Any] | None = None,
        gated_token: str | None = None,
    ) -> FakeRepo:
        files = {"config.json": config if isinstance(config, bytes) else json.dumps(config).encode()}
        if index is not None:
            files["model.safetensors.index.json"] = json.dumps(index).encode()
        repo = FakeRepo(files=files, gated_token=gated_token)
        self.repos[repo_id] = repo
        return repo

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _answer(self, req: BaseHTTPRequestHandler, body: bool) -> None:
        import time

        if self.delay_s:
            time.sleep(self.delay_s)
        auth = req.headers.get("Authorization")
        ranged = req.headers.get("Range") if body else None
        # One append per request, already labelled: the server is threaded (huggingface_hub reads shards in
        # parallel), so a later rewrite of requests[-1] could label another thread's entry.
        method = f"GET {ranged.removeprefix('bytes=')}" if ranged is not None else req.command
        with self._lock:
            self.requests.append((method, req.path, auth))
        path = unquote(req.path.split("?", 1)[0]).lstrip("/")
        repo_id, sep, rest = path.partition("/resolve/")
        if not sep:
            return self._error(req, 404, "EntryNotFound", "not a file URL")
        _revision, _, filename = rest.partition("/")
        repo = self.repos.get(repo_id)
        if repo is None:
            return self._error(req, 401, "RepoNotFound", "Repository not found")
        if repo.gated_token is not None and auth != f"Bearer {repo.gated_token}":
            status = 403 if auth else 401
            return self._error(req, status, "GatedRepo", "Access to model is restricted")
        content = repo.files.get(filename)
        if content is None:
            return self._error(req, 404, "EntryNotFound", "Entry not found")
        etag = hashlib.sha256(content).hexdigest()
        size = len(content)
        if ranged is not None:
            # get_safetensors_metadata reads a header with "Range: bytes=0-100000", then bytes=8-N when longer
            # (huggingface_hub/hf_api.py: parse_safetensors_file_metadata); recorded as "GET 0-100000".
            first, _, last = ranged.removeprefix("bytes=").partition("-")
            start, end = int(first), min(int(last) if last else size - 1, size - 1)
            content = content[start : end + 1]
            req.send_response(206)
            req.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        else:
            req.send_response(200)
        req.send_header("X-Repo-Commit", repo.commit)
        req.send_header("ETag", f'"{etag}"')
        if filename in repo.lfs:
            req.send_header("X-Linked-Size", str(size))
            req.send_header("X-Linked-Etag", f'"{etag}"')
        req.send_header("Content-Type", "application/json")
        req.send_header("Content-Length", str(len(content)))
        req.end_headers()
        if body:
            req.wfile.write(content)

    @staticmethod
    def _error(req: BaseHTTPRequestHandler, status: int, code: str, message: str) -> None:
        data = json.dumps({"error": message}).encode()
        req.send_response(status)
        req.send_header("X-Error-Code", code)
        req.send_header("X-Error-Message", message)
        req.send_header("Content-Type", "application/json")
        req.send_header("Content-Length", str(len(data)))
        req.end_headers()
        if req.command != "HEAD":
            req.wfile.write(data)
