"""The real API as users start it (`gpuplan serve`, embedded: SQLite, in-process tasks) against moto's S3
server, both subprocesses on loopback, and the API process's memory read from /proc: the harness of
tests/datasets/test_check_memory.py and benchmarks/datacheck/memory.py.

Peak memory per upload: writing 5 to /proc/PID/clear_refs resets VmHWM to the current RSS (Linux 4.0+,
Documentation/filesystems/proc.rst, "clear_refs"), so VmHWM read afterwards is the peak since then.
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import math
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
S3_CREDENTIALS = {"GPUPLAN_S3_ACCESS_KEY_ID": "gpuplan-test", "GPUPLAN_S3_SECRET_ACCESS_KEY": "gpuplan-test-secret"}
BUCKET = "gpuplan-datacheck-memory"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_http(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not come up (exit status {proc.poll()})") from None
            time.sleep(0.1)


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of a process, in KiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0])
    return out


def reset_peak(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")


@dataclass
class Served:
    url: str
    key: str
    pid: int

    def request(self, method: str, path: str, body: bytes | None = None, json_body: Any = None) -> Any:
        data = json.dumps(json_body).encode() if json_body is not None else body
        headers = {"Authorization": f"Bearer {self.key}"}
        if json_body is not None:
            headers["Content-Type"] = "application/json"
        elif body is not None:
            headers["Content-Type"] = "application/octet-stream"
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=120) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"{method} {path}: {exc.code} {exc.read()[:500]!r}") from None

    def upload_file(self, path: Path, name: str, timeout_s: float = 900.0) -> dict[str, Any]:
        """Upload a file through the datasets routes part by part; the data set once its check has ended."""
        size = path.stat().st_size
        created = self.request("POST", "/v1/datasets", json_body={"name": name, "size_bytes": size})
        part = created["upload"]["part_size_bytes"]
        with path.open("rb") as handle:
            for n in range(1, math.ceil(size / part) + 1):
                self.request("PUT", f"/v1/datasets/{created['id']}/parts/{n}", body=handle.read(part))
        self.request("POST", f"/v1/datasets/{created['id']}/complete")
        deadline = time.monotonic() + timeout_s
        while True:
            body: dict[str, Any] = self.request("GET", f"/v1/datasets/{created['id']}")
            if body["status"] in ("done", "failed"):
                return body
            if time.monotonic() > deadline:
                raise RuntimeError(f"the check of {name} did not finish in {timeout_s} s: {body['status']}")
            time.sleep(0.2)

    def peak_growth_mib(self, path: Path, name: str) -> tuple[float, dict[str, Any]]:
        """Upload and check one file; the API process's peak RSS above its RSS before, in MiB."""
        before = memory_kib(self.pid)["VmRSS"]
        reset_peak(self.pid)
        body = self.upload_file(path, name)
        return (memory_kib(self.pid)["VmHWM"] - before) / 1024, body


def serve(workdir: Path, extra_env: dict[str, str] | None = None) -> Iterator[Served]:
    """moto's S3 server and `gpuplan serve` in `workdir` (the embedded default); stopped at the end."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPLAN_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    s3_port, api_port = free_port(), free_port()
    s3_url = f"http://127.0.0.1:{s3_port}"
    moto = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(s3_port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    api: subprocess.Popen[bytes] | None = None
    try:
        _wait_http(s3_url + "/moto-api/", moto)
        urllib.request.urlopen(urllib.request.Request(f"{s3_url}/{BUCKET}", method="PUT"), timeout=10).close()
        env |= S3_CREDENTIALS | {"GPUPLAN_S3_ENDPOINT_URL": s3_url, "GPUPLAN_S3_BUCKET": BUCKET}
        env |= {"GPUPLAN_ACCESS_LOG": "false", "GPUPLAN_RATE_LIMIT_PER_MINUTE": "0"} | (extra_env or {})
        api = subprocess.Popen(
            [sys.executable, "-m", "services.cli.main", "serve", "--host", "127.0.0.1", "--port", str(api_port)],
            cwd=workdir,
            env=env,
            stdout=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{api_port}"
        _wait_http(url + "/v1/plans", api, timeout_s=120)
        key = (workdir / ".gpuplan" / "local-key").read_text().strip()
        yield Served(url=url, key=key, pid=api.pid)
    finally:
        for proc in (api, moto):
            if proc is not None:
                proc.terminate()
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


# --- the files: bombs and honest ones -------------------------------------------------------------

MiB = 2**20


def gzip_line_bomb(path: Path, line_bytes: int = 400 * 10**6) -> Path:
    """One JSON line of `line_bytes` (400 MB: issue 21's bomb, about 400 KB gzipped)."""
    with gzip.open(path, "wb", compresslevel=9) as out:
        out.write(b'{"text": "')
        block = b"a" * MiB
        for _ in range(line_bytes // MiB):
            out.write(block)
        out.write(b'"}\n')
    return path


def bz2_line_bomb(path: Path, line_bytes: int = 400 * 10**6) -> Path:
    with bz2.open(path, "wb") as out:
        out.write(b'{"text": "')
        block = b"b" * MiB
        for _ in range(line_bytes // MiB):
            out.write(block)
        out.write(b'"}\n')
    return path


def parquet_dictionary_bomb(path: Path, rows: int = 60, value_bytes: int = 8 * 10**6) -> Path:
    """`rows` copies of one `value_bytes` string, dictionary-encoded: under a kilobyte on disk."""
    import pyarrow as pa  # type: ignore[import-untyped]
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    value = "a" * value_bytes
    table = pa.table({"text": pa.array([value] * rows).dictionary_encode()})
    pq.write_table(table, path, compression="zstd")
    return path


def csv_with_a_long_cell(path: Path, cell_bytes: int = 200 * 1024) -> Path:
    path.write_text("prompt,completion\n" + "x" * cell_bytes + ",a short answer\nhello,world\n", encoding="utf-8")
    return path


def csv_with_a_bom(path: Path) -> Path:
    path.write_bytes("\ufeffprompt,completion\nwhat is 2+2,four\nname a colour,blue\n".encode())
    return path


def honest_jsonl(path: Path, size_bytes: int) -> Path:
    """Chat rows with varied words until the file is `size_bytes` long (no duplicates, no personal data)."""
    words = [f"word{i}" for i in range(5000)]
    written, n = 0, 0
    with path.open("wb") as out:
        buffer = io.BytesIO()
        while written < size_bytes:
            n += 1
            question = " ".join(words[(n * 7 + k * 13) % 5000] for k in range(30))
            answer = " ".join(words[(n * 11 + k * 17) % 5000] for k in range(120))
            row = {
                "messages": [{"role": "user", "content": f"{n} {question}"}, {"role": "assistant", "content": answer}]
            }
            line = (json.dumps(row) + "\n").encode()
            buffer.write(line)
            written += len(line)
            if buffer.tell() > MiB:
                out.write(buffer.getvalue())
                buffer = io.BytesIO()
        out.write(buffer.getvalue())
    return path
