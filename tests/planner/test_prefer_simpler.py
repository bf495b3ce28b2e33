"""The simpler-first rule (constraints.prefer_simpler_within) on small tables of priced setups, and through the
planner on two offers."""

from __future__ import annotations

import itertools
import random
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError

from services.catalog.offers import Offer
from services.planner import Constraints, plan_setups
from services.planner.context import Entry
from services.planner.simpler import complexity, is_simpler, prefer_simpler
from tests.conftest import make_plan


def entry(
    cost: float,
    gpus: int = 1,
    nodes: int = 1,
    spot: bool = False,
    offload: bool = False,
    speed: float = 1000.0,
    host_ram_gib: float | None = 512.0,
    card: str = "A40",
) -> Entry:
    """A priced setup with only what the ranking reads (the rule does not look at anything else)."""
    offer = SimpleNamespace(provider="p", gpus_per_node=8, host_ram_gib_per_node=host_ram_gib)
    candidate: Any = SimpleNamespace(
        layout=SimpleNamespace(gpus=gpus, nodes=nodes, gpus_per_node=gpus // nodes),
        cfg=SimpleNamespace(cpu_offload=offload),
        spec=SimpleNamespace(name=card),
        offer=offer,
        setup=SimpleNamespace(host_ram_bytes_per_node=100 * 2**30 if offload else 0.0),
        throughput=SimpleNamespace(data_tokens_per_s=speed),
    )
    run: Any = SimpleNamespace(expected_cost_usd=cost, pricing="spot" if spot else "on_demand")
    return Entry(candidate, run)


def ranked(entries: list[Entry], tolerance: float = 0.10) -> list[Entry]:
    return prefer_simpler(sorted(entries, key=lambda e: e.cost.expected_cost_usd), tolerance)


def costs(entries: list[Entry]) -> list[float]:
    return [e.cost.expected_cost_usd for e in entries]


def test_a_multi_gpu_spot_setup_within_the_tolerance_ranks_below_the_single_card() -> None:
    # The case: 8 x A100 40GB spot $3.46 against 1 x A40 on demand $3.80 (9% cheaper).
    out = ranked([entry(3.46, gpus=8, spot=True, card="A100 40GB"), entry(3.80)])
    assert costs(out) == [3.80, 3.46]
    assert any("8 x A100 40GB spot at p at $3.46" in n and "only 9% cheaper" in n for n in out[0].tail), out[0].tail
    assert out[1].tail == ()


def test_more_than_the_tolerance_cheaper_ranks_first_and_names_the_simpler_cost() -> None:
    out = ranked([entry(3.00, gpus=8, spot=True), entry(3.80)])
    assert costs(out) == [3.00, 3.80]
    assert any("the simpler 1 x A40 on demand at p costs $3.80" in n and "21% cheaper" in n for n in out[0].tail)


@pytest.mark.parametrize(
    ("tolerance", "order"),
    [
        (0.0, [3.46, 3.80]),
        (0.05, [3.46, 3.80]),
        (0.08, [3.46, 3.80]),
        (0.09, [3.80, 3.46]),
        (0.10, [3.80, 3.46]),
        (1.0, [3.80, 3.46]),
    ],
)
def test_the_tolerance_is_the_users(tolerance: float, order: list[float]) -> None:
    assert costs(ranked([entry(3.46, gpus=2), entry(3.80)], tolerance)) == order


def test_setups_of_which_neither_is_simpler_keep_their_cost_order() -> None:
    # 2 GPUs on demand and 1 GPU on spot: each is more complex in one respect.
    two, spot = entry(3.00, gpus=2), entry(3.10, spot=True)
    assert not is_simpler(complexity(two), complexity(spot)) and not is_simpler(complexity(spot), complexity(two))
    assert costs(ranked([spot, two])) == [3.00, 3.10]


def test_every_pair_of_a_random_table_obeys_the_rule() -> None:
    rng = random.Random(22)
    for _ in range(200):
        table = [
            entry(
                round(rng.uniform(1.0, 2.0), 2),
                gpus=rng.choice([1, 2, 4, 8]),
                nodes=rng.choice([1, 1, 2]),
                spot=rng.random() < 0.5,
                offload=rng.random() < 0.2,
            )
            for _ in range(rng.randint(1, 12))
        ]
        out = ranked(table)
        assert sorted(costs(out)) == sorted(costs(table))
        for a, b in itertools.combinations(out, 2):
            # a ranks above b; if b is simpler, a must be cheaper by more than 10%.
            if is_simpler(complexity(b), complexity(a)):
                assert a.cost.expected_cost_usd < 0.9 * b.cost.expected_cost_usd, (costs(out), a, b)


def test_with_top_n_the_order_stops_once_the_planner_has_what_it_reads() -> None:
    # The planner reads the first N (each card's first is the first of its card's own ranking, top_n 1): with top_n,
    # the result is the whole order's first N, notes included; the offload cautions are as in the whole order.
    rng = random.Random(5)
    for _ in range(200):
        table = _random_table(rng)
        top_n = rng.randint(1, 5)
        assert prefer_simpler(table, 0.10, top_n) == prefer_simpler(table, 0.10)[:top_n]


def _random_table(rng: random.Random) -> list[Any]:
    return sorted(
        (
            entry(
                round(rng.uniform(1.0, 2.0), 2),
                gpus=rng.choice([1, 2, 4, 8]),
                spot=rng.random() < 0.5,
                offload=rng.random() < 0.3,
                card=rng.choice(["A40", "L4", "H100"]),
                speed=rng.choice([100.0, 1000.0]),
            )
            for _ in range(rng.randint(1, 14))
        ),
        key=lambda e: e.cost.expected_cost_usd,
    )


def test_unverified_host_ram_and_slow_offload_say_so_in_the_first_line() -> None:
    slow = entry(1.00, offload=True, speed=50.0, host_ram_gib=None)
    fast = entry(5.00, gpus=16, nodes=2, speed=10_000.0, card="H100 SXM")
    out = ranked([slow, fast])
    first = out[0]
    assert first.candidate.cfg.cpu_offload
    assert first.lead[0].startswith("caution, CPU offload: host RAM unverified")
    assert "slow: 50 tokens/s, under a quarter of the 10,000 tokens/s of 16 x H100 SXM on 2 nodes" in first.lead[0]
    # A verified, fast enough offload setup gets no caution.
    fine = ranked([entry(1.00, offload=True, speed=4000.0), fast])
    assert fine[0].lead == ()


def test_the_tolerance_is_validated_and_named() -> None:
    assert Constraints().prefer_simpler_within == 0.10
    for bad in (-0.1, 1.5):
        with pytest.raises(ValidationError, match="prefer_simpler_within"):
            Constraints(prefer_simpler_within=bad)


def _offer(provider: str, price: float, spot: float | None) -> Offer:
    return Offer(provider, "A100 80GB", 8, price, spot, "USD", "eu", "DE", "NVSwitch", "2026-11-01", "test", False, 400)


def test_through_the_planner_the_first_pick_is_simpler_unless_clearly_cheaper() -> None:
    plan = make_plan(method="qlora", seq_len=512, data={"examples": 2000, "avg_tokens_per_example": 512})
    offers = [_offer("plain", 2.0, None), _offer("cheap-spot", 2.0, 0.2)]
    result = plan_setups(plan, offers, None, Constraints(), top_n=50)
    first = result.recommendations[0]
    simplest = [r for r in result.recommendations if r.gpus == 1 and r.pricing == "on_demand" and not r.cpu_offload]
    assert simplest
    if (first.gpus, first.nodes, first.pricing, first.cpu_offload) != (1, 1, "on_demand", False):
        assert first.expected_cost_usd < 0.9 * min(r.expected_cost_usd for r in simplest)
        assert any(
            "the simpler" in n and f"${min(r.expected_cost_usd for r in simplest):,.2f}" in n for n in first.notes
        )
    assert any("prefer_simpler_within" in a for a in result.assumptions)


def test_the_ranking_notes_are_listed_apart_and_in_the_notes() -> None:
    plan = make_plan(method="qlora", seq_len=512, data={"examples": 2000, "avg_tokens_per_example": 512})
    offers = [_offer("plain", 2.0, None), _offer("cheap-spot", 2.0, 0.2)]
    recs = plan_setups(plan, offers, None, Constraints(), top_n=50).recommendations
    assert any(r.ranking_notes for r in recs)
    for r in recs:
        assert all(n in r.notes for n in r.ranking_notes)
        assert all("prefer_simpler_within" in n or n.startswith("caution") for n in r.ranking_notes)
