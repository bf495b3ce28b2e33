"""Brute force against the planner's pruning (services/planner/search.py module docstring).

For a plan, card and layout, every configuration the search could choose (sharding in the layout's options, gradient
checkpointing on/off, every micro-batch dividing the per-GPU samples; CPU offload only where nothing fits without it)
is evaluated with the planner's own evaluator: fit = ``Evaluator.sized_bytes(cfg) <= ctx.usable_bytes(spec)``, speed =
``Evaluator.throughput(cfg, spec, links).data_tokens_per_s`` on the layout's links. ``layout_setups`` must keep a
configuration as fast as the fastest that fits. Each case was a probe's finding: its docstring gives the numbers the
search gave before it was mended (stop 55).
"""

from __future__ import annotations

from benchmarks.planner.run import benchmark_plan
from services.catalog.gpus import find_gpu
from services.catalog.offers import Offer, bundled_offers
from services.planner import plan_setups
from services.planner.batching import batch_split, config_for
from services.planner.constraints import Constraints
from services.planner.layouts import OFFLOAD_SHARDINGS, Layout, sharding_options
from services.planner.planner import plan_context
from services.planner.ranking import price_setup
from services.planner.search import _setup, layout_setups

L8, L70 = "meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-70B"
REL = 1e-9  # floating-point noise


def _offer(card: str, per_node: int, interconnect: str, inter: float | None = None) -> Offer:
    return Offer(
        provider="p",
        gpu=card,
        gpus_per_node=per_node,
        on_demand_usd_per_hour=2.0,
        spot_usd_per_hour=None,
        currency="USD",
        region="r",
        country="",
        interconnect=interconnect,
        fetched_at="2026-11-01",
        source="t",
        inter_node_gbit_per_s=inter,
    )


def _planner_and_brute(plan, card: str, layout: Layout, interconnect: str, inter: float | None = None):
    """(planner's fastest kept (tokens/s, cfg), brute force's fastest fitting (tokens/s, cfg)) on one layout."""
    _, ctx = plan_context(plan, Constraints())
    ev, spec = ctx.evaluator, find_gpu(card)
    links = ctx.links(spec, _offer(card, layout.gpus_per_node, interconnect, inter), layout)
    kept = layout_setups(ctx, spec, layout, links, offload=True)
    planner = max(((s.throughput.data_tokens_per_s, s.cfg) for s in kept), default=(0.0, None), key=lambda t: t[0])
    split = batch_split(ctx.effective_batch_size, layout.gpus)
    usable = ctx.usable_bytes(spec)
    checkpointing = (True,) if plan.gradient_checkpointing else (False, True)
    best = None
    for shardings, offload in ((sharding_options(plan, layout.gpus), False), (OFFLOAD_SHARDINGS, True)):
        for sharding in shardings:
            for ck in checkpointing:
                for m in split.micro_batch_sizes:
                    cfg = config_for(split, sharding, m, ck, offload)
                    if ev.sized_bytes(cfg) <= usable:
                        rate = ev.throughput(cfg, spec, links).data_tokens_per_s
                        if best is None or rate > best[0]:
                            best = (rate, cfg)
        if best is not None:  # offload only where nothing fits without it (the search's own rule)
            break
    return planner, best


def test_the_largest_micro_batch_is_tried_where_the_smallest_does_not_fit() -> None:
    """Llama-3.1-70B full, micro-batch 16 x 1 accumulation, seq_len 1024, on 8 x B200 (one node, NVLink).

    Per GPU 2 samples: micro-batch 1 (2 accumulation steps) is sized 238.6 GiB under FSDP, micro-batch 2 (no
    accumulation) 155.3 GiB, which fits 179.1 GiB. ``largest_fitting_micro_batch`` probed the smallest first, found it
    did not fit and returned None, so ``fitting_configs`` fell through to CPU offload: it kept fsdp m2 + offload at
    815 tok/s, while fsdp m2 without offload fits at 11,876 tok/s (14.6x). Rule: "Memory grows with the micro-batch"
    (batching.largest_fitting_micro_batch's bisection); accumulation > 1 adds memory the single micro-batch does not
    need (evaluator keys model states on accumulation_steps > 1)."""
    plan = benchmark_plan("full", L70, micro_batch_size=16, gradient_accumulation_steps=1, seq_len=1024)
    (p_rate, p_cfg), (b_rate, b_cfg) = _planner_and_brute(plan, "B200", Layout(8, 1), "NVLink")
    assert p_rate >= b_rate * (1 - REL), (p_rate, p_cfg, b_rate, b_cfg)


