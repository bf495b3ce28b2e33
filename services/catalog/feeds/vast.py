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
    fetch_json,
    host_ram_gib,
    known_gpu,
    mapping_for,
    price_problem,
)
from services.catalog.gpus import GpuSpec

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
BYTES_PER_MB = 1e6
# Vast names one card for both memory sizes ("A100 SXM4", "Tesla V100"): its gpu_ram (MiB as nvidia-smi reports
# it, 81920 for an 80 GB A100) tells them apart. Smallest first.
MEMORY_VARIANTS = (("A100 40GB", "A100 80GB"), ("V100 16GB", "V100 32GB"))
# An offer whose gpu_ram is this much below its card's memory is not that card: skipped, not planned with memory
# it lacks.
GPU_RAM_SHORTFALL = 0.95


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _by_memory(spec: GpuSpec | None, ram_mb: float | None) -> GpuSpec | None:
    """The card an offer rents, given the memory it reports: the memory variant of its name nearest ``ram_mb``, and
    None where it reports less than its card has, or no memory for a name Vast gives both variants."""
    if spec is None:
        return None
    variants = next((v for v in MEMORY_VARIANTS if spec.name in v), None)
    if ram_mb is None or ram_mb <= 0:
        # An "A100 PCIE" without gpu_ram may be the 40 GB card; read as the 80 GB one, it was planned on memory it may
        # not have. As for a price list's bare "A100" (docs/catalog.md): skipped, unless it is the smallest variant.
        return spec if not variants or spec.name == variants[0] else None
    gib = ram_mb / 1024
    if variants:
        cards = [card for card in map(known_gpu, variants) if card is not None]
        spec = min(cards, key=lambda card: abs(card.memory_gib - gib))
    return spec if gib >= spec.memory_gib * GPU_RAM_SHORTFALL else None


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
        listing = f"{item['gpu_name']} offer {item.get('id', '?')}"
        gpus = item.get("num_gpus")
        if isinstance(gpus, bool) or not isinstance(gpus, int) or not 1 <= gpus <= 64:
            out.invalid.append(f"{listing} (num_gpus {gpus!r})")
            continue
        problem = price_problem(item.get("dph_total"))
        if problem is not None:
            out.invalid.append(f"{listing} (dph_total {problem})")
            continue
        total = float(item["dph_total"])
        mapping = mapping_for(PROVIDER, item["gpu_name"])
        name = mapping.gpu if mapping else item["gpu_name"]
        ram_mb = _number(item.get("gpu_ram"))
        named = known_gpu(name)
        spec = _by_memory(named, ram_mb)
        if spec is None:
            # A card of that name with this memory is one gpuplan has no spec for.
            memory = f"{ram_mb / 1024:.0f} GiB" if ram_mb and ram_mb > 0 else "memory not reported"
            out.skipped.add(item["gpu_name"] if named is None else f"{item['gpu_name']} ({memory})")
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
    out.keep(rows)
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
