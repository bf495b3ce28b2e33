"""RunPod: the GraphQL ``gpuTypes`` query (https://api.runpod.io/graphql, ``Authorization: Bearer KEY``).

Each GPU type carries its per-GPU hourly price on the secure cloud (``securePrice``) and the community
cloud (``communityPrice``), the interruptible (spot) prices ``secureSpotPrice`` / ``communitySpotPrice``
and ``maxGpuCount``, the most GPUs one pod can have. Pods are billed per second
(https://docs.runpod.io/accounts-billing/billing); a pod is one node (multi-node Instant Clusters are a
separate product), so no inter-node network is given.
"""

from __future__ import annotations

import math
from typing import Any

from services.catalog.feeds.base import FeedError, FeedOffers, fetch_json, known_gpu, mapping_for, price_problem

PROVIDER = "runpod"
DEFAULT_URL = "https://api.runpod.io/graphql"
QUERY = (
    "query GpuTypes { gpuTypes { id displayName memoryInGb maxGpuCount secureCloud communityCloud "
    "securePrice communityPrice secureSpotPrice communitySpotPrice } }"
)


def _price(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        return None
    return float(value)


def parse_gpu_types(payload: Any, fetched_at: str) -> FeedOffers:
    """Price-list rows from a ``gpuTypes`` answer: one offer per card and cloud (secure, community)."""
    if not isinstance(payload, dict):
        raise FeedError(f"{PROVIDER}: expected a JSON object from the GraphQL API")
    if payload.get("errors"):
        messages = "; ".join(str(e.get("message", e))[:200] for e in payload["errors"][:3] if isinstance(e, dict))
        raise FeedError(f"{PROVIDER}: the GraphQL API answered with errors: {messages or 'unspecified'}")
    types = (payload.get("data") or {}).get("gpuTypes")
    if not isinstance(types, list):
        raise FeedError(f"{PROVIDER}: the answer has no data.gpuTypes list")
    out = FeedOffers()
    rows = []
    for item in types:
        if not isinstance(item, dict) or not isinstance(item.get("id"), str):
            continue
        mapping = mapping_for(PROVIDER, item["id"])
        spec = known_gpu(mapping.gpu if mapping else str(item.get("displayName") or item["id"]))
        if spec is None:
            out.skipped.add(item["id"])
            continue
        max_gpus = item.get("maxGpuCount")
        gpus_per_node = max_gpus if isinstance(max_gpus, int) and 1 <= max_gpus <= 64 else 1
        for cloud in ("secure", "community"):
            if item.get(f"{cloud}Cloud") is False:
                continue
            on_demand = _price(item.get(f"{cloud}Price"))
            if on_demand is None:
                out.invalid.append(f"{item['id']} ({cloud}Price {price_problem(item.get(f'{cloud}Price'))})")
                continue
            rows.append(
                {
                    "provider": PROVIDER,
                    "gpu": spec.name,
                    "gpus_per_node": gpus_per_node,
                    "on_demand_usd_per_hour": on_demand,
                    "spot_usd_per_hour": _price(item.get(f"{cloud}SpotPrice")),
                    "currency": "USD",
                    "region": f"{cloud}-cloud",
                    "interconnect": mapping.interconnect if mapping else "",
                    "fetched_at": fetched_at,
                    "source": f"RunPod GraphQL gpuTypes: {item['id']} ({cloud}Price)",
                    "billing_increment_s": 1,
                }
            )
    out.keep(rows)
    return out


def fetch(url: str, api_key: str | None, fetched_at: str, timeout_s: float = 30.0) -> FeedOffers:
    """Call the GraphQL API (the key goes in a header, never in the URL) and parse its answer."""
    if not api_key:
        raise FeedError(f"{PROVIDER}: no API key (set GPUPLAN_RUNPOD_API_KEY)")
    payload = fetch_json(
        PROVIDER,
        "POST",
        url,
        headers={"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"},
        body={"query": QUERY},
        timeout_s=timeout_s,
        secrets=[api_key],
    )
    return parse_gpu_types(payload, fetched_at)
