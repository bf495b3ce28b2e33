"""Data-parallel communication per training step, timed over the links a setup really has (pure).

Bytes per layout (Rajbhandari et al. 2020, ZeRO, arXiv 1910.02054, section 7; Zhao et al. 2023, PyTorch FSDP,
arXiv 2304.11277, section 3):

- DDP: one all-reduce of the trainable gradients per optimizer step (gradients accumulate locally under
  ``no_sync``), in 25 MB buckets launched during the last backward (PyTorch DDP ``bucket_cap_mb``).
- ZeRO-1: a reduce-scatter of the gradients during the last backward and an all-gather of the updated
  16-bit parameters after the optimizer step: the same 2 x volume as DDP, but the all-gather is exposed.
- ZeRO-2: the gradient reduce-scatter every micro-batch (gradients are kept sharded), the parameter
  all-gather once per optimizer step.
- ZeRO-3 / FSDP: every micro-batch all-gathers each layer's weights in the forward and again in the
  backward, and reduce-scatters its gradients: 3 x the volume of DDP, overlapped by prefetching except
  for the first layer of each pass.

A ring collective over n ranks moves (n-1)/n of the data per rank per phase (all-reduce: two phases) at
the bus bandwidth of the slowest link it crosses (NCCL's ``busbw``, NVIDIA/nccl-tests doc/PERFORMANCE.md),
plus a base latency and one link latency per ring step (NCCL's tuning model). Within a node that is
NVLink/NVSwitch or PCIe; across nodes the provider's network per node (NCCL runs one ring per NIC, so a
node's whole network carries its share).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from functools import cached_property

from services.catalog.gpus import GpuSpec
from services.estimator.architecture import Architecture, parameter_counts
from services.estimator.memo import Memo, quick_init, state_without_hash, value_hash_once

# Share of a link's one-direction peak that NCCL's ring collectives reach (bus bandwidth / spec):
# - NVLink/NVSwitch: ~87-88% measured on 8 x H200 (stas00/ml-engineering network/README.md).
# - PCIe with peer-to-peer: 35-45 GB/s busbw on 8 x H100 PCIe Gen5 (64 GB/s), i.e. ~0.63 (nccl-tests
#   reference table, docs.alayanew.com "NCCL-tests in practice", 2026).
# - PCIe without peer-to-peer (GeForce cards: the driver disables P2P, so NCCL stages through host
#   memory): all_reduce busbw 4.0 GB/s on 2 x RTX 2080 Ti over PCIe Gen3 x16 (16 GB/s), i.e. 0.25
#   (nccl-tests run published as a gist, Anthony-Hoo/5b407716011b3b74df0ddbd7688d6562).
# - Network (RDMA): NCCL's maintainers expect 46-48 GB/s of ring busbw per 400 Gb/s NDR InfiniBand NIC
#   (NVIDIA/nccl-tests issue 290), i.e. 0.94 of its 50 GB/s line rate; each of a node's NICs carries one ring.
NVLINK_BUS_EFFICIENCY = 0.87
PCIE_P2P_BUS_EFFICIENCY = 0.63
PCIE_NO_P2P_BUS_EFFICIENCY = 0.25
NETWORK_BUS_EFFICIENCY = 0.94
# Latency of one ring collective, NCCL's own tuning model (NVIDIA/nccl src/graph/tuning.cc, ring algorithm,
# Simple protocol, the one NCCL picks for MB-sized messages like these buckets and layers): a base of 8.4 us
# plus one hop latency per ring step, 3.4 us over NVLink, 5.7 us over PCIe and 14 us for the steps that cross
# the network (nodes - 1 of the n - 1 steps of each phase). PCIe without P2P: 14.8 us GPU-to-GPU measured by
# p2pBandwidthLatencyTest in the same gist as its bandwidth.
RING_BASE_LATENCY_S = 8.4e-6
NVLINK_HOP_LATENCY_S = 3.4e-6
PCIE_HOP_LATENCY_S = 5.7e-6
PCIE_NO_P2P_HOP_LATENCY_S = 14.8e-6
NETWORK_HOP_LATENCY_S = 14.0e-6
# PyTorch DDP's gradient bucket size (torch.nn.parallel.DistributedDataParallel, bucket_cap_mb=25).
DDP_BUCKET_BYTES = 25 * 2**20
# DeepSpeed ZeRO-3 keeps parameters below stage3_param_persistence_threshold (1e5 elements by default,
# deepspeed/runtime/zero/config.py) whole on every rank and gathers the others one submodule at a time: one
# all_gather_coalesced per fetch (partitioned_param_coordinator.py), so a pass makes about one collective per
# partitioned module, where FSDP's auto-wrap makes one per transformer block.
ZERO3_PERSISTENCE_THRESHOLD = 100_000
# Synchronous data parallelism waits for the slowest GPU each step. Sinha et al. (SC22, "Not All GPUs Are
# Created Equal", arXiv 2208.11035) measured an average 8% performance variation between GPUs of one SKU
# in the same cluster (max 22%); with per-GPU speeds spread evenly over that range, the expected slowest
# of n is (n-1)/(2(n+1)) x 8% below the mean (order statistics of the uniform distribution).
GPU_PERFORMANCE_VARIATION = 0.08
# Hidden communication is not free: compute kernels that run while a collective is in flight are slowed
# by 18.9% on average (40% at most), because NCCL's kernels take SMs and memory bandwidth from them
# (Lee et al. 2025, "Characterizing Compute-Communication Overlap in GPU-Accelerated Distributed Deep
# Learning", arXiv 2507.03114: GPT and Llama layers on 4 x A100, H100, MI250 and MI210). The compute that
# overlaps a hidden collective is as long as the collective, so each hidden second costs 0.189 s.
OVERLAP_COMPUTE_SLOWDOWN = 0.189
# Per-micro-batch synchronisation overhead of data-parallel training that neither the collectives' bytes
# nor GPU speed variation account for (the DDP wrapper's per-forward buffer broadcast and per-parameter
# autograd hooks, and each rank's host-side jitter, which a synchronous step exposes). A class prior, not
# a mechanism with its own formula: fitted by benchmarks/planner/fit_sync.py on the scaling cases with a
# one-GPU base (the only ones it does not cancel in), its held-out effect is printed there.
DATA_PARALLEL_SYNC_OVERHEAD = 0.018


def total_parameters(arch: Architecture) -> int:
    """Every parameter of the model (what FSDP/ZeRO-3 gather; counted once per architecture)."""
    return parameter_counts(arch).total


def zero3_gathers_per_pass(arch: Architecture) -> int:
    """All-gathers of one forward (or backward) pass under DeepSpeed ZeRO-3: one per block linear it partitions
    (an expert group counted as one module, as transformers fuses them), at least one per block."""
    per_block = (
        max(1, sum(1 for lin in b.linears if lin.params // lin.copies >= ZERO3_PERSISTENCE_THRESHOLD))
        for b in arch.blocks
    )
    return sum(n * b.count for n, b in zip(per_block, arch.blocks, strict=True))


@quick_init
@dataclass(frozen=True)
class Links:
    """How the GPUs of a setup are connected: within a node, and between nodes."""

    gpus_per_node: int
    nodes: int
    intra_kind: str  # "NVLink", "PCIe" or "PCIe (no P2P)"
    intra_gb_per_s: float  # per GPU, one direction, datasheet
    inter_node_gbit_per_s: float | None = None  # per node, None on one node

    # Memo keys in the planner hash links thousands of times: the hash is worked out once.
    __hash__ = value_hash_once
    __getstate__ = state_without_hash

    # Read several times per collective priced: kept in the instance after the first read.
    @cached_property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def intra_bus_bytes_per_s(self) -> float:
        efficiency = {
            "NVLink": NVLINK_BUS_EFFICIENCY,
            "PCIe": PCIE_P2P_BUS_EFFICIENCY,
            "PCIe (no P2P)": PCIE_NO_P2P_BUS_EFFICIENCY,
        }[self.intra_kind]
        return self.intra_gb_per_s * 1e9 * efficiency

    @property
    def inter_bus_bytes_per_s(self) -> float | None:
        if self.nodes == 1 or self.inter_node_gbit_per_s is None:
            return None
        return self.inter_node_gbit_per_s / 8.0 * 1e9 * NETWORK_BUS_EFFICIENCY

    def bus_bytes_per_s(self) -> float:
        """Bus bandwidth of a ring over every GPU: the slower of the node's links and its network."""
        return self._bus_bytes_per_s

    # Worked out once per links (the planner prices thousands of setups on a few hundred of them).
    @cached_property
    def _bus_bytes_per_s(self) -> float:
        inter = self.inter_bus_bytes_per_s
        intra = self.intra_bus_bytes_per_s if self.gpus_per_node > 1 else math.inf
        found = min(intra, inter if inter is not None else math.inf)
        return found if math.isfinite(found) else self.intra_gb_per_s * 1e9

    def hop_latency_s(self) -> float:
        """Latency of one ring step between two GPUs of a node."""
        return {"NVLink": NVLINK_HOP_LATENCY_S, "PCIe": PCIE_HOP_LATENCY_S}.get(
            self.intra_kind, PCIE_NO_P2P_HOP_LATENCY_S
        )

    def ring_latency_s(self, phases: int) -> float:
        """Latency of one ring collective of ``phases`` passes (all-gather 1, all-reduce 2) over every GPU:
        the base plus each of its phases x (n-1) steps, those that cross to the next node at the network's
        hop latency (NCCL's tuning model)."""
        steps = phases * (self.gpus - 1)
        inter = min(steps, phases * (self.nodes - 1))
        return RING_BASE_LATENCY_S + (steps - inter) * self.hop_latency_s() + inter * NETWORK_HOP_LATENCY_S

    # The latencies the collectives below read on every call, worked out once per links.
    @cached_property
    def _gather_latency_s(self) -> float:
        return self.ring_latency_s(1)

    @cached_property
    def _all_reduce_latency_s(self) -> float:
        return self.ring_latency_s(2)

    def label(self) -> str:
        return self._label

    @cached_property
    def _label(self) -> str:
        intra = f"{self.intra_kind} {self.intra_gb_per_s:g} GB/s per GPU"
        if self.nodes == 1:
            return intra
        return f"{intra} within a node, {self.inter_node_gbit_per_s:g} Gbit/s per node between {self.nodes} nodes"


