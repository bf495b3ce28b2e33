"""The ranking prices only part of a catalog; what the user sees must be what pricing all of it gives.

Over small generated catalogs (seeded) with varied plans and constraints, ``plan_setups`` is compared with the same
planner made to price every entry (``ranking._widening`` infinite: no entry's bound stops the pricing), and with
itself at other ``top_n``: the recommendations (their notes included) and each card's first. A planner probe of
stop 52 found the notes of the first recommendation changing with ``top_n`` in 17 of 40 plans: they named the
cheapest simpler setup among those priced, and one left unpriced could be cheaper; and each card's first carried
the whole ranking's notes where it ranked in the top N, its card's own elsewhere.
"""

from __future__ import annotations

import json
import math
import random
from typing import Any

import pytest

from benchmarks.planner.run import benchmark_plan, generated_catalog
from services.catalog.market import Market
from services.planner import Constraints, plan_setups, ranking

PLANS = 24


def _case(seed: int) -> tuple[Market, Any, Constraints]:
    rnd = random.Random(seed)
    offers = Market(generated_catalog(rnd.choice((40, 120, 300)), seed=rnd.randrange(10_000)))
    plan = benchmark_plan(
        rnd.choice(("qlora", "lora", "full")),
        rnd.choice(("meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-70B", "Qwen/Qwen2.5-7B")),
    )
    fields: dict[str, Any] = {}
    if rnd.random() < 0.5:
        fields["prefer_simpler_within"] = rnd.choice((0.0, 0.05, 0.2, 0.3))
    if rnd.random() < 0.3:
        fields["spot_allowed"] = False
    if rnd.random() < 0.2:
        fields["budget_usd"] = rnd.choice((5.0, 20.0, 100.0))
    if rnd.random() < 0.2:
        fields["preemptions_per_hour"] = rnd.choice((0.1, 0.5, 2.0))
    return offers, plan, Constraints(**fields)


def _shown(result: Any, top_n: int) -> dict[str, Any]:
    out = json.loads(result.model_dump_json())
    return {"recommendations": out["recommendations"][:top_n], "best_per_gpu": out["best_per_gpu"]}


@pytest.mark.parametrize("seed", range(PLANS))
def test_what_is_shown_is_what_pricing_every_entry_shows(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    offers, plan, constraints = _case(seed)
    pruned = {top_n: plan_setups(plan, offers, constraints=constraints, top_n=top_n) for top_n in (1, 3, 10)}
    first = _shown(pruned[1], 1)
    for top_n, result in pruned.items():
        assert _shown(result, 1) == first, f"the first recommendation or a card's first changed with top_n={top_n}"
    monkeypatch.setattr(ranking, "_widening", lambda tolerance, chain: math.inf)
    for top_n in (1, 10):
        everything = plan_setups(plan, offers, constraints=constraints, top_n=top_n)
        assert _shown(pruned[top_n], top_n) == _shown(everything, top_n)


def test_the_cases_reach_notes_that_name_other_setups() -> None:
    # The comparison above is only as good as the notes it meets: simpler-setup notes and offload cautions.
    notes = []
    for seed in range(PLANS):
        offers, plan, constraints = _case(seed)
        result = plan_setups(plan, offers, constraints=constraints)
        notes += [note for rec in [*result.recommendations, *result.best_per_gpu] for note in rec.ranking_notes]
    assert any(n.startswith("the simpler ") for n in notes)
    assert any("caution, CPU offload" in n and "under a quarter" in n for n in notes)
