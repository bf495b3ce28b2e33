"""Server-side render time of every dashboard page with 1,000 plans in the organization (the issue's
bar: under 300 ms each).

Builds a temporary SQLite database with 1,000 done plans (estimates and recommendations computed by
the real planner for a few distinct plans and stored on every row), a quote, 20 nodes with
heartbeats and 40 calibration results, signs in through the login form, then times each page with
TestClient (the whole request through the app: session, queries, view models, templates). Reports the
median and p95 of several runs per page.
Run: ``python -m benchmarks.dashboard.run`` (writes benchmarks/results/dashboard.json).
"""

from __future__ import annotations

import json
import re
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from services.api.app import create_app
from services.core.db import make_engine, make_sessionmaker, unit_of_work, utcnow
from services.core.migrate import upgrade
from services.core.settings import Settings
from services.nodes.tables import BenchmarkRow, NodeRow
from services.orgs.service import Principal, create_key, create_organization
from services.plans.repository import PlanRepository
from services.plans.schemas import PlanRequest
from services.plans.service import compute
from services.plans.tables import PlanRow
from services.quotes.schemas import QuoteRequest
from services.quotes.service import create_quote

RESULTS = Path(__file__).resolve().parents[1] / "results"
TARGET_MS = 300.0
PLANS = 1000
RUNS = 25

_PLANS: list[dict[str, Any]] = [
    {
        "model": {"name": "meta-llama/Llama-3.1-8B"},
        "method": "qlora",
        "lora": {"rank": 16},
        "micro_batch_size": 4,
        "seq_len": 2048,
        "gradient_checkpointing": True,
        "dataset": {"examples": 10_000, "avg_tokens": 512},
        "epochs": 3,
    },
    {
        "model": {"name": "meta-llama/Llama-3.1-70B"},
        "method": "full",
        "micro_batch_size": 1,
        "seq_len": 4096,
        "gradient_checkpointing": True,
        "dataset": {"tokens": 200_000_000},
        "epochs": 1,
    },
    {
        "model": {"name": "Qwen/Qwen2.5-7B"},
        "method": "lora",
        "lora": {"rank": 32},
        "micro_batch_size": 8,
        "seq_len": 1024,
        "dataset": {"examples": 50_000, "avg_tokens": 700},
        "epochs": 2,
    },
]