def all_reduce_seconds(size_bytes: float, links: Links, collectives: int = 1) -> float:
    """Ring all-reduce (reduce-scatter + all-gather): 2(n-1)/n x size over the bus bandwidth, plus latency."""
    n = links.gpus
    if n <= 1 or size_bytes <= 0:
        return 0.0
    return 2 * (n - 1) / n * size_bytes / links._bus_bytes_per_s + collectives * links._all_reduce_latency_s


def gather_seconds(size_bytes: float, links: Links, collectives: int = 1) -> float:
    """Ring all-gather or reduce-scatter of ``size_bytes`` (the full tensor): (n-1)/n x size, plus latency."""
    n = links.gpus
    if n <= 1 or size_bytes <= 0:
        return 0.0
    return (n - 1) / n * size_bytes / links._bus_bytes_per_s + collectives * links._gather_latency_s


def straggler_fraction(gpus: int, variation: float = GPU_PERFORMANCE_VARIATION) -> float:
    """Expected slowdown of a synchronous step on ``gpus`` GPUs against one GPU of average speed.

    Speeds uniform over a range ``variation`` wide (Sinha et al. SC22): E[slowest] = mean - variation x
    (n-1) / (2(n+1)).
    """
    if gpus <= 1:
        return 0.0
    return variation * (gpus - 1) / (2 * (gpus + 1))


