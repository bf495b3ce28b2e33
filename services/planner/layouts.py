"""Which GPU counts, node shapes and sharding modes a candidate setup may take on an offer.

Rules (Offer schema v2):

- ``gpus_per_node`` is the most GPUs one node of the offer has; a setup never puts more on a node.
- An offer rented per GPU (``whole_nodes_only`` false) runs on one node as 1, 2, 4, 8, ... GPUs up to its
  node size (and the node size itself); one sold as whole nodes runs on whole nodes only.
- More GPUs than one node means several full nodes (2, 3, 4, 6, 8, 12, ... of them) over the provider's
  network (``inter_node_gbit_per_s``); an offer without one cannot span nodes.
- One GPU trains unsharded (plus the plan's own sharding, if it names one); several GPUs try DDP
  ("none"), ZeRO-2, FSDP and ZeRO-3, plus the plan's own; ZeRO only for a framework that runs DeepSpeed
  (services/estimator/frameworks.py ``runs_deepspeed``: torchtune, LitGPT and torchtitan shard with FSDP
  alone). ZeRO-3 is not FSDP's memory: under gradient accumulation FSDP's no_sync keeps the whole unsharded
  gradient and ZeRO-3 its partition (services/estimator/memory/states.py), so ZeRO-3 fits, or fits a faster
  split, where FSDP does not (docs/planner.md). A plan with ``cpu_offload`` keeps it, so its candidates are
  sharded ones only (offload needs sharding).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from services.catalog.gpus import GpuSpec
from services.catalog.offers import Offer
from services.estimator.communication import Links, links_for
from services.estimator.frameworks import versioned_defaults
from services.estimator.plan import Plan, Sharding

MULTI_GPU_SHARDINGS: tuple[Sharding, ...] = ("none", "zero2", "fsdp", "zero3")
OFFLOAD_SHARDINGS: tuple[Sharding, ...] = ("fsdp", "zero2")


class _LayoutFields(NamedTuple):
    gpus_per_node: int
    nodes: int
    gpus: int  # gpus_per_node x nodes


class Layout(_LayoutFields):
    """GPUs per node times nodes (a named tuple: the search's memo keys hold it). ``Layout(gpus_per_node, nodes)``;
    the product is kept as a third field, read as a tuple item (the search and the bounds read it thousands of
    times per plan)."""

    __slots__ = ()

    def __new__(cls, gpus_per_node: int, nodes: int) -> Layout:
        return super().__new__(cls, gpus_per_node, nodes, gpus_per_node * nodes)


def single_node_counts(gpus_per_node: int, effective_batch: int = 0) -> tuple[int, ...]:
    """1, 2, 4, 8, ... up to the node size, the node size itself, and the midpoints 3, 6, 12, ... (as
    ``multi_node_counts`` has them) that split ``effective_batch`` evenly: there they keep the plan's batch and can
    be the cheapest count that fits or meets a deadline (a brute-force probe: 6 of a node's GPUs below the 8 the
    planner took); where they do not split it they would train a larger batch, and are not tried."""
    counts = {1, gpus_per_node}
    n = 1
    while n < gpus_per_node:
        counts.add(n)
        middle = n + n // 2
        if n >= 2 and middle < gpus_per_node and effective_batch and effective_batch % middle == 0:
            counts.add(middle)
        n *= 2
    return tuple(sorted(counts))


def gpu_layouts(offer: Offer, max_gpus: int, effective_batch: int = 0) -> tuple[tuple[Layout, ...], tuple[Layout, ...]]:
    """(single-node, multi-node) layouts an offer can be rented in, ascending, at most ``max_gpus`` GPUs (the
    plan's ``effective_batch`` decides the single-node midpoints, ``single_node_counts``)."""
    return _layouts(
        max(1, offer.gpus_per_node),
        offer.whole_nodes_only,
        offer.inter_node_gbit_per_s is not None,
        max_gpus,
        effective_batch,
    )


@functools.lru_cache(maxsize=1024)
def _layouts(
    k: int, whole_nodes_only: bool, networked: bool, max_gpus: int, effective_batch: int
) -> tuple[tuple[Layout, ...], tuple[Layout, ...]]:
    if whole_nodes_only:
        single: tuple[Layout, ...] = (Layout(k, 1),) if k <= max_gpus else ()
    else:
        single = tuple(Layout(n, 1) for n in single_node_counts(k, effective_batch) if n <= max_gpus)
    if not networked:
        return single, ()
    multi = tuple(Layout(k, n) for n in multi_node_counts(max_gpus // k))
    return single, multi


def multi_node_counts(most: int) -> tuple[int, ...]:
    """Node counts for jobs on several nodes: 2, 3, 4, 6, 8, 12, 16, ... up to ``most`` (powers of two and
    their midpoints: the counts that split an effective batch evenly, and none of the hundreds in between)."""
    counts = []
    n = 2
    while n <= most:
        counts.append(n)
        if n + n // 2 <= most and n >= 2:
            counts.append(n + n // 2)
        n *= 2
    return tuple(sorted(set(counts)))


def sharding_options(plan: Plan, gpus: int) -> tuple[Sharding, ...]:
    """Sharding modes to try on ``gpus`` GPUs, in order, without repeats (the plan's own always)."""
    tried = MULTI_GPU_SHARDINGS if gpus > 1 else ("none",)
    options: tuple[Sharding, ...] = (*_runnable(plan, tried), plan.sharding)
    if plan.cpu_offload:
        options = tuple(s for s in options if s != "none") or ("fsdp",)
    return tuple(dict.fromkeys(options))


def offload_shardings(plan: Plan) -> tuple[Sharding, ...]:
    """The sharding modes CPU offload is tried with (``OFFLOAD_SHARDINGS`` the plan's framework runs)."""
    return _runnable(plan, OFFLOAD_SHARDINGS)


def _runnable(plan: Plan, modes: tuple[Sharding, ...]) -> tuple[Sharding, ...]:
    """``modes`` less ZeRO where the plan's framework does not run DeepSpeed."""
    if versioned_defaults(plan).runs_deepspeed:
        return modes
    return tuple(s for s in modes if not s.startswith("zero"))


def offer_links(spec: GpuSpec, offer: Offer, layout: Layout) -> Links:
    """The links a layout of this offer really uses: the offer's intra-node link, its network between nodes."""
    return links_for(
        spec,
        layout.gpus_per_node,
        layout.nodes,
        interconnect=offer.interconnect,
        inter_node_gbit_per_s=offer.inter_node_gbit_per_s,
    )
