"""API load benchmark against a real `gpuplan serve` on loopback (bounded in time, 127.0.0.1 only).

1. ``POST /v1/estimate`` at 8 concurrent clients for a fixed duration, in rounds alternating with
   ``GET /healthz`` (the app's floor) so their ratio is taken under the same load: requests/s and latency
   percentiles of the median round (issue 24's target: at least 800 requests/s on Postgres with 2
   processes).
2. ``GET /v1/plans`` (a 50-plan page, first page and a deep page by cursor) with 1,000 and then
   10,000 stored plans: the latency should not grow with the plan count (keyset pages on an index).

The load comes from ``wrk`` (a C load generator, `apt-get install wrk`) when it is installed, so the
client costs little of the CPU the server needs; otherwise from Python threads (much heavier on the
client, so the figures are lower bounds). The server runs on Postgres (a fresh database on
GPUPLAN_BENCH_POSTGRES_URL's server, dropped afterwards) or, with ``--sqlite``, on a SQLite file.

Run: ``python -m benchmarks.api.run [--sqlite] [--workers N] [--duration-s S] [--rounds N] [--estimate-only]``
(writes benchmarks/results/api.json, api-sqlite.json with ``--sqlite``; ``--estimate-only`` adds ``-estimate`` to
the name, so a partial run leaves the last whole run's file as it was).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx

RESULTS = Path(__file__).resolve().parents[1] / "results"
POSTGRES_ADMIN_URL = os.environ.get(
    "GPUPLAN_BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
CLIENTS = 8
BODY = {
    "model": {"name": "meta-llama/Llama-3.1-8B"},
    "method": "qlora",
    "lora": {"rank": 16},
    "micro_batch_size": 4,
    "seq_len": 2048,
    "gradient_checkpointing": True,
}
MAX_DURATION_S = 60
MAX_ROUNDS = 9
# Issue 24 step 5: POST /v1/estimate at 8 clients on Postgres with 2 API processes.
ESTIMATE_TARGET_PER_S = 800.0


def _median_round(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median requests/s (its own latencies with it), and the spread of the rounds."""
    ordered = sorted(runs, key=lambda r: r["requests_per_s"])
    out = dict(ordered[len(ordered) // 2])
    out["round_requests_per_s"] = [r["requests_per_s"] for r in runs]
    return out


def summary(result: dict[str, Any]) -> list[str]:
    """The run's verdict in a few lines for the terminal: the estimate's median round against the target, its ratio to
    /healthz, and which client made the load, loudly where it was the Python-threads fallback (its threads take CPU
    the server needs, so its figures read lower and are not comparable with wrk's)."""
    estimate, healthz = result["estimate"], result["healthz"]
    rate, target = estimate["requests_per_s"], result["target_estimate_requests_per_s"]
    spread = estimate["round_requests_per_s"]
    verdict = "met" if rate >= target and estimate["errors"] == 0 else "MISSED"
    lines = [
        f"POST /v1/estimate: {rate:,.0f} requests/s in the median round "
        f"(rounds {min(spread):,.0f}-{max(spread):,.0f}, "
        f"p99 {estimate['p99_ms']} ms, {estimate['errors']} errors; target {target:,.0f}: {verdict})",
        f"GET /healthz: {healthz['requests_per_s']:,.0f} requests/s; "
        f"estimate / healthz {result['estimate_to_healthz']}",
    ]
    clients = {r[name]["tool"] for r in result["rounds"] for name in ("estimate", "healthz")}
    if clients == {"wrk"}:
        lines.append(f"load client: wrk ({result['clients']} connections)")
    else:
        lines.append(
            "load client: Python threads, NOT wrk (not installed: apt-get install -y wrk). The threads share the "
            "server's cores, so these figures are lower bounds and not comparable with runs made with wrk."
        )
    return lines


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def _database(sqlite: bool, workdir: Path) -> Iterator[str]:
    if sqlite:
        yield f"sqlite:///{workdir / 'gpuplan.db'}"
        return
    from sqlalchemy import create_engine, text

    name = f"gpuplan_bench_{uuid.uuid4().hex[:10]}"
    admin = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield POSTGRES_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def _setup(url: str) -> tuple[str, str]:
    """Migrate, and make an organization with a key; returns (key, organization id)."""
    from services.core.db import make_engine, make_sessionmaker, unit_of_work
    from services.core.migrate import upgrade
    from services.orgs.service import create_key, create_organization

    upgrade(url)
    engine = make_engine(url)
    with unit_of_work(make_sessionmaker(engine)) as session:
        org = create_organization(session, "bench")
        key = create_key(session, "bench")
        org_id = org.id
    engine.dispose()
    return key, org_id


def _store_plans(url: str, organization_id: str, count: int) -> None:
    """Insert ``count`` finished plans straight into the table (what the list reads)."""
    from sqlalchemy import insert, text

    from services.core.db import make_engine, new_id, utcnow
    from services.plans.tables import PlanRow

    engine = make_engine(url)
    start = utcnow() - timedelta(days=30)
    cheapest = {"gpu": "L4", "gpus": 1, "total_usd": 12.5, "hours": 3.1}
    rows = [
        {
            "id": new_id(),
            "organization_id": organization_id,
            "status": "done",
            "request": BODY,
            "model_name": "meta-llama/Llama-3.1-8B",
            "method": "qlora",
            "recommendations": [cheapest] * 20,
            "cheapest": cheapest,
            "attempts": 1,
            "created_at": start + timedelta(seconds=i),
        }
        for i in range(count)
    ]
    with engine.begin() as conn:
        for i in range(0, len(rows), 1000):
            conn.execute(insert(PlanRow), rows[i : i + 1000])
    with engine.begin() as conn:  # fresh statistics, as autovacuum would gather after such a load
        conn.execute(text("ANALYZE plans"))
    engine.dispose()


def _list_query(url: str, organization_id: str, repeats: int = 200) -> dict[str, Any]:
    """The list query alone, in this process (less sensitive to a busy machine than HTTP load): the
    median time of the first page and of page 21, and whether the plan uses the keyset index."""
    from sqlalchemy import text

    from services.core.db import make_engine, make_sessionmaker, unit_of_work
    from services.plans.repository import PlanRepository

    engine = make_engine(url)
    factory = make_sessionmaker(engine)
    out: dict[str, Any] = {}
    with unit_of_work(factory) as session:
        repo = PlanRepository(session)
        cursor = None
        for _ in range(20):
            cursor = repo.list_for_org(organization_id, 50, cursor)[-1].id
        for label, before in (("first_page", None), ("page_21", cursor)):
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                repo.list_for_org(organization_id, 50, before)
                times.append(time.perf_counter() - start)
            out[f"{label}_median_ms"] = round(statistics.median(times) * 1e3, 3)
        if engine.dialect.name == "postgresql":
            plan = session.execute(
                text(
                    "EXPLAIN SELECT id FROM plans WHERE organization_id = :org "
                    "ORDER BY created_at DESC, id DESC LIMIT 50"
                ),
                {"org": organization_id},
            ).scalars()
            out["uses_index"] = any("ix_plans_org_created_id" in line for line in plan)
    engine.dispose()
    return out


def _wrk(url: str, key: str, method: str, body: dict[str, Any] | None, duration_s: int) -> dict[str, Any]:
    script = Path(tempfile.mkdtemp(prefix="gpuplan-wrk-")) / "request.lua"
    lines = [f'wrk.method = "{method}"', f'wrk.headers["Authorization"] = "Bearer {key}"']
    if body is not None:
        lines += ['wrk.headers["Content-Type"] = "application/json"', f"wrk.body = [[{json.dumps(body)}]]"]
    script.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = subprocess.run(
        ["wrk", "-t", "2", "-c", str(CLIENTS), "-d", f"{duration_s}s", "--latency", "-s", str(script), url],
        capture_output=True,
        text=True,
        timeout=duration_s + 30,
        check=True,
    ).stdout
    shutil.rmtree(script.parent, ignore_errors=True)

    def ms(label: str) -> float:
        found = re.search(rf"^\s+{label}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        if found is None:
            raise RuntimeError(f"wrk output without the {label}% latency:\n{out}")
        value, unit = float(found.group(1)), found.group(2)
        return round(value / 1000 if unit == "us" else value * 1000 if unit == "s" else value, 2)

    rate = re.search(r"Requests/sec:\s+([\d.]+)", out)
    done = re.search(r"(\d+) requests in", out)
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    return {
        "tool": "wrk",
        "requests": int(done.group(1)) if done else 0,
        "requests_per_s": float(rate.group(1)) if rate else 0.0,
        "p50_ms": ms("50"),
        "p90_ms": ms("90"),
        "p99_ms": ms("99"),
        "errors": (int(bad.group(1)) if bad else 0) + (sum(int(g) for g in errors.groups()) if errors else 0),
    }


def _threads(url: str, key: str, method: str, body: dict[str, Any] | None, duration_s: int) -> dict[str, Any]:
    latencies: list[float] = []
    errors = 0
    lock = threading.Lock()
    stop_at = time.monotonic() + duration_s

    def client() -> None:
        nonlocal errors
        with httpx.Client(headers={"Authorization": f"Bearer {key}"}, timeout=10) as http:
            while time.monotonic() < stop_at:
                start = time.perf_counter()
                response = http.request(method, url, json=body)
                elapsed = time.perf_counter() - start
                with lock:
                    latencies.append(elapsed)
                    errors += response.status_code >= 300

    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    latencies.sort()

    def pct(q: float) -> float:
        return round(latencies[int(q * (len(latencies) - 1))] * 1e3, 2)

    return {
        "tool": "python-threads",
        "requests": len(latencies),
        "requests_per_s": round(len(latencies) / wall, 1),
        "p50_ms": round(statistics.median(latencies) * 1e3, 2),
        "p90_ms": pct(0.90),
        "p99_ms": pct(0.99),
        "errors": errors,
    }


def _group_cpu_s(group: int) -> float | None:
    """User + system CPU seconds of every live process in process group ``group`` (the server and its
    worker processes), from /proc (proc(5): fields 14 and 15 of /proc/PID/stat, in clock ticks); None where
    there is no /proc."""
    proc = Path("/proc")
    if not (proc / "self" / "stat").exists():
        return None
    ticks = 0
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # the process ended meanwhile
        if int(fields[2]) == group:  # fields[0] is the state (field 3), so pgrp (field 5) is fields[2]
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def _load(
    url: str, key: str, method: str, body: dict[str, Any] | None, duration_s: int, group: int | None = None
) -> dict[str, Any]:
    """One load run; with the server's process group, also its CPU time per request: what the server
    spends on one request, which a busy machine (other processes on the same cores) changes far less
    than requests/s."""
    before = _group_cpu_s(group) if group is not None else None
    if shutil.which("wrk"):
        out = _wrk(url, key, method, body, duration_s)
    else:
        out = _threads(url, key, method, body, duration_s)
    after = _group_cpu_s(group) if group is not None else None
    if before is not None and after is not None and out["requests"]:
        out["server_cpu_ms_per_request"] = round((after - before) * 1e3 / out["requests"], 3)
    return out


@contextmanager
def _server(db_url: str, workers: int, workdir: Path) -> Iterator[tuple[str, int]]:
    """The server's base URL and its process group (it and its worker processes)."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPLAN_") and k != "PROMETHEUS_MULTIPROC_DIR"}
    env.update(
        GPUPLAN_DATABASE_URL=db_url,
        # The limiter runs on every request but never bites here (8 clients, one key).
        GPUPLAN_RATE_LIMIT_PER_MINUTE="10000000",
        PYTHONPATH=str(Path(__file__).resolve().parents[2]),
    )
    log = open(workdir / "serve.log", "wb")  # noqa: SIM115 - closed below
    server = subprocess.Popen(
        [sys.executable, "-m", "services.cli.main", "serve", "--port", str(port), "--workers", str(workers)],
        cwd=workdir,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("server did not start:\n" + (workdir / "serve.log").read_text()[-2000:])
            time.sleep(0.2)
        yield base, server.pid  # started in a session of its own: its pid is the group's id
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)
        log.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sqlite", action="store_true", help="a SQLite file instead of Postgres")
    parser.add_argument("--workers", type=int, default=2, help="API processes (default 2: one per core)")
    parser.add_argument("--duration-s", type=int, default=10, help="seconds of load per measurement (max 60)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of /healthz then the estimate (median; max 9)")
    parser.add_argument("--estimate-only", action="store_true", help="skip the plan-list measurements")
    args = parser.parse_args(argv)
    duration_s = max(1, min(args.duration_s, MAX_DURATION_S))
    args.rounds = max(1, min(args.rounds, MAX_ROUNDS))
    workdir = Path(tempfile.mkdtemp(prefix="gpuplan-bench-"))
    result: dict[str, Any] = {
        "database": "sqlite" if args.sqlite else "postgres",
        "api_processes": args.workers,
        "clients": CLIENTS,
        "duration_s": duration_s,
        "cpus": os.cpu_count(),
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
    }
    with _database(args.sqlite, workdir) as db_url:
        key, org_id = _setup(db_url)
        with _server(db_url, args.workers, workdir) as (base, group):
            headers = {"Authorization": f"Bearer {key}"}
            for _ in range(100):  # warm-up: connections, caches, the model resolution
                httpx.post(f"{base}/v1/estimate", json=BODY, headers=headers, timeout=10)
            # Rounds alternate /healthz (the app's floor: routing, middleware, no auth, no database) and the
            # estimate, so the ratio of their medians compares them under the same load on the machine.
            rounds = []
            for _ in range(args.rounds):
                healthz = _load(f"{base}/healthz", key, "GET", None, duration_s, group)
                estimate = _load(f"{base}/v1/estimate", key, "POST", BODY, duration_s, group)
                rounds.append({"healthz": healthz, "estimate": estimate})
            result["rounds"] = rounds
            result["estimate"] = _median_round([r["estimate"] for r in rounds])
            result["healthz"] = _median_round([r["healthz"] for r in rounds])
            result["estimate_to_healthz"] = round(
                result["estimate"]["requests_per_s"] / result["healthz"]["requests_per_s"], 3
            )
            for name in ("estimate", "healthz"):
                cpu = [r[name]["server_cpu_ms_per_request"] for r in rounds if "server_cpu_ms_per_request" in r[name]]
                if cpu:
                    result[f"{name}_server_cpu_ms_per_request"] = statistics.median(cpu)
            result["target_estimate_requests_per_s"] = ESTIMATE_TARGET_PER_S
            stored = 0
            result["list"] = {}
            for count in () if args.estimate_only else (1_000, 10_000):
                _store_plans(db_url, org_id, count - stored)
                stored = count
                first = httpx.get(f"{base}/v1/plans", params={"limit": 50}, headers=headers, timeout=10).json()
                # A deep page: 20 pages in, by cursor.
                cursor = first["next_cursor"]
                for _ in range(19):
                    page = httpx.get(
                        f"{base}/v1/plans", params={"limit": 50, "before": cursor}, headers=headers, timeout=10
                    )
                    cursor = page.json()["next_cursor"]
                result["list"][str(count)] = {
                    "query": _list_query(db_url, org_id),
                    "first_page": _load(f"{base}/v1/plans?limit=50", key, "GET", None, max(3, duration_s // 2)),
                    "page_21": _load(
                        f"{base}/v1/plans?limit=50&before={cursor}", key, "GET", None, max(3, duration_s // 2)
                    ),
                }
    result["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    shutil.rmtree(workdir, ignore_errors=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    # A run without the plan pages writes a file of its own: it never replaces a whole run's figures.
    name = ("api-sqlite" if args.sqlite else "api") + ("-estimate" if args.estimate_only else "") + ".json"
    (RESULTS / name).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=1))
    print("\n".join(summary(result)), file=sys.stderr)
    return 0 if result["estimate"]["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
