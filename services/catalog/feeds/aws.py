"""AWS EC2 through boto3: on-demand prices from the Price List API (``pricing.get_products``, service
code AmazonEC2, endpoint in us-east-1) and spot prices from ``ec2.describe_spot_price_history``.

Only the GPU instance types in feeds/data/names.csv are kept (each is a whole node of a known card
count, with its EFA/ENA bandwidth between nodes). The Price List answer is a list of JSON strings with
``product.attributes`` (instanceType, regionCode, operatingSystem, memory: the instance's RAM as
"2048 GiB"...) and
``terms.OnDemand.*.priceDimensions.*.pricePerUnit.USD`` per instance-hour
(https://docs.aws.amazon.com/aws-cost-management/latest/APIReference/API_pricing_GetProducts.html). The
spot price is the lowest current one over the region's availability zones
(https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DescribeSpotPriceHistory.html). Linux
instances are billed per second with a 60-second minimum
(https://aws.amazon.com/blogs/aws/new-per-second-billing-for-ec2-instances-and-ebs-volumes/).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from services.catalog.feeds.base import (
    FeedError,
    FeedOffers,
    host_ram_gib,
    known_gpu,
    name_mappings,
    scrub,
)

PROVIDER = "aws"
PRICING_REGION = "us-east-1"
BILLING_MINIMUM_S = 60
_MEMORY = re.compile(r"^\s*([0-9][0-9,]*(?:\.[0-9]+)?)\s*GiB\s*$")
_COUNTRY_BY_PREFIX = {"us": "US", "ca": "CA", "sa": "BR"}  # multi-country prefixes (eu, ap) stay unknown


def instance_types() -> dict[str, Any]:
    """The GPU instance types the feed knows, by name."""
    return {m.name: m for (provider, _), m in name_mappings().items() if provider == PROVIDER}


def _memory_gib(attributes: dict[str, Any]) -> float | None:
    """The instance's RAM from the Price List attribute ``memory`` ("2048 GiB", "1,152 GiB"); None otherwise."""
    match = _MEMORY.match(str(attributes.get("memory", "")))
    return host_ram_gib(float(match.group(1).replace(",", "")), float(2**30)) if match else None


def _hourly_usd(product: dict[str, Any]) -> float | None:
    for term in (product.get("terms", {}).get("OnDemand") or {}).values():
        for dimension in (term.get("priceDimensions") or {}).values():
            if dimension.get("unit") not in ("Hrs", "Hours", None):
                continue
            try:
                price = float(dimension["pricePerUnit"]["USD"])
            except (KeyError, TypeError, ValueError):
                continue
            if math.isfinite(price) and price > 0:
                return price
    return None


def parse_prices(
    price_list: Iterable[str | dict[str, Any]], spot_usd: dict[tuple[str, str], float], fetched_at: str
) -> FeedOffers:
    """Price-list rows from Price List products and spot prices ((region, instance type) -> USD/h per instance)."""
    known = instance_types()
    out = FeedOffers()
    rows = []
    for entry in price_list:
        try:
            product = json.loads(entry) if isinstance(entry, str) else entry
            attributes = product["product"]["attributes"]
        except (ValueError, KeyError, TypeError):
            raise FeedError(f"{PROVIDER}: a Price List entry is not a product with attributes") from None
        kind = attributes.get("instanceType", "")
        region = attributes.get("regionCode", "")
        if attributes.get("operatingSystem", "Linux") != "Linux" or not region:
            continue
        mapping = known.get(kind)
        if mapping is None:
            continue
        spec = known_gpu(mapping.gpu)
        if spec is None:
            out.skipped.add(kind)
            continue
        price = _hourly_usd(product)
        if price is None:
            out.invalid.append(f"{kind} {region} (no positive USD price per hour)")
            continue
        if mapping.gpus_per_node is None:  # names.csv gives every AWS instance type its GPU count
            continue
        gpus = mapping.gpus_per_node
        spot = spot_usd.get((region, kind))
        rows.append(
            {
                "provider": PROVIDER,
                "gpu": spec.name,
                "gpus_per_node": gpus,
                "on_demand_usd_per_hour": round(price / gpus, 6),
                "spot_usd_per_hour": round(spot / gpus, 8) if spot else None,
                "currency": "USD",
                "region": region,
                "country": _COUNTRY_BY_PREFIX.get(region.split("-")[0], ""),
                "interconnect": mapping.interconnect,
                "fetched_at": fetched_at,
                "source": f"AWS Price List API + spot price history: {kind} ({mapping.source})"[:500],
                "whole_nodes_only": True,
                "inter_node_gbit_per_s": mapping.inter_node_gbit_per_s,
                "billing_increment_s": 1,
                "billing_minimum_s": BILLING_MINIMUM_S,
                "host_ram_gib_per_node": _memory_gib(attributes),
            }
        )
    out.keep(rows)
    return out


