"""The exact setup a quote prices (services/planner/exact.py): the counts an offer rents, and the same
numbers as the planner's ranking for every setup it ranked (pure: no fixtures)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest

from services.catalog.offers import Offer, bundled_offers
from services.planner.constraints import Constraints
from services.planner.errors import PlannerError
from services.planner.exact import nearest_counts, offer_layout, price_exact_setup
from services.planner.layouts import Layout
from services.planner.planner import plan_setups
from services.plans.schemas import PlanRequest

PER_GPU = Offer("acme", "H100 SXM", 8, 3.0, None, "USD", "eu", "DE", "NVSwitch", "2026-12-01", "test")
NODES = dataclasses.replace(PER_GPU, provider="nodes", whole_nodes_only=True, inter_node_gbit_per_s=400.0)
LONE = dataclasses.replace(PER_GPU, provider="lone", whole_nodes_only=True)


def test_the_counts_an_offer_rents() -> None:
    # Per GPU: any count on one node; whole nodes: multiples of the node over the network; no network: one node.
    assert [offer_layout(PER_GPU, n) for n in (1, 3, 8)] == [Layout(1, 1), Layout(3, 1), Layout(8, 1)]
    assert offer_layout(PER_GPU, 16) is None
    assert offer_layout(NODES, 3) is None and offer_layout(NODES, 24) == Layout(8, 3)
    assert offer_layout(LONE, 8) == Layout(8, 1) and offer_layout(LONE, 16) is None
    assert nearest_counts(NODES, 12) == (8, 16) and nearest_counts(NODES, 3) == (8,)
    assert nearest_counts(PER_GPU, 12) == (8,) and nearest_counts(LONE, 5) == (8,)


_DATA = {"gradient_checkpointing": True, "dataset": {"examples": 10_000, "avg_tokens": 512}, "epochs": 3}
PLANS: dict[str, dict[str, object]] = {
    # The catalog of plans: a 4k-token LoRA, a 70B QLoRA, a small full fine-tune, and a 671B MoE QLoRA
    # that needs several nodes or offload.
    "Mistral-7B LoRA 4k": {
        **_DATA,
        "model": {"name": "mistralai/Mistral-7B-v0.1"},
        "method": "lora",
        "micro_batch_size": 1,
        "seq_len": 4096,
    },
    "70B QLoRA": {**_DATA, "model": {"name": "meta-llama/Llama-3.1-70B"}, "method": "qlora", "micro_batch_size": 1},
    "Qwen2.5-0.5B full": {
        **_DATA,
        "model": {"name": "Qwen/Qwen2.5-0.5B"},
        "method": "full",
        "micro_batch_size": 8,
        "seq_len": 1024,
    },
    "DeepSeek-V3 QLoRA": {
        **_DATA,
        "model": {"name": "deepseek-ai/DeepSeek-V3"},
        "method": "qlora",
        "micro_batch_size": 1,
    },
    "8B QLoRA": {
        "model": {"name": "meta-llama/Llama-3.1-8B"},
        "method": "qlora",
        "micro_batch_size": 4,
        "seq_len": 512,
        "gradient_checkpointing": True,
        "dataset": {"examples": 10_000, "avg_tokens": 512},
        "epochs": 3,
    },
    "70B full": {
        "model": {"name": "meta-llama/Llama-3.1-70B"},
        "method": "full",
        "micro_batch_size": 1,
        "seq_len": 2048,
        "gradient_checkpointing": True,
        "dataset": {"examples": 1000, "avg_tokens": 1024},
        "epochs": 1,
    },
}


@pytest.mark.parametrize("name", sorted(PLANS))
def test_every_ranked_setup_prices_as_the_planner_ranked_it(name: str) -> None:
    plan = PlanRequest.model_validate(PLANS[name]).to_plan()
    now = datetime(2026, 12, 2, tzinfo=UTC)
    offers = bundled_offers()
    ranked = plan_setups(plan, offers, constraints=Constraints(), now=now, top_n=30).recommendations
    assert ranked
    for rec in ranked:
        mine = [o for o in offers if (o.provider, o.region) == (rec.provider, rec.region)]
        exact = price_exact_setup(
            plan, mine, rec.gpu, rec.gpus, rec.pricing, Constraints(), nodes=rec.nodes, now=now
        ).recommendation
        # The ranking's notes compare a setup with the others ranked beside it; priced alone it has none
        # (a quote takes them from the stored plan: services/quotes/service.py).
        alone = [n for n in rec.notes if n not in rec.ranking_notes]
        assert exact == rec.model_copy(update={"notes": alone, "ranking_notes": []})


def test_bad_setups_name_the_field() -> None:
    plan = PlanRequest.model_validate(PLANS["8B QLoRA"]).to_plan()
    with pytest.raises(PlannerError) as count:
        price_exact_setup(plan, [NODES], "H100 SXM", 12, "on_demand", Constraints())
    assert count.value.field == "gpus" and "8 or 16" in count.value.message
    with pytest.raises(PlannerError) as nodes:
        price_exact_setup(plan, [NODES], "H100 SXM", 16, "on_demand", Constraints(), nodes=4)
    assert nodes.value.field == "nodes"
    with pytest.raises(PlannerError) as spot:
        price_exact_setup(plan, [PER_GPU], "H100 SXM", 2, "spot", Constraints())
    assert spot.value.field == "spot"
    with pytest.raises(PlannerError) as card:
        price_exact_setup(plan, [PER_GPU], "A40", 1, "on_demand", Constraints())
    assert card.value.field == "gpu"


def test_the_offer_priced_is_the_one_named() -> None:
    """Two offers of one provider, card, region and node size differing only in billing minimum and source: the exact
    setup rents the one without a minimum (the cheaper run), and names that offer, not the first that matches (a quote
    printed the other one's source)."""
    plan = PlanRequest.model_validate(PLANS["8B QLoRA"]).to_plan()
    monthly = dataclasses.replace(PER_GPU, source="monthly contract", billing_minimum_s=30 * 86_400)
    per_second = dataclasses.replace(PER_GPU, source="per second")
    rec, _, offer = price_exact_setup(plan, [monthly, per_second], "H100 SXM", 1, "on_demand", Constraints())
    assert offer is per_second
    assert rec.cost_breakdown["billing_rounding"] < 1.0, rec.cost_breakdown
