"""Which GPU counts, node shapes and sharding modes a candidate setup may take.

Rules (the brief left these open):

- An offer with ``gpus_per_node == 1`` is priced per GPU and rentable as 1, 2, 4 or 8 GPUs on one node;
  jobs on several nodes use full nodes of 8 (fewer per node costs the same and communicates worse).
- An offer with ``gpus_per_node == k > 1`` is sold as whole nodes of k GPUs: 1, 2, 3, ... nodes of k.
- One GPU trains unsharded (plus the plan's own sharding, if it names one); several GPUs try DDP
  ("none"), ZeRO-2 and FSDP (ZeRO-3 holds the same memory as FSDP), plus the plan's own. A plan with
  ``cpu_offload`` keeps it, so its candidates are sharded ones only (offload needs sharding).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from services.catalog.gpus import GpuSpec
from services.catalog.offers import Offer
from services.estimator.plan import Plan, Sharding
from services.estimator.throughput import GPUS_PER_NODE, INTER_NODE_GB_PER_S

SINGLE_NODE_GPU_COUNTS = (1, 2, 4, 8)
MULTI_GPU_SHARDINGS: tuple[Sharding, ...] = ("none", "zero2", "fsdp")


@dataclass(frozen=True)
class Layout:
    """GPUs per node times nodes."""

    gpus_per_node: int
    nodes: int

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes


def gpu_layouts(offer: Offer, max_gpus: int) -> tuple[tuple[Layout, ...], tuple[Layout, ...]]:
    """(single-node, multi-node) layouts an offer can be rented in, ascending, at most ``max_gpus`` GPUs."""
    if offer.gpus_per_node > 1:
        whole = tuple(Layout(offer.gpus_per_node, n) for n in range(1, max_gpus // offer.gpus_per_node + 1))
        return whole[:1], whole[1:]
    single = tuple(Layout(n, 1) for n in SINGLE_NODE_GPU_COUNTS if n <= max_gpus)
    multi = tuple(Layout(GPUS_PER_NODE, n) for n in range(2, max_gpus // GPUS_PER_NODE + 1))
    return single, multi


def sharding_options(plan: Plan, gpus: int) -> tuple[Sharding, ...]:
    """Sharding modes to try on ``gpus`` GPUs, in order, without repeats."""
    options: tuple[Sharding, ...] = ("none", plan.sharding) if gpus == 1 else (*MULTI_GPU_SHARDINGS, plan.sharding)
    if plan.cpu_offload:
        options = tuple(s for s in options if s != "none") or ("fsdp",)
    return tuple(dict.fromkeys(options))


def link_spec(spec: GpuSpec, offer: Offer, nodes: int) -> GpuSpec:
    """The card as this offer connects it: over nodes at the inter-node rate, PCIe-only without NVLink.

    The throughput model reads the link from the spec (NVLink, else PCIe) and switches to the inter-node
    rate only above 8 GPUs; an offer says how its GPUs are really connected.
    """
    if nodes > 1:
        return replace(spec, nvlink_gb_per_s=INTER_NODE_GB_PER_S)
    if "pcie" in offer.interconnect.lower() and spec.nvlink_gb_per_s:
        return replace(spec, nvlink_gb_per_s=0.0)
    return spec