def synchronisation_fraction(gpus: int, sync_overhead: float = DATA_PARALLEL_SYNC_OVERHEAD) -> float:
    """Share of a micro-batch's compute a synchronous data-parallel step adds on ``gpus`` GPUs: the wait for
    the slowest GPU plus the per-micro-batch synchronisation overhead (0 on one GPU; ``sync_overhead``: the
    overhead to use, for its fit in benchmarks/planner/fit_sync.py)."""
    if gpus <= 1:
        return 0.0
    return straggler_fraction(gpus) + sync_overhead


def overlap_interference_seconds(hidden_s: float) -> float:
    """Compute slowdown while ``hidden_s`` seconds of collectives overlap it (Lee et al. 2025)."""
    return OVERLAP_COMPUTE_SLOWDOWN * max(0.0, hidden_s)


def hides_communication(links: Links) -> bool:
    """Whether compute hides the collectives of this link (DDP's bucketed all-reduce, ZeRO/FSDP prefetch).

    Not over PCIe without peer-to-peer: NCCL then stages every transfer through host memory (its SHM
    transport), and measured, none of it was hidden. Hugging Face's NVLink benchmark (transformers
    docs/source/en/perf_hardware.md: GPT-2 DDP on 2 x TITAN RTX, 200 steps) took 101 s over NVLink and
    131 s with NCCL_P2P_DISABLE=1: the extra 0.15 s per step is one whole ring all-reduce of the fp32
    gradients over host memory, though the backward pass was long enough to hide it.
    """
    return links.intra_kind != "PCIe (no P2P)" or links.gpus_per_node == 1


