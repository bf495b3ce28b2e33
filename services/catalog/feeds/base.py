"""What every feed shares: the rows it produces, its errors, name mapping, and a guarded JSON fetch."""

from __future__ import annotations

import csv
import functools
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from services.catalog.gpus import GpuSpec, find_gpu, gpu_specs
from services.catalog.pricelist import (
    MAX_HOST_RAM_GIB_PER_NODE,
    MIN_USD_PER_GPU_HOUR,
    PriceListError,
    parse_rows,
    spot_above_on_demand,
)
from services.core.errors import EstimatorError

# A provider's whole offer list is a few MB at most (Vast's marketplace is the largest); more is refused.
MAX_RESPONSE_BYTES = 32 * 2**20


class FeedError(Exception):
    """A fetch that failed: the message names the provider and the cause, never a credential."""


@dataclass
class FeedOffers:
    """Price-list rows (the columns of a price list) and the provider names no known card matched."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    skipped: set[str] = field(default_factory=set)
    invalid: list[str] = field(default_factory=list)
    spot_dropped: list[str] = field(default_factory=list)
    spot_too_low: list[str] = field(default_factory=list)

    def keep(self, rows: list[dict[str, Any]]) -> None:
        """Set ``rows`` to the given rows the price-list checks accept, the cheapest per key, with their odd spot
        prices dropped; each refused row is named in ``invalid`` (for the feed's note).

        The catalog refuses a feed's rows as it refuses a file, whole (record_feed_success): one bad listing (a
        price per second read as one per hour) would keep every older price of the provider. A feed skips just
        that listing. Checked before the cheapest is chosen, so a refused listing never hides a sound one."""
        specs = gpu_specs()
        sound = []
        for row in rows:
            # Checked as it will be stored: a spot price drop_spot_above_on_demand clears costs the row nothing.
            checked = {**row, "spot_usd_per_hour": None} if _odd_spot(row) else row
            try:
                parse_rows([checked], specs)
            except PriceListError as exc:
                problem = exc.problems[0].removeprefix("row 1: ")
                self.invalid.append(f"{row.get('gpu')} {row.get('region') or '-'} ({problem})")
                continue
            sound.append(row)
        self.rows = cheapest_per_key(sound)
        self.drop_spot_above_on_demand()

    def drop_spot_above_on_demand(self) -> None:
        """Clear each spot price above its row's on-demand price, or below MIN_USD_PER_GPU_HOUR, remembering which
        (for the feed's note).

        A user's price list with such a row is refused whole; a feed drops only that spot price: failing the
        refresh would keep every older price of the provider for one odd spot quote, while the row's on-demand
        price is sound. Without a spot price the offer is planned on demand only."""
        for row in self.rows:
            on_demand, spot = row.get("on_demand_usd_per_hour"), row.get("spot_usd_per_hour")
            if spot_above_on_demand(on_demand, spot):
                self.spot_dropped.append(f"{row.get('gpu')} {row.get('region') or '-'} (spot {spot:g} > {on_demand:g})")
                row["spot_usd_per_hour"] = None
            elif _spot_too_low(spot):
                # Next to nothing (moto answers every spot price as $0.00001): it would rank first; a file is refused.
                self.spot_too_low.append(f"{row.get('gpu')} {row.get('region') or '-'} (spot {spot:g})")
                row["spot_usd_per_hour"] = None

    def note(self) -> str | None:
        parts = []
        if self.skipped:
            parts.append(f"skipped offers of cards gpuplan has no spec for: {_some(sorted(self.skipped))}")
        if self.invalid:
            count = len(self.invalid)
            parts.append(
                f"skipped {count} offer{'s' if count > 1 else ''} with a value gpuplan refuses: {_some(self.invalid)}"
            )
        if self.spot_dropped:
            count = len(self.spot_dropped)
            parts.append(
                f"dropped the spot price of {count} offer{'s' if count > 1 else ''} above "
                f"{'their' if count > 1 else 'its'} on-demand price: {_some(self.spot_dropped)}"
            )
        if self.spot_too_low:
            count = len(self.spot_too_low)
            parts.append(
                f"dropped the spot price of {count} offer{'s' if count > 1 else ''} below ${MIN_USD_PER_GPU_HOUR} per "
                f"GPU-hour: {_some(self.spot_too_low)}"
            )
        return "; ".join(parts) or None


def _spot_too_low(spot: Any) -> bool:
    return isinstance(spot, float | int) and not isinstance(spot, bool) and 0 < spot < MIN_USD_PER_GPU_HOUR


def _odd_spot(row: dict[str, Any]) -> bool:
    """Whether drop_spot_above_on_demand will clear the row's spot price."""
    spot = row.get("spot_usd_per_hour")
    return spot_above_on_demand(row.get("on_demand_usd_per_hour"), spot) or _spot_too_low(spot)


def price_problem(value: Any) -> str | None:
    """Why a provider's price cannot be used, as the feed's note shows it after the field's name ("not reported",
    "nan", "0", "-75", "'75'"); None for a positive finite number."""
    if value is None:
        return "not reported"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return repr(value)
    if not math.isfinite(value) or value <= 0:
        return f"{value:g}"
    return None


def _some(items: list[str], shown: int = 10) -> str:
    """The first ``shown`` items, then how many more there are."""
    more = f" and {len(items) - shown} more" if len(items) > shown else ""
    return ", ".join(items[:shown]) + more


@dataclass(frozen=True)
class NameMapping:
    """One provider name (instance type, GPU id) and what it rents: the card, GPUs per node, links."""

    provider: str
    name: str
    gpu: str
    gpus_per_node: int | None
    interconnect: str
    inter_node_gbit_per_s: float | None
    source: str


@functools.cache
def name_mappings() -> dict[tuple[str, str], NameMapping]:
    """The provider-name table (feeds/data/names.csv), keyed by (provider, lower-case name)."""
    text = resources.files("services.catalog.feeds").joinpath("data/names.csv").read_text(encoding="utf-8")
    body = "".join(line for line in text.splitlines(True) if not line.startswith("#"))
    out = {}
    for row in csv.DictReader(body.splitlines()):
        mapping = NameMapping(
            provider=row["provider"],
            name=row["name"],
            gpu=row["gpu"],
            gpus_per_node=int(row["gpus_per_node"]) if row["gpus_per_node"] else None,
            interconnect=row["interconnect"],
            inter_node_gbit_per_s=float(row["inter_node_gbit_per_s"]) if row["inter_node_gbit_per_s"] else None,
            source=row["source"],
        )
        out[(mapping.provider, mapping.name.lower())] = mapping
    return out


def mapping_for(provider: str, name: str) -> NameMapping | None:
    return name_mappings().get((provider, name.strip().lower()))


def known_gpu(name: str, specs: tuple[GpuSpec, ...] | None = None) -> GpuSpec | None:
    """The card a provider's name means, matched forgivingly; None when gpuplan has no spec for it."""
    try:
        return find_gpu(name, specs if specs is not None else gpu_specs())
    except EstimatorError:
        return None


def cheapest_per_key(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (provider, gpu, region, gpus_per_node), the cheapest on demand (a price list allows one)."""
    best: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in rows:
        key = (row["provider"], row["gpu"], row.get("region", ""), row.get("gpus_per_node", 1))
        if key not in best or row["on_demand_usd_per_hour"] < best[key]["on_demand_usd_per_hour"]:
            best[key] = row
    return list(best.values())


def host_ram_gib(value: Any, bytes_per_unit: float) -> float | None:
    """A node's host RAM in GiB from a provider's number in its own unit (None when absent, not a positive
    finite number, or beyond what a price list accepts: an unknown RAM, never a failed refresh)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        return None
    gib = value * bytes_per_unit / 2**30
    return round(gib, 1) if gib <= MAX_HOST_RAM_GIB_PER_NODE else None


def scrub(text: str, secrets: Iterable[str | None]) -> str:
    """The text with every secret replaced, so no credential reaches an error, a log or the API."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


def fetch_json(
    provider: str,
    method: str,
    url: str,
    *,
    headers: dict[str, str] | None = None,
    body: Any = None,
    timeout_s: float = 30.0,
    secrets: Iterable[str | None] = (),
) -> Any:
    """One HTTP call to a provider's API; its JSON answer, or FeedError with a short, scrubbed reason.

    Redirects are not followed (the credential would travel to another host) and the answer is capped
    at MAX_RESPONSE_BYTES.
    """
    import httpx

    secret_list = list(secrets)
    try:
        with (
            httpx.Client(timeout=timeout_s, follow_redirects=False) as client,
            client.stream(method, url, headers=headers, json=body) as response,
        ):
            chunks = []
            size = 0
            for chunk in response.iter_bytes():
                size += len(chunk)
                if size > MAX_RESPONSE_BYTES:
                    raise FeedError(f"{provider}: answer larger than {MAX_RESPONSE_BYTES} bytes")
                chunks.append(chunk)
            raw = b"".join(chunks)
            status = response.status_code
    except httpx.HTTPError as exc:
        raise FeedError(scrub(f"{provider}: cannot reach the API ({type(exc).__name__}: {exc})", secret_list)) from None
    if status >= 400:
        snippet = raw[:200].decode("utf-8", "replace").replace("\n", " ")
        raise FeedError(scrub(f"{provider}: HTTP {status} from the API: {snippet}", secret_list))
    try:
        return json.loads(raw)
    except ValueError:
        raise FeedError(f"{provider}: the API answered with something that is not JSON") from None
