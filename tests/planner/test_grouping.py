"""Offers are grouped before they are searched: by node shape, and by layout (network, host RAM) only where the
search reads them. Every offer must get the setups its own search gives it, however it was grouped."""

from __future__ import annotations

import math

import pytest

from benchmarks.planner.run import benchmark_plan, generated_catalog
from services.catalog.gpus import gpu_specs
from services.catalog.market import Market
from services.estimator.communication import links_for
from services.planner import Constraints
from services.planner.batching import batch_split
from services.planner.context import PlanContext
from services.planner.evaluator import Config, Evaluator
from services.planner.layouts import Layout
from services.planner.planner import plan_context
from services.planner.scan import scan_offers
from services.planner.search import layout_setups, offer_search, shape_key

OFFERS = Market(generated_catalog(600, seed=11))


@pytest.mark.parametrize(
    ("method", "model"),
    [("qlora", "meta-llama/Llama-3.1-8B"), ("full", "meta-llama/Llama-3.1-8B"), ("full", "meta-llama/Llama-3.1-70B")],
)
def test_each_offer_gets_the_setups_of_its_own_search(method: str, model: str) -> None:
    plan = benchmark_plan(method, model)  # type: ignore[arg-type]
    _, ctx = plan_context(plan, Constraints())
    scan = scan_offers(ctx, OFFERS, gpu_specs())
    _, alone = plan_context(plan, Constraints())  # a fresh search per offer: nothing kept from the grouped one
    fitting = 0
    for group in scan.groups:
        for index in group.indices.tolist():
            offer = OFFERS[index]
            own = offer_search(alone, offer, group.spec, shape_key(alone, group.spec, offer))[0]
            assert [(s.layout, s.cfg, s.training_s) for s in group.setups] == [
                (s.layout, s.cfg, s.training_s) for s in own
            ], (offer, group.spec.name)
            fitting += bool(own)
    assert fitting  # the plan fits somewhere


def test_a_shape_that_one_node_settles_is_one_group_whatever_its_networks_and_host_ram() -> None:
    # 8B QLoRA fits one GPU of every card it can run on: one node settles every shape.
    _, ctx = plan_context(benchmark_plan("qlora"), Constraints())
    scan = scan_offers(ctx, OFFERS, gpu_specs())
    shapes = []
    for g in scan.groups:
        first = OFFERS[int(g.indices[0])]
        shapes.append(
            (g.spec.name, ctx.link_kind(g.spec, first.interconnect), first.gpus_per_node, first.whole_nodes_only)
        )
        assert {shapes[-1]} == {
            (g.spec.name, ctx.link_kind(g.spec, o.interconnect), o.gpus_per_node, o.whole_nodes_only)
            for o in map(OFFERS.__getitem__, g.indices.tolist())
        }
    assert len(shapes) == len(set(shapes))  # one group per shape
    mixed = [g for g in scan.groups if len({OFFERS[i].inter_node_gbit_per_s for i in g.indices.tolist()}) > 1]
    assert mixed and any(len({OFFERS[i].host_ram_gib_per_node for i in g.indices.tolist()}) > 1 for g in mixed)


@pytest.mark.parametrize("method", ["qlora", "full"])
def test_the_padded_micro_batch_is_the_fastest_on_the_setups_links(
    method: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Under padding to the longest sample the search keeps, per sharding and checkpointing, the fitting micro-batch
    # that consumes the data fastest on the setup's own links, estimating a smaller one only where its ceiling (any
    # links) beats the best rate found. The choice must be brute force's (every fitting micro-batch estimated on the
    # links), and the ceiling above the rate on every kind of link.
    plan = benchmark_plan(method)  # type: ignore[arg-type]
    specs = [s for s in gpu_specs() if s.bf16_tflops]
    shapes = [(Layout(gpus, 1), kind, None) for gpus in (1, 2, 4, 8) for kind in ("", "PCIe")] + [
        (Layout(4, 2), "", gbit) for gbit in (100.0, 3200.0)
    ]
    every = [
        (spec, layout, links_for(spec, layout.gpus_per_node, layout.nodes, kind, gbit))
        for spec in specs
        for layout, kind, gbit in shapes
    ]

    def choices(ctx: PlanContext) -> list[list[Config]]:
        return [[s.cfg for s in layout_setups(ctx, spec, layout, links)] for spec, layout, links in every]

    _, ctx = plan_context(plan, Constraints())
    assert ctx.evaluator.padding_varies
    chosen = choices(ctx)
    _, reference = plan_context(plan, Constraints())
    monkeypatch.setattr(Evaluator, "data_tokens_per_s_ceiling", lambda self, cfg, spec: math.inf)
    assert chosen == choices(reference)
    monkeypatch.undo()

    # The bound is used: fewer full estimates than estimating every micro-batch.
    assert len(ctx.evaluator._throughput) < len(reference.evaluator._throughput)
    ev = ctx.evaluator
    for (spec, _, links), configs in zip(every, chosen, strict=True):
        for cfg in configs:
            split = batch_split(ctx.effective_batch_size, cfg.gpus)
            for m in split.micro_batch_sizes:
                other = cfg._replace(micro_batch_size=m, accumulation_steps=split.accumulation_steps(m))
                rate = ev.throughput(other, spec, links).data_tokens_per_s
                assert ev.data_tokens_per_s_ceiling(other, spec) >= rate
                if ev.sized_bytes(other) <= ctx.usable_bytes(spec):  # brute force: none that fits is faster
                    assert rate <= ev.throughput(cfg, spec, links).data_tokens_per_s, (spec.name, links, cfg, m)