@quick_init
@dataclass(frozen=True)
class StepCommunication:
    """Communication of one micro-batch on every GPU (per-optimizer-step parts amortised)."""

    bytes_per_gpu: float  # moved per micro-batch, amortised
    seconds: float  # total communication time per micro-batch
    exposed_seconds: float  # the part compute does not hide
    straggler_seconds: float  # waiting for the slowest GPU, and the per-micro-batch synchronisation overhead
    links: str


def step_communication(
    sharding: str,
    links: Links,
    *,
    grad_bytes: float,
    param_bytes_16bit: float,
    gathered_weight_bytes: float,
    layers: int,
    forward_s: float,
    backward_s: float,
    accumulation: int,
    sync_overhead: float = DATA_PARALLEL_SYNC_OVERHEAD,
    gathers_per_pass: int | None = None,
) -> StepCommunication:
    """Communication per micro-batch of a data-parallel layout and the part of it that compute does not hide.

    ``grad_bytes``: trainable gradients as reduced; ``param_bytes_16bit``: trainable parameters as
    re-gathered after a ZeRO-1/2 step; ``gathered_weight_bytes``: every weight as stored (what FSDP/ZeRO-3
    gathers); ``forward_s``/``backward_s``: compute of one micro-batch (recompute counts as backward);
    ``gathers_per_pass``: the all-gathers of one pass under ZeRO-3/FSDP where not one per layer.
    """
    moved, total, exposed, wait = communication_seconds(
        sharding,
        links,
        grad_bytes,
        param_bytes_16bit,
        gathered_weight_bytes,
        layers,
        forward_s,
        backward_s,
        accumulation,
        sync_overhead,
        gathers_per_pass,
    )
    return StepCommunication(moved, total, exposed, wait, links.label())


def communication_seconds(
    sharding: str,
    links: Links,
    grad_bytes: float,
    param_bytes_16bit: float,
    gathered_weight_bytes: float,
    layers: int,
    forward_s: float,
    backward_s: float,
    accumulation: int,
    sync_overhead: float = DATA_PARALLEL_SYNC_OVERHEAD,
    gathers_per_pass: int | None = None,
) -> tuple[float, float, float, float]:
    """``step_communication``'s numbers as a tuple (bytes moved per GPU, seconds, exposed seconds with the hidden
    part's slowdown, straggler seconds), for a caller that prices thousands of links and reads only the times."""
    a = max(1, accumulation)
    if links.gpus <= 1:
        return 0.0, 0.0, 0.0, 0.0
    straggler = synchronisation_fraction(links.gpus, sync_overhead) * (forward_s + backward_s)
    if not hides_communication(links):
        forward_s = backward_s = 0.0
    n = links.gpus
    share = (n - 1) / n
    layers = max(1, layers)
    if sharding in ("zero3", "fsdp"):
        gather = gather_seconds(gathered_weight_bytes, links, collectives=gathers_per_pass or layers)
        scatter = gather_seconds(grad_bytes, links, collectives=layers)
        # Prefetch hides each layer's gather behind the previous layer's compute; the first layer of each
        # pass (and the last reduce-scatter) cannot be hidden.
        fwd_exposed = max(gather / layers, gather - forward_s)
        bwd_exposed = max((gather + scatter) / layers, gather + scatter - backward_s)
        total = 2 * gather + scatter
        moved = share * (2 * gathered_weight_bytes + grad_bytes)
        return _with_interference(moved, total, fwd_exposed + bwd_exposed, straggler)
    buckets = max(1, math.ceil(grad_bytes / DDP_BUCKET_BYTES))
    if sharding == "zero2":
        scatter = gather_seconds(grad_bytes, links, collectives=buckets)
        gather = gather_seconds(param_bytes_16bit, links)
        scatter_exposed = max(scatter / buckets, scatter - backward_s)
        total = scatter + gather / a
        moved = share * (grad_bytes + param_bytes_16bit / a)
        return _with_interference(moved, total, scatter_exposed + gather / a, straggler)
    if sharding == "zero1":
        scatter = gather_seconds(grad_bytes, links, collectives=buckets)
        gather = gather_seconds(param_bytes_16bit, links)
        exposed = max(scatter / buckets, scatter - backward_s) + gather
        moved = share * (grad_bytes + param_bytes_16bit) / a
        return _with_interference(moved, (scatter + gather) / a, exposed / a, straggler)
    # DDP: the bucketed all-reduce overlaps the last micro-batch's backward; the last bucket cannot.
    reduce = all_reduce_seconds(grad_bytes, links, collectives=buckets)
    exposed = max(reduce / buckets, reduce - backward_s)
    moved = 2 * share * grad_bytes / a
    return _with_interference(moved, reduce / a, exposed / a, straggler)