def _populate(url: str) -> tuple[str, dict[str, str]]:
    """1,000 done plans and the rest; returns the API key and ids of pages to time."""
    upgrade(url)
    factory = make_sessionmaker(make_engine(url))
    with unit_of_work(factory) as session:
        org = create_organization(session, "bench")
        key = create_key(session, "bench")
        principal = Principal(organization_id=org.id, organization_name=org.name, admin=False)
        results = [compute(session, PlanRequest.model_validate(p), 0.10, org.id) for p in _PLANS]
        repo = PlanRepository(session)
        start = utcnow() - timedelta(days=30)
        ids: list[str] = []
        for i in range(PLANS):
            body, result = _PLANS[i % len(_PLANS)], results[i % len(_PLANS)]
            row = repo.add(
                PlanRow(
                    organization_id=org.id,
                    status="done",
                    request=body,
                    model_name=body["model"]["name"],
                    method=body["method"],
                    created_at=start + timedelta(minutes=i),
                    started_at=start + timedelta(minutes=i),
                    finished_at=start + timedelta(minutes=i, seconds=1),
                    attempts=1,
                    **result,
                )
            )
            ids.append(row.id)
        newest_8b = ids[-1 - (PLANS - 1) % len(_PLANS)]  # an 8B QLoRA plan
        newest_70b = next(i for n, i in reversed(list(enumerate(ids))) if n % len(_PLANS) == 1)
        rec = results[0]["recommendations"][0]
        quote = create_quote(
            session,
            principal,
            newest_8b,
            QuoteRequest(gpu=rec["gpu"], gpus=rec["gpus"], provider=rec["provider"]),
            0.10,
        )
        for n in range(20):
            node = NodeRow(
                organization_id=org.id,
                name=f"node-{n}",
                gpu="A100 80GB",
                gpu_count=8,
                gpu_memory_gib=80.0,
                driver="550",
                cuda="12.4",
                provider="lab",
                usd_per_hour=14.0,
                last_heartbeat_at=utcnow(),
                gpus=[
                    {"index": g, "utilisation_pct": 50.0 + g, "memory_used_gib": 40.0, "memory_total_gib": 80.0}
                    for g in range(8)
                ],
                job_running=n % 2 == 0,
            )
            session.add(node)
            session.flush()
            for b in range(2):
                session.add(
                    BenchmarkRow(
                        organization_id=org.id,
                        node_id=node.id,
                        calibration_id=f"cal-{n}-{b}",
                        gpu="A100 80GB",
                        model_name="meta-llama/Llama-3.1-8B",
                        method="qlora",
                        plan=_PLANS[0],
                        peak_allocated_gib=10.0 + n * 0.1,
                        peak_reserved_gib=11.0 + n * 0.1,
                        tokens_per_s=3000.0 + 10 * n,
                        mfu=0.4,
                        hardware_utilisation=0.5,
                        predicted_peak_allocated_gib=10.5,
                        predicted_tokens_per_s=3200.0,
                        device="NVIDIA A100-SXM4-80GB",
                    )
                )
        pages = {
            "plans list (newest 50 of 1,000)": "/dashboard/plans",
            "plans list (page 11, deep cursor)": f"/dashboard/plans?before={ids[PLANS - 500]}",
            "new plan form": "/dashboard/plans/new",
            "plan page (8B QLoRA)": f"/dashboard/plans/{newest_8b}",
            "plan page (70B full)": f"/dashboard/plans/{newest_70b}",
            "quote": f"/dashboard/quotes/{quote.id}",
            "nodes (20)": "/dashboard/nodes",
            "benchmarks (40 calibrations + public cases)": "/dashboard/benchmarks",
            "sign-in page": "/dashboard/login",
        }
    return key, pages


def _time(client: TestClient, path: str) -> list[float]:
    client.get(path)  # warm: templates compiled, caches filled
    samples = []
    for _ in range(RUNS):
        start = time.perf_counter()
        response = client.get(path)
        samples.append((time.perf_counter() - start) * 1000)
        if response.status_code != 200:
            raise RuntimeError(f"{path}: {response.status_code} {response.text[:200]}")
    return samples


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def main() -> int:
    with tempfile.TemporaryDirectory() as folder:
        url = f"sqlite:///{folder}/bench.db"
        key, pages = _populate(url)
        app = create_app(Settings(database_url=url))
        with TestClient(app) as client:
            login = client.get("/dashboard/login").text
            token = re.search(r'name="csrf_token" value="([^"]+)"', login)
            assert token is not None
            client.post("/dashboard/login", data={"csrf_token": token.group(1), "api_key": key, "next": "/dashboard"})
            results: dict[str, Any] = {}
            for name, path in pages.items():
                samples = _time(client, path)
                results[name] = {
                    "median_ms": round(statistics.median(samples), 1),
                    "p95_ms": round(_p95(samples), 1),
                    "max_ms": round(max(samples), 1),
                    "runs": len(samples),
                }
    ok = all(r["p95_ms"] < TARGET_MS for r in results.values())
    report = {"plans": PLANS, "target_ms": TARGET_MS, "all_pages_under_target_at_p95": ok, "pages": results}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "dashboard.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(f"| page, {PLANS:,} plans in the organization | median ms | p95 ms |")
    print("|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['median_ms']:.1f} | {r['p95_ms']:.1f} |")
    print(f"every page under {TARGET_MS:.0f} ms at p95: {'yes' if ok else 'NO'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
