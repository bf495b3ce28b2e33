"""A Market is the price list's offers as a tuple that keeps the columns plans read of them: the same answers as
reading the offers one by one, kept across plans, and plans over it the same as over the plain offers."""

from __future__ import annotations

import dataclasses
import math
import pickle

import numpy as np

from benchmarks.planner.run import benchmark_plan, generated_catalog
from services.catalog.gpus import gpu_specs
from services.catalog.market import DERIVED_KEYS, Market, as_market
from services.catalog.offers import bundled_offers
from services.planner import Constraints, plan_setups
from services.planner.planner import plan_context
from services.planner.scan import scan_offers


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


def test_derived_tables_are_worked_out_once_per_key_bounded_and_not_pickled() -> None:
    market = Market(generated_catalog(20, seed=2))
    calls: list[int] = []

    def table(n: int) -> list[int]:
        calls.append(n)
        return [n]

    assert market.derived(("t", 0), lambda: table(0)) == [0]
    assert market.derived(("t", 0), lambda: table(0)) == [0] and calls == [0]  # kept, not worked out again
    for n in range(1, DERIVED_KEYS + 1):
        market.derived(("t", n), lambda n=n: table(n))
    for n in range(1, DERIVED_KEYS + 1):  # the newest are kept
        assert market.derived(("t", n), lambda: table(-1)) == [n]
    assert market.derived(("t", 0), lambda: table(0)) == [0] and calls.count(0) == 2  # the oldest was dropped
    assert -1 not in calls
    again = pickle.loads(pickle.dumps(market))
    assert again == market and again.derived(("t", 1), lambda: table(-1)) == [-1]  # worked out where it landed


def test_plans_over_one_market_with_other_gpu_tables_and_unknown_cards() -> None:
    # The offers' grouping by card and node shape is kept with the market per GPU spec table; a plan with another
    # table, or that cannot run some cards (precision), must see nothing of an earlier plan's.
    offers = generated_catalog(400, seed=12)
    odd = dataclasses.replace(offers[5], gpu="Quantum GPU 9000")
    offers = (*offers, odd)
    market = Market(offers)
    fewer = tuple(spec for spec in gpu_specs() if spec.name != gpu_specs()[0].name)
    cases = [
        (benchmark_plan("lora"), None),
        (benchmark_plan("lora"), fewer),
        (benchmark_plan("full", precision="fp16-mixed"), None),
        (benchmark_plan("full"), fewer),
        (benchmark_plan("lora"), None),
    ]
    for plan, specs in cases:
        over_market = plan_setups(plan, market, specs=specs)
        assert over_market == plan_setups(plan, tuple(offers), specs=specs)
        assert any(r.kind == "unknown_gpu" for r in over_market.rejections)
    scan = scan_offers(plan_context(benchmark_plan("lora"), Constraints())[1], market, gpu_specs())
    assert not scan.groups[0].indices.flags.writeable  # shared by every plan over the market