def _with_interference(moved: float, total: float, exposed: float, wait: float) -> tuple[float, float, float, float]:
    """The layout's communication with the slowdown its hidden part causes added to the exposed time."""
    return moved, total, exposed + overlap_interference_seconds(total - exposed), wait


def offload_streaming_seconds(
    sharded_weight_bytes: float, host_link_bytes_per_s: float, layers: int, compute_s: float
) -> float:
    """Exposed time of streaming offloaded parameter shards from host memory for one micro-batch.

    FSDP ``CPUOffload(offload_params=True)`` and ZeRO-3 parameter offload keep each rank's shard in CPU
    memory and copy it to the GPU before every all-gather, forward and backward: 2 x shard bytes over the
    GPU's host link per micro-batch (PyTorch FSDP docs, CPUOffload; ZeRO-Infinity, arXiv 2104.07857). The
    copies are prefetched a layer ahead like the gathers, so only what compute cannot hide, and at least
    one layer's copy, is exposed.
    """
    if sharded_weight_bytes <= 0 or host_link_bytes_per_s <= 0:
        return 0.0
    copy_s = 2 * sharded_weight_bytes / host_link_bytes_per_s
    return max(copy_s / max(1, layers), copy_s - compute_s)


def intra_node_kind(spec: GpuSpec, interconnect: str = "") -> str:
    """The link between GPUs of one node: NVLink where the card has it and the offer does not say PCIe;
    PCIe without peer-to-peer on GeForce cards (the driver disables P2P), else PCIe with P2P."""
    if spec.nvlink_gb_per_s and not _names_pcie(interconnect):
        return "NVLink"
    return "PCIe (no P2P)" if spec.gpu_class == "consumer" else "PCIe"


@functools.lru_cache(maxsize=256)
def _names_pcie(interconnect: str) -> bool:
    """Whether an offer's interconnect string says PCIe (a catalog repeats a few strings over thousands of offers)."""
    return "pcie" in interconnect.strip().lower()


def links_for(
    spec: GpuSpec,
    gpus_per_node: int,
    nodes: int = 1,
    interconnect: str = "",
    inter_node_gbit_per_s: float | None = None,
) -> Links:
    """The links of ``nodes`` nodes of ``gpus_per_node`` GPUs of ``spec`` (an offer's interconnect string
    names the intra-node link: "NVLink"/"NVSwitch", "PCIe" or "" for the card's own)."""
    kind = intra_node_kind(spec, interconnect)
    bandwidth = spec.nvlink_gb_per_s if kind == "NVLink" else spec.pcie_gb_per_s
    value = (gpus_per_node, nodes, kind, bandwidth, inter_node_gbit_per_s if nodes > 1 else None)
    return _INTERNED_LINKS.get(value, lambda: Links(*value))


# Links are interned by their fields (one instance per value, built once): the planner and the estimates after it
# meet the same few links thousands of times, and a shared instance keeps what it works out once (hash, label,
# ring latencies). The links depend on the card and the layout, never on a plan.
INTERNED_LINKS = 4096
_INTERNED_LINKS: Memo[Links] = Memo(INTERNED_LINKS)
