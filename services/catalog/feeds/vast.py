"""Vast.ai: the marketplace search ``POST /api/v0/bundles/`` (https://console.vast.ai/api/v0, the query
as a JSON body, as the official CLI's ``vastai search offers`` sends it; ``Authorization: Bearer KEY``).

Each offer is one host's machine: ``gpu_name``, ``num_gpus``, ``gpu_ram`` (MB), ``dph_total`` (USD per
hour for the whole offer), ``min_bid`` (the interruptible price for it), ``geolocation`` ("Texas, US"),
``inet_down`` (Mbit/s), ``bw_nvlink`` and ``cpu_ram``, the system RAM of the offer in MB (the
official CLI shows it divided by 1000 as GB: vast-ai/vast-cli, vast.py, the search offers' "RAM" column;
read as 10^6 bytes, the smaller of the two readings of MB, so a borderline offload setup is not
recommended on RAM the node may not have). The feed keeps the cheapest offer per card, GPU count and
country. Vast bills per second (https://vast.ai/pricing); a rental is one machine, so no multi-node.
"""

from __future__ import annotations

import math
import re
from typing import Any

from services.catalog.feeds.base import (
    FeedError,
    FeedOffers,
    cheapest_per_key,
    fetch_json,
    host_ram_gib,
    known_gpu,
    mapping_for,
)

PROVIDER = "vast"
DEFAULT_URL = "https://console.vast.ai/api/v0"
# Verified, rentable, on-demand machines, cheapest first (the CLI's default filters).
QUERY: dict[str, Any] = {
    "verified": {"eq": True},
    "external": {"eq": False},
    "rentable": {"eq": True},
    "rented": {"eq": False},
    "order": [["dph_total", "asc"]],
    "type": "on-demand",
    "limit": 5000,
}
_COUNTRY = re.compile(r"(?:^|,\s*)([A-Z]{2})$")
A100_80GB_MIN_MB = 60_000  # gpu_ram below this is the 40 GB A100
BYTES_PER_MB = 1e6


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def parse_bundles(payload: Any, fetched_at: str) -> FeedOffers:
    """Price-list rows from a bundles answer: the cheapest per-GPU price per card, GPU count and country."""
    offers = payload.get("offers") if isinstance(payload, dict) else None
    if not isinstance(offers, list):
        raise FeedError(f"{PROVIDER}: the answer has no 'offers' list")
    out = FeedOffers()
    rows = []
    for item in offers:
        if not isinstance(item, dict) or not isinstance(item.get("gpu_name"), str):
            continue
        gpus = item.get("num_gpus")
        total = _number(item.get("dph_total"))
        if not isinstance(gpus, int) or not 1 <= gpus <= 64 or total is None or total <= 0:
            continue
        mapping = mapping_for(PROVIDER, item["gpu_name"])
        name = mapping.gpu if mapping else item["gpu_name"]
        ram_mb = _number(item.get("gpu_ram"))
        if name.startswith("A100") and ram_mb is not None:
            name = "A100 80GB" if ram_mb >= A100_80GB_MIN_MB else "A100 40GB"
        spec = known_gpu(name)
        if spec is None:
            out.skipped.add(item["gpu_name"])
            continue
        geo = item.get("geolocation")
        match = _COUNTRY.search(geo.strip()) if isinstance(geo, str) else None
        country = match.group(1) if match else ""
        bid = _number(item.get("min_bid"))
        down_mbit = _number(item.get("inet_down"))
        nvlink = _number(item.get("bw_nvlink"))
        rows.append(
            {
                "provider": PROVIDER,
                "gpu": spec.name,
                "gpus_per_node": gpus,
                "on_demand_usd_per_hour": round(total / gpus, 6),
                "spot_usd_per_hour": round(bid / gpus, 6) if bid is not None and bid > 0 else None,
                "currency": "USD",
                "region": country,
                "country": country,
                "interconnect": ("NVLink" if nvlink and nvlink > 0 else "PCIe") if gpus > 1 else "",
                "fetched_at": fetched_at,
                "source": f"Vast.ai bundles search: offer {item.get('id', '?')} ({item['gpu_name']})",
                "whole_nodes_only": True,
                "billing_increment_s": 1,
                "download_gbit_per_s": round(down_mbit / 1000, 3) if down_mbit and down_mbit > 0 else None,
                "host_ram_gib_per_node": host_ram_gib(item.get("cpu_ram"), BYTES_PER_MB),
            }
        )
    out.rows = cheapest_per_key(rows)
    return out


def fetch(url: str, api_key: str | None, fetched_at: str, timeout_s: float = 30.0) -> FeedOffers:
    headers = {"Accept": "application/json", "Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    payload = fetch_json(
        PROVIDER,
        "POST",
        url.rstrip("/") + "/bundles/",
        headers=headers,
        body=QUERY,
        timeout_s=timeout_s,
        secrets=[api_key],
    )
    return parse_bundles(payload, fetched_at)
