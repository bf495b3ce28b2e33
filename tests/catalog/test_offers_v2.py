"""The Offer schema v2 on the pure side: the dataclass defaults, the parser, the bundled rows."""

from __future__ import annotations

from importlib import resources

import pytest

from services.catalog.gpus import find_gpu
from services.catalog.offers import Offer, OfferParseError, bundled_offers, parse_offers

V1 = (
    "provider,gpu,gpus_per_node,on_demand_usd_per_hour,spot_usd_per_hour,currency,region,country,interconnect,"
    "fetched_at,source\nacme,A40,1,0.74,,USD,eu,DE,PCIe,2026-11-01,test\n"
)
V2_HEADER = V1.splitlines()[0] + (
    ",whole_nodes_only,inter_node_gbit_per_s,billing_increment_s,billing_minimum_s,startup_s,"
    "download_gbit_per_s,preemption_per_hour"
)


def test_old_positional_offers_keep_working_with_the_defaults() -> None:
    o = Offer("acme", "A40", 8, 1.0, None, "USD", "eu", "DE", "PCIe", "2026-11-01", "test")
    assert (o.whole_nodes_only, o.inter_node_gbit_per_s, o.billing_increment_s, o.billing_minimum_s) == (
        False,
        None,
        1,
        0,
    )
    assert o.startup_s is None and o.download_gbit_per_s is None and o.preemption_per_hour is None


def test_schema_1_files_parse_with_defaults() -> None:
    (o,) = parse_offers(V1)
    assert o.gpus_per_node == 1 and o.inter_node_gbit_per_s is None and o.billing_increment_s == 1


def test_schema_2_columns_are_read() -> None:
    text = (
        V2_HEADER
        + "\nacme,H100 SXM,8,3.0,1.0,USD,us,US,NVSwitch,2026-11-01T06:00:00Z,test,true,3200,60,600,90,25,0.01\n"
    )
    (o,) = parse_offers(text)
    assert o.whole_nodes_only and o.inter_node_gbit_per_s == 3200.0
    assert (o.billing_increment_s, o.billing_minimum_s, o.startup_s) == (60, 600, 90.0)
    assert (o.download_gbit_per_s, o.preemption_per_hour, o.fetched_at) == (25.0, 0.01, "2026-11-01T06:00:00Z")


@pytest.mark.parametrize(
    ("cells", "column"),
    [
        ("maybe,,1,0,,,", "whole_nodes_only"),
        ("false,-5,1,0,,,", "inter_node_gbit_per_s"),
        ("false,,0,0,,,", "billing_increment_s"),
        ("false,,1.5,0,,,", "billing_increment_s"),
        ("false,,1,-1,,,", "billing_minimum_s"),
        ("false,,1,0,abc,,", "startup_s"),
        ("false,,1,0,,,nan", "preemption_per_hour"),
    ],
)
def test_bad_cells_name_the_row_and_column(cells: str, column: str) -> None:
    text = V2_HEADER + f"\nacme,A40,8,1.0,,USD,eu,DE,PCIe,2026-11-01,test,{cells}\n"
    with pytest.raises(OfferParseError) as info:
        parse_offers(text)
    assert info.value.row == 1 and info.value.column == column


def test_bundled_offers_are_schema_2_with_known_cards_and_sourced_rows() -> None:
    offers = bundled_offers()
    text = resources.files("services.catalog").joinpath("data/offers.csv").read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line and not line.startswith("#")][1:]
    assert len(offers) == len(rows)
    # A dated snapshot of real providers' lists (issue 22 item 5): every row sourced and dated, no example provider.
    providers = {o.provider for o in offers}
    assert {"cloudrux", "aws", "gcp", "azure", "lambda", "runpod", "vast"} <= providers
    assert not any("example" in p for p in providers)
    for o in offers:
        find_gpu(o.gpu)
        assert 1 <= o.gpus_per_node <= 8 and o.source and o.fetched_at
        assert o.provider == "cloudrux" or "skypilot-org/skypilot-catalog" in o.source
    aws = [o for o in offers if o.provider == "aws"]
    assert all(o.billing_minimum_s == 60 for o in aws)
    # Spot preemption rates come from the planner's sourced table (services/planner/spot.py), never a row's guess.
    assert all(o.preemption_per_hour is None for o in offers if o.spot_usd_per_hour is not None)
    assert all(o.whole_nodes_only for o in aws)  # an instance is rented whole (tests/catalog/test_price_path.py)
    # The p5.48xlarge: 8 x H100 with 2048 GiB and 3200 Gbit/s EFA; its spot price below the on-demand one.
    p5 = next(o for o in aws if o.gpu == "H100 SXM")
    assert (p5.host_ram_gib_per_node, p5.inter_node_gbit_per_s) == (2048, 3200)
    assert p5.spot_usd_per_hour is not None and p5.spot_usd_per_hour < p5.on_demand_usd_per_hour
    assert all(o.inter_node_gbit_per_s is None for o in offers if o.provider == "cloudrux")


@pytest.mark.parametrize(
    ("name", "spec"),
    [
        ("RTX 3090", "RTX 3090"),
        ("GeForce RTX 5090", "RTX 5090"),
        ("RTX 6000 Ada", "RTX 6000 Ada"),
        ("L40", "L40"),
        ("V100", "V100 16GB"),
        ("V100 32GB", "V100 32GB"),
        ("H100 PCIe", "H100 PCIe"),
        ("H100 NVL", "H100 NVL"),
        ("GH200", "GH200"),
        ("MI300X", "MI300X"),
    ],
)
def test_new_gpu_specs_are_found_and_sourced(name: str, spec: str) -> None:
    found = find_gpu(name)
    assert found.name == spec and found.source and found.memory_gib > 0 and found.hbm_bandwidth_gb_per_s > 0