def test_the_padded_micro_batch_is_chosen_on_the_setups_links() -> None:
    """Llama-3.1-8B full, micro-batch 16 x 1, seq_len 1024, on 2 x H100 SXM over PCIe.

    ``card_configs`` replaced each largest micro-batch by the smaller one ``_faster_padded_micro_batch`` preferred,
    judged on the card's default links (NVLink 450 GB/s: fsdp m1 13,073 > m8 6,852 tok/s) and memoised per card and
    GPU count for every link kind. On the offer's PCIe the kept fsdp m1 x 8 accumulation ran 1,667 tok/s; fsdp m8
    with checkpointing (fits: 45.4 GiB) runs 6,251 tok/s (3.75x). Rule: the micro-batch under padding to the longest
    sample (search.card_configs / _faster_padded_micro_batch)."""
    plan = benchmark_plan("full", L8, micro_batch_size=16, gradient_accumulation_steps=1, seq_len=1024)
    (p_rate, p_cfg), (b_rate, b_cfg) = _planner_and_brute(plan, "H100 SXM", Layout(2, 1), "PCIe")
    assert p_rate >= b_rate * (1 - REL), (p_rate, p_cfg, b_rate, b_cfg)


def test_the_padded_micro_batch_is_not_gated_by_per_sample_floors() -> None:
    """Llama-3.1-8B LoRA, micro-batch 2 x 6 accumulation (12 samples), on 4 x H100 PCIe (NVLink).

    ``_faster_padded_micro_batch`` proposed a smaller micro-batch only when its per-sample floor was 1% below the
    largest's: m1 floor 0.08281 s vs m3 0.08206 s, so m3 was kept (14,969 tok/s); the full estimate gives m1 x 3
    accumulation 23,589 tok/s (+57.6%). The floors were said to leave out only costs that favour the larger
    micro-batch; here the full estimate charges m3 a compute time (0.392 s) far above 3 x its floor (0.246 s)."""
    plan = benchmark_plan("lora", L8, micro_batch_size=2, gradient_accumulation_steps=6)
    (p_rate, p_cfg), (b_rate, b_cfg) = _planner_and_brute(plan, "H100 PCIe", Layout(4, 1), "NVLink")
    assert p_rate >= b_rate * (1 - REL), (p_rate, p_cfg, b_rate, b_cfg)


def test_the_first_pick_does_without_offload_where_a_setup_fits_without_it() -> None:
    """Llama-3.1-70B full, seq_len 8192, micro-batch 1 x 12, bundled catalog, prefer_simpler_within=0.

    First pick was vast 2 x A40 with CPU offload, $45.38. On 8 x H200 (vast) fsdp m2 with checkpointing and no
    accumulation is sized 123.1 GiB of 140.4 (m1 x 2 accumulation: 222.4 GiB), 3,360 tok/s, $41.20 on demand;
    the planner kept only fsdp m1 + offload there (704.5 tok/s), a consequence of the bisection above."""
    plan = benchmark_plan("full", L70, seq_len=8192, micro_batch_size=1, gradient_accumulation_steps=12)
    cons = Constraints(prefer_simpler_within=0.0)
    offers = bundled_offers()
    first = plan_setups(plan, offers, constraints=cons, top_n=1).recommendations[0]
    _, ctx = plan_context(plan, cons)
    spec, layout = find_gpu("H200"), Layout(8, 1)
    cheapest = None
    for index, offer in enumerate(offers):
        if offer.gpu != "H200" or offer.gpus_per_node != 8:
            continue
        cfg = config_for(batch_split(ctx.effective_batch_size, 8), "fsdp", 2, True, False)
        assert ctx.evaluator.sized_bytes(cfg) <= ctx.usable_bytes(spec)  # fits without offload
        setup = _setup(ctx, spec, layout, ctx.links(spec, offer, layout), cfg)
        cost = price_setup(ctx, index, offer, setup).on_demand.expected_cost_usd
        cheapest = cost if cheapest is None else min(cheapest, cost)
    assert cheapest is not None
    assert first.expected_cost_usd <= cheapest + 0.01, (first.expected_cost_usd, first.gpu, first.gpus, cheapest)


def test_packed_rows_keep_the_fastest_that_fits() -> None:
    """With packed rows (no padding to the longest sample) and memory that fits the largest micro-batch, the kept
    setup is the fastest that fits."""
    for method, card, layout, ic in (
        ("qlora", "H100 SXM", Layout(1, 1), "NVLink"),
        ("lora", "A100 80GB", Layout(8, 1), "NVLink"),
        ("qlora", "L4", Layout(4, 1), "PCIe"),
    ):
        plan = benchmark_plan(method, L8, padding="packed")
        (p_rate, p_cfg), (b_rate, b_cfg) = _planner_and_brute(plan, card, layout, ic)
        assert p_rate >= b_rate * (1 - REL), (method, card, p_rate, p_cfg, b_rate, b_cfg)