def lowest_spot(history: Iterable[dict[str, Any]], region: str) -> dict[tuple[str, str], float]:
    """The lowest spot price per instance type over a region's zones (the newest price of each zone)."""
    newest: dict[tuple[str, str], tuple[Any, float]] = {}
    for item in history:
        try:
            price = float(item["SpotPrice"])
        except (KeyError, TypeError, ValueError):
            continue
        if not math.isfinite(price) or price <= 0:
            continue
        key = (item.get("InstanceType", ""), item.get("AvailabilityZone", ""))
        stamp = item.get("Timestamp")
        if key not in newest or (stamp is not None and str(stamp) > str(newest[key][0])):
            newest[key] = (stamp, price)
    out: dict[tuple[str, str], float] = {}
    for (kind, _zone), (_stamp, price) in newest.items():
        out[(region, kind)] = min(price, out.get((region, kind), math.inf))
    return out


def fetch(
    regions: Sequence[str],
    fetched_at: str,
    *,
    pricing_endpoint_url: str | None = None,
    ec2_endpoint_url: str | None = None,
    access_key_id: str | None = None,
    secret_access_key: str | None = None,
    timeout_s: float = 30.0,
) -> FeedOffers:
    """Fetch on-demand and spot prices of the known GPU instance types in ``regions`` through boto3.

    Credentials: the given key pair, else boto3's own chain (environment, profile, instance role).
    """
    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError

    config = Config(connect_timeout=timeout_s, read_timeout=timeout_s, retries={"max_attempts": 3})
    credentials = {}
    if access_key_id and secret_access_key:
        credentials = {"aws_access_key_id": access_key_id, "aws_secret_access_key": secret_access_key}
    kinds = sorted(instance_types())
    try:
        pricing = boto3.client(
            "pricing", region_name=PRICING_REGION, endpoint_url=pricing_endpoint_url, config=config, **credentials
        )
        price_list: list[str] = []
        spot: dict[tuple[str, str], float] = {}
        for region in regions:
            pages = pricing.get_paginator("get_products").paginate(
                ServiceCode="AmazonEC2",
                Filters=[
                    {"Type": "TERM_MATCH", "Field": "regionCode", "Value": region},
                    {"Type": "TERM_MATCH", "Field": "instanceFamily", "Value": "GPU instance"},
                    {"Type": "TERM_MATCH", "Field": "operatingSystem", "Value": "Linux"},
                    {"Type": "TERM_MATCH", "Field": "tenancy", "Value": "Shared"},
                    {"Type": "TERM_MATCH", "Field": "preInstalledSw", "Value": "NA"},
                    {"Type": "TERM_MATCH", "Field": "capacitystatus", "Value": "Used"},
                ],
            )
            for page in pages:
                price_list.extend(page.get("PriceList", []))
            ec2 = boto3.client("ec2", region_name=region, endpoint_url=ec2_endpoint_url, config=config, **credentials)
            history: list[dict[str, Any]] = []
            spot_pages = ec2.get_paginator("describe_spot_price_history").paginate(
                InstanceTypes=kinds, ProductDescriptions=["Linux/UNIX"], StartTime=datetime.now(UTC)
            )
            for page in spot_pages:
                history.extend(page.get("SpotPriceHistory", []))
            spot.update(lowest_spot(history, region))
    except (BotoCoreError, ClientError) as exc:
        raise FeedError(scrub(f"{PROVIDER}: {exc}", [access_key_id, secret_access_key])) from None
    return parse_prices(price_list, spot, fetched_at)
