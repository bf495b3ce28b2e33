"""Provider price lists (versioned data files): what one GPU-hour costs where."""

from __future__ import annotations

import csv
import functools
import io
from dataclasses import dataclass
from importlib import resources


@dataclass(frozen=True)
class Offer:
    provider: str
    gpu: str
    gpus_per_node: int
    on_demand_usd_per_hour: float
    spot_usd_per_hour: float | None
    currency: str
    region: str
    country: str
    interconnect: str
    fetched_at: str
    source: str
    whole_nodes_only: bool = False
    inter_node_gbit_per_s: float | None = None
    billing_increment_s: int = 1
    billing_minimum_s: int = 0
    startup_s: float | None = None
    download_gbit_per_s: float | None = None
    preemption_per_hour: float | None = None


def parse_offers(text: str) -> tuple[Offer, ...]:
    """Parse a price-list CSV (per-GPU hourly prices; '#' lines are comments)."""
    body = "".join(line for line in text.splitlines(True) if not line.startswith("#"))
    offers = []
    for row in csv.DictReader(io.StringIO(body)):
        offers.append(
            Offer(
                provider=row["provider"],
                gpu=row["gpu"],
                gpus_per_node=int(row["gpus_per_node"]),
                on_demand_usd_per_hour=float(row["on_demand_usd_per_hour"]),
                spot_usd_per_hour=float(row["spot_usd_per_hour"]) if row["spot_usd_per_hour"].strip() else None,
                currency=row["currency"],
                region=row["region"],
                country=row["country"],
                interconnect=row["interconnect"],
                fetched_at=row["fetched_at"],
                source=row["source"],
            )
        )
    return tuple(offers)


@functools.cache
def bundled_offers() -> tuple[Offer, ...]:
    text = resources.files("services.catalog").joinpath("data/offers.csv").read_text(encoding="utf-8")
    return parse_offers(text)
