"""Host RAM per node (issue 12): a CPU-offload setup is recommended only on nodes whose host RAM holds the
offloaded states; where the RAM is unknown it is recommended with a note; where no node has enough, the
rejection says so in numbers and the fix moves on to more GPUs or nodes."""

from __future__ import annotations

from services.estimator.memory import GIB
from services.planner.host_ram import host_ram_available_bytes
from services.planner.layouts import Layout
from tests.planner.test_planner import everything, offer, plan_for

# A full fine-tune of the 8B model fits one RTX 4090 (24 GiB) only with its states offloaded to host RAM
# (tests/planner/test_planner.py: more than 40 GiB of it).
CARD = "RTX 4090"


def test_an_offload_setup_on_a_node_with_too_little_ram_is_not_recommended_and_is_explained() -> None:
    result = everything(plan_for("full"), [offer(CARD, 1.0, gpus_per_node=1, host_ram_gib_per_node=16)], max_gpus=1)
    assert result.recommendations == []
    (rejection,) = result.rejections
    assert rejection.kind == "memory" and rejection.gpu == CARD
    assert rejection.host_ram_gib_per_node == 16.0
    assert rejection.host_ram_needed_gib_per_node is not None and rejection.host_ram_needed_gib_per_node > 40
    assert f"needs {rejection.host_ram_needed_gib_per_node:,.0f} GiB of host RAM per node" in rejection.reason
    assert "acme's node has 16 GiB (14 GiB usable with the 10% margin)" in rejection.reason
    # The fix no longer offers offload on this card: it moves on to more GPUs.
    assert rejection.fix is not None and "offload" not in rejection.fix
    # ZeRO-3 keeps its gradient partition under accumulation where FSDP's no_sync keeps it whole: 8 GPUs, not 16.
    assert rejection.fix.startswith("fits on 8 GPUs in 8 nodes of 1 with zero3"), rejection.fix


def test_an_offload_setup_on_a_node_with_enough_ram_is_recommended_with_its_share() -> None:
    result = everything(plan_for("full"), [offer(CARD, 1.0, gpus_per_node=1, host_ram_gib_per_node=256)], max_gpus=1)
    (rec,) = result.recommendations
    assert rec.cpu_offload and rec.host_ram_gib_per_node is not None
    assert rec.host_ram_gib_per_node <= 256 * 0.9
    assert any(n.startswith("host RAM: the offloaded states take") and "of the node's 256 GiB" in n for n in rec.notes)


def test_unknown_host_ram_is_recommended_with_an_unverified_note() -> None:
    result = everything(plan_for("full"), [offer(CARD, 1.0, gpus_per_node=1)], max_gpus=1)
    (rec,) = result.recommendations
    assert rec.cpu_offload
    (note,) = [n for n in rec.notes if n.startswith("host RAM unverified")]
    assert "acme does not say how much CPU memory its nodes have" in note


def test_the_offer_with_too_little_ram_is_left_out_and_named_while_another_is_recommended() -> None:
    offers = [
        offer(CARD, 0.5, provider="small", gpus_per_node=1, host_ram_gib_per_node=16),
        offer(CARD, 1.0, provider="big", gpus_per_node=1, host_ram_gib_per_node=512),
    ]
    result = everything(plan_for("full"), offers, max_gpus=1)
    assert {r.provider for r in result.recommendations} == {"big"}
    (rejection,) = result.rejections
    assert (rejection.kind, rejection.provider, rejection.host_ram_gib_per_node) == ("memory", "small", 16.0)
    assert rejection.reason.startswith("host RAM: with CPU offload it fits 1 GPU")


def test_too_little_ram_on_one_node_moves_the_search_to_more_nodes() -> None:
    # Networked single-GPU nodes: offload on one node needs more RAM than it has, so the search goes on to
    # several nodes, where the states are sharded (less per node) or no offload is needed at all.
    small = offer(CARD, 1.0, gpus_per_node=1, host_ram_gib_per_node=16, inter_node_gbit_per_s=100)
    result = everything(plan_for("full"), [small], max_gpus=16)
    assert result.recommendations
    best = result.recommendations[0]
    assert best.nodes > 1
    assert not best.cpu_offload or (best.host_ram_gib_per_node or 0) <= 16 * 0.9


def test_a_setup_on_part_of_a_node_gets_its_share_of_the_nodes_ram() -> None:
    node = offer("A10G", 1.5, gpus_per_node=8, host_ram_gib_per_node=768)
    assert host_ram_available_bytes(node, Layout(8, 1)) == 768 * GIB
    assert host_ram_available_bytes(node, Layout(4, 1)) == 384 * GIB  # g5.24xlarge: 4 x A10G, 384 GiB
    assert host_ram_available_bytes(offer("A10G", 1.5), Layout(1, 1)) is None


def test_a_multi_gpu_offload_setup_never_shows_perfect_scaling() -> None:
    # One GPU streams the whole model over its host link, n GPUs a shard each, so per-GPU tokens/s can beat
    # one GPU's; the per-step synchronisation still keeps the shown efficiency below 1.
    result = everything(plan_for("full"), [offer(CARD, 1.0, gpus_per_node=8, host_ram_gib_per_node=2048)], max_gpus=8)
    offloaded = [r for r in result.recommendations if r.cpu_offload and r.gpus > 1]
    assert offloaded
    assert all(0 < r.scaling_efficiency < 0.99 for r in offloaded), [r.scaling_efficiency for r in offloaded]


def test_offload_is_walked_over_more_nodes_when_no_setup_meets_the_deadline() -> None:
    """A probe of the constrained search (stop 56): 70B full on AWS's 8 x A10G fits only with CPU offload. One node
    takes 22.35 h; the walk over more nodes tried only setups without offload (none fits up to 64 GPUs), so a deadline
    of 16.6 h rejected the offer, naming the one-node setup the fastest, where 3 or 4 nodes with offload meet it."""
    from benchmarks.planner.run import benchmark_plan
    from services.catalog.offers import bundled_offers
    from services.planner import Constraints, plan_setups

    g5 = [o for o in bundled_offers() if (o.provider, o.gpu, o.gpus_per_node) == ("aws", "A10G", 8)]
    assert len(g5) == 1 and g5[0].host_ram_gib_per_node == 768
    plan = benchmark_plan("full", "meta-llama/Llama-3.1-70B")
    result = plan_setups(plan, g5, constraints=Constraints(deadline_hours=16.5735))
    assert result.recommendations, result.rejections
    best = result.recommendations[0]
    assert best.cpu_offload and best.nodes > 1 and best.expected_hours <= 16.5735
    assert not [r for r in result.rejections if r.kind == "deadline"]
