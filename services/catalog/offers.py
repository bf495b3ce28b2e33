"""Provider price lists (versioned data files): what one GPU-hour costs where, and how it is rented.

Schema version 2 (the shared Offer contract): besides the price, an offer says how its GPUs are sold
(``gpus_per_node``: the most GPUs one node has; ``whole_nodes_only``), whether the provider links nodes
(``inter_node_gbit_per_s``), how it bills (``billing_increment_s``, ``billing_minimum_s``), and what a
run pays before training starts (``startup_s``, ``download_gbit_per_s``), on spot
(``preemption_per_hour``), and the host RAM of one node (``host_ram_gib_per_node``: the CPU memory of a node
of ``gpus_per_node`` GPUs, which CPU-offload setups need). Empty optional columns mean "the planner's
sourced default" (for host RAM: unknown, so an offload setup is recommended with a note that its RAM is
unverified).
"""

from __future__ import annotations

import csv
import functools
import io
from dataclasses import dataclass
from importlib import resources

SCHEMA_VERSION = 2


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
    host_ram_gib_per_node: float | None = None

    def rents(self, gpus: int) -> bool:
        """Whether ``gpus`` GPUs of the offer can be rented: up to a node's GPUs on one node where it is rented per GPU,
        whole nodes where it is not, and more than one node only over the provider's network."""
        per_node = max(1, self.gpus_per_node)
        if gpus <= per_node and not self.whole_nodes_only:
            return True
        return gpus % per_node == 0 and (gpus == per_node or self.inter_node_gbit_per_s is not None)


class OfferParseError(ValueError):
    """A price-list row the parser cannot read: names the row (1-based, after the header) and the column."""

    def __init__(self, row: int, column: str, message: str) -> None:
        super().__init__(f"row {row}, column {column!r}: {message}")
        self.row = row
        self.column = column


def _optional_float(row: dict[str, str], column: str, index: int) -> float | None:
    value = (row.get(column) or "").strip()
    if not value:
        return None
    try:
        number = float(value)
    except ValueError:
        raise OfferParseError(index, column, f"not a number: {value!r}") from None
    if number < 0 or number != number:
        raise OfferParseError(index, column, f"must be a non-negative number, got {value!r}")
    return number


def _int(row: dict[str, str], column: str, index: int, default: int, minimum: int) -> int:
    value = (row.get(column) or "").strip()
    if not value:
        return default
    try:
        number = int(value)
    except ValueError:
        raise OfferParseError(index, column, f"not a whole number: {value!r}") from None
    if number < minimum:
        raise OfferParseError(index, column, f"must be at least {minimum}, got {number}")
    return number


def _bool(row: dict[str, str], column: str, index: int) -> bool:
    value = (row.get(column) or "").strip().lower()
    if value in ("", "false", "0", "no"):
        return False
    if value in ("true", "1", "yes"):
        return True
    raise OfferParseError(index, column, f"must be true or false, got {value!r}")


def parse_offers(text: str) -> tuple[Offer, ...]:
    """Parse a price-list CSV (per-GPU hourly prices; '#' lines are comments).

    Reads schema 1 (the first eleven columns) and schema 2 (plus the optional columns of :class:`Offer`).
    """
    body = "".join(line for line in text.splitlines(True) if not line.startswith("#"))
    offers = []
    for index, row in enumerate(csv.DictReader(io.StringIO(body)), start=1):
        price = _optional_float(row, "on_demand_usd_per_hour", index)
        if price is None:
            raise OfferParseError(index, "on_demand_usd_per_hour", "is required")
        offers.append(
            Offer(
                provider=row["provider"],
                gpu=row["gpu"],
                gpus_per_node=_int(row, "gpus_per_node", index, 1, 1),
                on_demand_usd_per_hour=price,
                spot_usd_per_hour=_optional_float(row, "spot_usd_per_hour", index),
                currency=row["currency"],
                region=row["region"],
                country=row["country"],
                interconnect=row["interconnect"],
                fetched_at=row["fetched_at"],
                source=row["source"],
                whole_nodes_only=_bool(row, "whole_nodes_only", index),
                inter_node_gbit_per_s=_optional_float(row, "inter_node_gbit_per_s", index),
                billing_increment_s=_int(row, "billing_increment_s", index, 1, 1),
                billing_minimum_s=_int(row, "billing_minimum_s", index, 0, 0),
                startup_s=_optional_float(row, "startup_s", index),
                download_gbit_per_s=_optional_float(row, "download_gbit_per_s", index),
                preemption_per_hour=_optional_float(row, "preemption_per_hour", index),
                host_ram_gib_per_node=_optional_float(row, "host_ram_gib_per_node", index),
            )
        )
    return tuple(offers)


@functools.cache
def bundled_offers() -> tuple[Offer, ...]:
    text = resources.files("services.catalog").joinpath("data/offers.csv").read_text(encoding="utf-8")
    return parse_offers(text)
