"""Batch splits, GPU layouts, sharding options, links and constraints validation."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from services.catalog.gpus import find_gpu
from services.catalog.offers import Offer, bundled_offers
from services.estimator.plan import Plan
from services.planner import plan_setups
from services.planner.batching import batch_split, divisors, effective_batch_size
from services.planner.constraints import Constraints
from services.planner.layouts import (
    Layout,
    gpu_layouts,
    multi_node_counts,
    offer_links,
    offload_shardings,
    sharding_options,
    single_node_counts,
)
from tests.conftest import make_plan


def offer(
    gpus_per_node: int = 1,
    interconnect: str = "NVLink",
    *,
    whole_nodes_only: bool = False,
    inter_node_gbit_per_s: float | None = None,
) -> Offer:
    return Offer(
        "acme",
        "A40",
        gpus_per_node,
        1.0,
        None,
        "USD",
        "eu",
        "DE",
        interconnect,
        "2026-11-01",
        "test",
        whole_nodes_only=whole_nodes_only,
        inter_node_gbit_per_s=inter_node_gbit_per_s,
    )


def test_effective_batch() -> None:
    assert effective_batch_size(make_plan(micro_batch_size=4, gradient_accumulation_steps=8, gpus=2)) == 64
    assert effective_batch_size(make_plan(micro_batch_size=3)) == 3


def test_divisors() -> None:
    assert divisors(1) == (1,)
    assert divisors(12) == (1, 2, 3, 4, 6, 12)
    assert divisors(16) == (1, 2, 4, 8, 16)


def test_batch_split_keeps_the_effective_batch_or_takes_the_next_larger() -> None:
    even = batch_split(16, 4)
    assert (even.samples_per_gpu, even.micro_batch_sizes, even.effective_batch_size) == (4, (1, 2, 4), 16)
    assert even.accumulation_steps(1) == 4
    uneven = batch_split(6, 4)
    assert (uneven.samples_per_gpu, uneven.effective_batch_size) == (2, 8)
    more_gpus_than_samples = batch_split(4, 8)
    assert (more_gpus_than_samples.micro_batch_sizes, more_gpus_than_samples.effective_batch_size) == ((1,), 8)


def test_a_node_never_has_more_gpus_than_its_offer() -> None:
    single, multi = gpu_layouts(offer(1), 64)
    assert [lay.gpus for lay in single] == [1] and multi == ()
    single, multi = gpu_layouts(offer(8), 64)
    assert [lay.gpus for lay in single] == [1, 2, 4, 8] and multi == ()
    single, _ = gpu_layouts(offer(6), 64)
    assert [lay.gpus for lay in single] == [1, 2, 4, 6]
    single, multi = gpu_layouts(offer(8), 3)
    assert [lay.gpus for lay in single] == [1, 2] and multi == ()


def test_several_nodes_only_over_the_providers_network() -> None:
    single, multi = gpu_layouts(offer(8, inter_node_gbit_per_s=400), 64)
    assert [lay.gpus for lay in single] == [1, 2, 4, 8]
    assert [lay.nodes for lay in multi] == [2, 3, 4, 6, 8]
    assert all(lay.gpus_per_node == 8 for lay in multi)
    assert multi_node_counts(1) == () and multi_node_counts(5) == (2, 3, 4)


def test_layouts_for_whole_node_offers() -> None:
    single, multi = gpu_layouts(offer(4, whole_nodes_only=True, inter_node_gbit_per_s=100), 12)
    assert single == (Layout(4, 1),)
    assert multi == (Layout(4, 2), Layout(4, 3))
    assert gpu_layouts(offer(8, whole_nodes_only=True), 4) == ((), ())
    assert gpu_layouts(offer(8, whole_nodes_only=True), 64) == ((Layout(8, 1),), ())


def test_sharding_options() -> None:
    assert sharding_options(make_plan(), 1) == ("none",)
    assert sharding_options(make_plan(), 4) == ("none", "zero2", "fsdp", "zero3")
    assert sharding_options(make_plan(sharding="zero1", gpus=2), 4) == ("none", "zero2", "fsdp", "zero3", "zero1")
    offload = make_plan(sharding="zero2", cpu_offload=True)
    assert sharding_options(offload, 1) == ("zero2",)
    assert sharding_options(offload, 8) == ("zero2", "fsdp", "zero3")


def test_links_follow_the_offer() -> None:
    a40 = find_gpu("A40")
    assert a40.nvlink_gb_per_s > 0
    pcie = offer_links(a40, offer(8, "PCIe"), Layout(4, 1))
    assert (pcie.intra_kind, pcie.intra_gb_per_s, pcie.nodes) == ("PCIe", a40.pcie_gb_per_s, 1)
    nvlink = offer_links(a40, offer(8, "NVLink"), Layout(2, 1))
    assert (nvlink.intra_kind, nvlink.intra_gb_per_s) == ("NVLink", a40.nvlink_gb_per_s)
    networked = offer_links(a40, offer(8, "NVLink", inter_node_gbit_per_s=400), Layout(8, 2))
    assert networked.inter_node_gbit_per_s == 400 and networked.bus_bytes_per_s() < nvlink.bus_bytes_per_s()
    # GeForce cards: the driver disables peer-to-peer, so NCCL stages through host memory.
    consumer = offer_links(find_gpu("RTX 4090"), offer(8, "PCIe"), Layout(2, 1))
    assert consumer.intra_kind == "PCIe (no P2P)" and consumer.bus_bytes_per_s() < pcie.bus_bytes_per_s()


def test_constraints_validation_names_the_field() -> None:
    with pytest.raises(ValidationError, match="safety_margin"):
        Constraints(safety_margin=0.6)
    with pytest.raises(ValidationError, match="budget_usd"):
        Constraints(budget_usd=0)
    with pytest.raises(ValidationError, match="deadline_hours"):
        Constraints(deadline_hours=-1)
    with pytest.raises(ValidationError, match="max_gpus"):
        Constraints(max_gpus=0)
    c = Constraints.model_validate({"regions": ["US"], "providers": ["Acme"]})
    assert c.allows_region("us", "") and c.allows_region("eu-west", "us") and not c.allows_region("eu", "DE")
    assert c.allows_provider("acme") and not c.allows_provider("other")
    defaults = Constraints()
    assert (defaults.max_gpus, defaults.safety_margin, defaults.preemptions_per_hour) == (64, 0.0, None)
    assert defaults.spot_allowed and defaults.restart_minutes is None
    assert not defaults.allow_optimizer_change and defaults.allow_cpu_offload


def test_zero_is_tried_only_where_the_framework_runs_deepspeed() -> None:
    # torchtune, LitGPT and torchtitan shard with FSDP alone: a ZeRO setup of theirs could not be run.
    for framework in ("torchtune", "litgpt", "torchtitan"):
        assert sharding_options(make_plan(framework=framework), 4) == ("none", "fsdp"), framework
        assert offload_shardings(make_plan(framework=framework)) == ("fsdp",), framework
    # The plan's own sharding is always tried.
    assert sharding_options(make_plan(framework="torchtune", sharding="zero2", gpus=2), 4) == ("none", "fsdp", "zero2")
    for framework in ("hf-trainer", "axolotl", "pytorch", "unsloth"):
        assert sharding_options(make_plan(framework=framework), 4) == ("none", "zero2", "fsdp", "zero3"), framework
        assert offload_shardings(make_plan(framework=framework)) == ("fsdp", "zero2"), framework


def test_zero3_is_offered_where_fsdp_accumulates_the_whole_gradient() -> None:
    # A brute-force probe (stop 58): 8B full at 8,192 tokens on lambda's 8 x A100 40GB. FSDP's no_sync keeps the whole
    # 16-bit gradient under accumulation and fits no split on 8 GPUs, so the planner took one GPU with CPU offload
    # ($8.97, 6.9 h); ZeRO-3 keeps its partition and fits 8 GPUs at 1 x 2, without offload, for about half.
    plan = make_plan(
        method="full",
        seq_len=8192,
        micro_batch_size=4,
        gradient_accumulation_steps=4,
        data={"examples": 10_000, "avg_tokens_per_example": 512, "epochs": 3},
    )
    offers = [o for o in bundled_offers() if (o.provider, o.gpu, o.gpus_per_node) == ("lambda", "A100 40GB", 8)]
    best = plan_setups(plan, offers).recommendations[0]
    assert (best.gpus, best.sharding, best.cpu_offload) == (8, "zero3", False), best
    assert (best.micro_batch_size, best.gradient_accumulation_steps) == (1, 2)
    assert best.expected_cost_usd < 6.0


def test_single_node_midpoints_are_tried_where_they_split_the_effective_batch() -> None:
    assert single_node_counts(8) == single_node_counts(8, 16) == (1, 2, 4, 8)
    assert single_node_counts(8, 24) == (1, 2, 3, 4, 6, 8)
    assert single_node_counts(16, 9) == (1, 2, 3, 4, 8, 16)  # 6 and 12 would train 12 samples a step for 9
    # A brute-force probe (stop 58): Qwen2.5-32B LoRA at 8,192 tokens, 4 x 6 samples a step, on vast's A100 40GB
    # rented per GPU: 6 GPUs (1 x 4 x 6 = 24) fit and cost less than the 8 (1 x 3 x 8) the planner took.
    offers = [o for o in bundled_offers() if (o.provider, o.gpu) == ("vast", "A100 40GB")]
    fields = {"seq_len": 8192, "micro_batch_size": 4, "gradient_accumulation_steps": 6}
    plan = Plan.model_validate(
        {
            "model": {"name": "Qwen/Qwen2.5-32B"},
            "method": "lora",
            "data": {"examples": 10_000, "avg_tokens_per_example": 512, "epochs": 3},
            **fields,
        }
    )
    best = plan_setups(plan, offers).recommendations[0]
    assert (best.gpus, best.micro_batch_size * best.gradient_accumulation_steps * best.gpus) == (6, 24), best
    # An effective batch 6 GPUs do not split (16) is not trained larger on 6: no setup of 3 or 6 GPUs.
    sixteen = plan.model_copy(update={"gradient_accumulation_steps": 4})
    assert {r.gpus for r in plan_setups(sixteen, offers, top_n=50).recommendations}.isdisjoint({3, 6})
