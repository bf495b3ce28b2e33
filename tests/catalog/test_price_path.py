"""Probes of the price path from a provider's answer to the offer a plan rents: each feed row is the provider's
price for the card, node size and region it names, and no row is planned on memory its card may not have."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.planner.run import benchmark_plan
from services.catalog.feeds import aws, vast
from services.catalog.offers import bundled_offers
from services.planner import Constraints, plan_setups
from services.planner.models import Recommendation
from tests.catalog.fakes import aws_product

WHEN = "2026-12-01T01:00:00Z"


def test_aws_p3dn_is_its_own_offer_of_the_32_gb_v100() -> None:
    """p3dn.24xlarge rents 8 x V100 32 GB (aws.amazon.com/ec2/instance-types/p3). It was read as the 16 GB V100, the
    same offer key as p3.16xlarge, so the cheaper p3.16xlarge ($24.48) was kept and p3dn's $31.212 was lost."""
    products = [
        aws_product("p3.16xlarge", "us-east-1", 24.48, memory="488 GiB"),
        aws_product("p3dn.24xlarge", "us-east-1", 31.212, memory="768 GiB"),
    ]
    rows = {r["gpu"]: r for r in aws.parse_prices(products, {}, WHEN).rows}
    assert set(rows) == {"V100 16GB", "V100 32GB"}
    p3dn = rows["V100 32GB"]
    assert (p3dn["gpus_per_node"], p3dn["on_demand_usd_per_hour"], p3dn["host_ram_gib_per_node"]) == (8, 3.9015, 768.0)
    assert "p3dn.24xlarge" in p3dn["source"] and p3dn["inter_node_gbit_per_s"] == 100
    assert rows["V100 16GB"]["on_demand_usd_per_hour"] == 3.06


def _vast(offer_id: int, name: str, **fields: Any) -> dict[str, Any]:
    return {"id": offer_id, "gpu_name": name, "num_gpus": 1, "dph_total": 0.6, "geolocation": "Texas, US", **fields}


def test_a_vast_offer_without_its_memory_is_not_read_as_the_larger_card() -> None:
    """Vast names the 40 and 80 GB A100 alike; an offer with no gpu_ram (or 0) was read as the 80 GB card, so a 40 GB
    A100 would be planned on 80 GB. It is skipped with a note; a V100 without memory is the 16 GB card, the smallest
    (as a price list's bare "V100" is)."""
    payload = {
        "offers": [
            _vast(1, "A100 PCIE"),
            _vast(2, "A100 SXM4", gpu_ram=0),
            _vast(3, "Tesla V100", dph_total=0.2),
            _vast(4, "A100 SXM4", gpu_ram=81920, dph_total=1.1),
        ]
    }
    out = vast.parse_bundles(payload, WHEN)
    assert [(r["gpu"], r["on_demand_usd_per_hour"]) for r in out.rows] == [("V100 16GB", 0.2), ("A100 80GB", 1.1)]
    assert out.skipped == {"A100 PCIE (memory not reported)", "A100 SXM4 (memory not reported)"}


def _planned_on(provider: str, method: str) -> list[Recommendation]:
    """Every setup (the top 200 and each card's first) the benchmark plan gets over the bundled list's offers of one
    provider."""
    plan = benchmark_plan(method)  # type: ignore[arg-type]
    result = plan_setups(plan, bundled_offers(), constraints=Constraints(providers=(provider,)), top_n=200)
    return [*result.recommendations, *result.best_per_gpu]


# Lambda's on-demand instance types and their price per GPU-hour (skypilot-org/skypilot-catalog
# catalogs/v7/lambda/vms.csv@11580132, the us-east-1 rows): an instance is rented whole.
LAMBDA_SIZES = {
    **{("A100 40GB", n): 1.29 for n in (1, 2, 4, 8)},
    **{("RTX A6000", n): 0.8 for n in (1, 2, 4)},
    ("H100 SXM", 1): 3.29,
    ("H100 SXM", 2): 3.19,
    ("H100 SXM", 4): 3.09,
    ("H100 SXM", 8): 2.99,
    ("A100 80GB", 8): 1.79,
    ("V100 16GB", 8): 0.55,
    ("A10", 1): 0.75,
    ("H100 PCIe", 1): 2.49,
}


@pytest.mark.parametrize("method", ["qlora", "full"])
def test_the_bundled_lambda_offers_rent_only_the_instances_lambda_sells(method: str) -> None:
    """The bundled rows of Lambda's 8-GPU instances were rentable per GPU: plans recommended 1 x H100 SXM at $2.99 an
    hour (Lambda's 1-GPU H100 SXM costs $3.29) and 1 of an 8 x A100 80GB or V100 instance, which Lambda does not sell.
    Every setup planned on Lambda is one of its instance types at that type's price."""
    setups = _planned_on("lambda", method)
    assert setups
    for rec in setups:
        assert (rec.gpu, rec.gpus) in LAMBDA_SIZES, (rec.gpu, rec.gpus)
        assert rec.price_usd_per_hour == pytest.approx(LAMBDA_SIZES[(rec.gpu, rec.gpus)] * rec.gpus), rec


# AWS's GPU instance types with the price per GPU-hour of the cheapest instance of each GPU count (skypilot-org/
# skypilot-catalog catalogs/v7/aws/vms.csv@001367d2, us-east-1): g5.xlarge / 12xlarge / 48xlarge, g6.*, g6e.* and the
# 8-GPU p4d, p4de, p5 and p5en. Every instance is rented whole; several of them make a multi-node job.
AWS_SIZES = {
    ("A10G", 1): 1.006,
    ("A10G", 4): 5.672 / 4,
    ("A10G", 8): 16.288 / 8,
    ("L4", 1): 0.8048,
    ("L4", 4): 4.6016 / 4,
    ("L4", 8): 13.3504 / 8,
    ("L40S", 1): 1.861,
    ("L40S", 4): 10.49264 / 4,
    ("L40S", 8): 30.13118 / 8,
    ("A100 40GB", 8): 4.096575,
    ("A100 80GB", 8): 5.120719,
    ("H100 SXM", 8): 12.29,
    ("H200", 8): 10.6,
}


@pytest.mark.parametrize("method", ["qlora", "full"])
def test_the_bundled_aws_offers_rent_only_the_instances_aws_sells(method: str) -> None:
    """The bundled g5 and g6 rows were the 8-GPU instance's price per GPU, rentable per GPU: a plan could rent 1 or 2
    of a g5.48xlarge's A10Gs at $2.036 each, where a g5.xlarge costs $1.006 and AWS sells no 2-GPU g5. Every setup
    planned on AWS is whole instances of one type at that type's price."""
    setups = _planned_on("aws", method)
    assert {rec.gpu for rec in setups} >= {"A10G", "L4", "L40S"}
    for rec in setups:
        key = (rec.gpu, rec.gpus_per_node)
        assert key in AWS_SIZES and rec.offer_gpus_per_node == rec.gpus_per_node, rec
        assert rec.price_usd_per_hour == pytest.approx(AWS_SIZES[key] * rec.gpus, abs=5e-5), rec  # shown to 4 places
