"""API load benchmark: POST /v1/estimate against a real server process on loopback.

Starts `gpuplan serve` (embedded SQLite, in a temporary directory) on a free port, then sends a fixed
number of requests from several client threads and reports requests/s and latency percentiles.
Bounded in count and time; only 127.0.0.1 is contacted. Run: ``python -m benchmarks.api.run``.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

RESULTS = Path(__file__).resolve().parents[1] / "results"
REQUESTS = 2000
THREADS = int(os.environ.get("GPUPLAN_BENCH_THREADS", "4"))
BODY = {
    "model": {"name": "meta-llama/Llama-3.1-8B"},
    "method": "qlora",
    "lora": {"rank": 16},
    "micro_batch_size": 4,
    "seq_len": 2048,
    "gradient_checkpointing": True,
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    workdir = Path(tempfile.mkdtemp(prefix="gpuplan-bench-"))
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPLAN_")}
    server = subprocess.Popen(
        [sys.executable, "-m", "services.cli.main", "serve", "--port", str(port)],
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        key = (workdir / ".gpuplan" / "local-key").read_text().strip()
        headers = {"Authorization": f"Bearer {key}"}
        latencies: list[float] = []
        errors = 0
        lock = threading.Lock()

        def worker(n: int) -> None:
            nonlocal errors
            with httpx.Client(base_url=base, headers=headers, timeout=10) as client:
                for _ in range(n):
                    start = time.perf_counter()
                    response = client.post("/v1/estimate", json=BODY)
                    elapsed = time.perf_counter() - start
                    with lock:
                        latencies.append(elapsed)
                        errors += response.status_code != 200

        for _ in range(50):  # warm-up
            httpx.post(f"{base}/v1/estimate", json=BODY, headers=headers)
        threads = [threading.Thread(target=worker, args=(REQUESTS // THREADS,)) for _ in range(THREADS)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - start
    finally:
        server.terminate()
        server.wait(timeout=10)
    latencies.sort()
    result = {
        "requests": len(latencies),
        "client_threads": THREADS,
        "errors": errors,
        "requests_per_s": round(len(latencies) / wall, 1),
        "p50_ms": round(statistics.median(latencies) * 1e3, 2),
        "p99_ms": round(latencies[int(0.99 * (len(latencies) - 1))] * 1e3, 2),
        "cpus": os.cpu_count(),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "api.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(result))
    return 0 if errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
