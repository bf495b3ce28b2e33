"""A Market is the price list's offers as a tuple that keeps the columns plans read of them: the same answers as
reading the offers one by one, kept across plans, and plans over it the same as over the plain offers."""

from __future__ import annotations

import dataclasses
import math
import pickle

import numpy as np

from benchmarks.planner.run import benchmark_plan, generated_catalog
from services.catalog.market import Market, as_market
from services.catalog.offers import bundled_offers
from services.planner import Constraints, plan_setups


def test_codes_number_distinct_values_in_order_of_first_offer() -> None:
    offers = generated_catalog(500, seed=3)
    market = Market(offers)
    ids, values = market.codes(("gpu", "gpus_per_node"))
    assert len(ids) == len(offers)
    assert [values[i] for i in ids.tolist()] == [(o.gpu, o.gpus_per_node) for o in offers]
    firsts = [ids.tolist().index(code) for code in range(len(values))]
    assert firsts == sorted(firsts)
    one, providers = market.codes(("provider",))
    assert [providers[i] for i in one.tolist()] == [(o.provider,) for o in offers]
    assert market.codes(("provider",))[0] is one  # kept, not read again


def test_floats_are_the_offers_numbers_with_none_as_nan() -> None:
    offers = generated_catalog(300, seed=4)
    market = Market(offers)
    columns = market.floats(("spot_usd_per_hour", "host_ram_gib_per_node"))
    for name, column in columns.items():
        for value, offer in zip(column.tolist(), offers, strict=True):
            expected = getattr(offer, name)
            assert math.isnan(value) if expected is None else value == expected
    assert market.floats(("spot_usd_per_hour",))["spot_usd_per_hour"] is columns["spot_usd_per_hour"]


def test_a_market_is_its_offers_as_a_tuple() -> None:
    offers = bundled_offers()
    market = Market(offers)
    assert market == offers and tuple(market) == offers and market[3] is offers[3] and len(market) == len(offers)
    assert as_market(market) is market
    assert isinstance(as_market(list(offers)), Market)
    market.codes(("gpu",))
    again = pickle.loads(pickle.dumps(market))
    assert again == market and np.array_equal(again.codes(("gpu",))[0], market.codes(("gpu",))[0])
    empty = Market()
    assert len(empty) == 0 and len(empty.codes(("gpu",))[0]) == 0
    assert len(empty.floats(("startup_s",))["startup_s"]) == 0


def test_plans_over_one_market_are_the_plans_over_the_plain_offers() -> None:
    # Columns a plan reads are kept with the market: later plans (other methods, other filters) must not see
    # anything of the earlier ones.
    offers = generated_catalog(600, seed=9)
    market = Market(offers)
    cases = [
        (benchmark_plan("qlora"), Constraints()),
        (benchmark_plan("full", "meta-llama/Llama-3.1-70B"), Constraints(budget_usd=40.0)),
        (benchmark_plan("lora"), Constraints(providers=["provider-3", "provider-7"], regions=["region-2"])),
        (benchmark_plan("full", precision="fp16-mixed"), Constraints(spot_allowed=False)),
        (benchmark_plan("qlora"), Constraints()),
    ]
    for plan, constraints in cases:
        over_market = plan_setups(plan, market, constraints=constraints)
        over_tuple = plan_setups(plan, tuple(offers), constraints=constraints)
        assert over_market == over_tuple
        assert over_market.recommendations


def test_an_unknown_card_is_rejected_by_name_over_a_market() -> None:
    offers = generated_catalog(50, seed=1)
    odd = dataclasses.replace(offers[0], gpu="Quantum GPU 9000")
    result = plan_setups(benchmark_plan("qlora"), Market((*offers, odd, odd)))
    unknown = [r for r in result.rejections if r.kind == "unknown_gpu"]
    assert len(unknown) == 2 and unknown[0].gpu == "Quantum GPU 9000"
    assert sum("Quantum GPU 9000" in w for w in result.warnings) == 2
