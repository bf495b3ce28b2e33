"""Lambda Cloud: ``GET /api/v1/instance-types`` (https://cloud.lambdalabs.com/api/v1, ``Authorization:
Bearer KEY``; docs.lambda.ai/api/cloud).

The answer maps each instance type name (``gpu_8x_h100_sxm5``: GPUs x card) to its
``price_cents_per_hour`` for the whole instance, ``specs.gpus``, ``specs.memory_gib`` (the instance's
RAM) and the regions with capacity now. On-demand
instances are billed in one-minute increments (https://docs.lambda.ai/public-cloud/billing). There is no
spot market, and an on-demand instance is one node (1-Click Clusters are reserved, not on demand).
"""

from __future__ import annotations

import re
from typing import Any

from services.catalog.feeds.base import (
    FeedError,
    FeedOffers,
    fetch_json,
    host_ram_gib,
    known_gpu,
    mapping_for,
    price_problem,
)

PROVIDER = "lambda"
DEFAULT_URL = "https://cloud.lambdalabs.com/api/v1"
_NAME = re.compile(r"^gpu_(\d+)x_([a-z0-9_]+)$")


def parse_instance_types(payload: Any, fetched_at: str) -> FeedOffers:
    """Price-list rows from an instance-types answer: one offer per card and GPU count, per-GPU prices."""
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, dict):
        raise FeedError(f"{PROVIDER}: the answer has no 'data' object of instance types")
    out = FeedOffers()
    rows = []
    for name, entry in data.items():
        kind = entry.get("instance_type") if isinstance(entry, dict) else None
        match = _NAME.match(str(name))
        if not isinstance(kind, dict) or match is None:
            continue
        cents = kind.get("price_cents_per_hour")
        problem = price_problem(cents)
        if problem is not None or not isinstance(cents, int | float):  # the isinstance: for mypy
            out.invalid.append(f"{name} (price_cents_per_hour {problem})")
            continue
        specs = kind.get("specs")
        listed = specs.get("gpus") if isinstance(specs, dict) else None
        gpus: int = listed if isinstance(listed, int) and not isinstance(listed, bool) else int(match.group(1))
        if not 1 <= gpus <= 64:
            out.invalid.append(f"{name} (specs.gpus {gpus})")
            continue
        mapping = mapping_for(PROVIDER, match.group(2))
        spec = known_gpu(mapping.gpu if mapping else str(kind.get("gpu_description") or match.group(2)))
        if spec is None:
            out.skipped.add(str(name))
            continue
        regions = [
            str(r.get("name"))
            for r in entry.get("regions_with_capacity_available") or []
            if isinstance(r, dict) and r.get("name")
        ]
        capacity = f"; capacity now in {', '.join(regions[:8])}" if regions else "; no capacity right now"
        rows.append(
            {
                "provider": PROVIDER,
                "gpu": spec.name,
                "gpus_per_node": gpus,
                "on_demand_usd_per_hour": round(cents / 100 / gpus, 6),
                "currency": "USD",
                "region": "",
                "interconnect": (mapping.interconnect if mapping else "") if gpus > 1 else "",
                "fetched_at": fetched_at,
                "source": f"Lambda instance-types API: {name}{capacity}"[:500],
                "whole_nodes_only": True,
                "billing_increment_s": 60,
                "host_ram_gib_per_node": host_ram_gib(
                    specs.get("memory_gib") if isinstance(specs, dict) else None, float(2**30)
                ),
            }
        )
    out.keep(rows)
    return out


def fetch(url: str, api_key: str | None, fetched_at: str, timeout_s: float = 30.0) -> FeedOffers:
    if not api_key:
        raise FeedError(f"{PROVIDER}: no API key (set GPUPLAN_LAMBDA_API_KEY)")
    payload = fetch_json(
        PROVIDER,
        "GET",
        url.rstrip("/") + "/instance-types",
        headers={"Authorization": f"Bearer {api_key}", "Accept": "application/json"},
        timeout_s=timeout_s,
        secrets=[api_key],
    )
    return parse_instance_types(payload, fetched_at)
