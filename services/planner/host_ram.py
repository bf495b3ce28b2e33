"""Host memory per node: what a setup needs (CPU offload, loading) and what an offer has."""

from __future__ import annotations

from services.catalog.offers import Offer
from services.estimator.memory import GIB
from services.planner.context import PlanContext, Setup
from services.planner.evaluator import Config
from services.planner.layouts import Layout


def host_ram_bytes_per_node(ctx: PlanContext, cfg: Config, layout: Layout) -> float:
    """CPU memory the offloaded states of one node take (ZeRO-Offload, arXiv 2101.06840: fp32 master weights,
    optimizer states and the gradient partition live in host memory; FSDP/ZeRO-3 offload the parameter
    shards too): what the same setup would keep per GPU without offload, with gradients sharded."""
    if not cfg.cpu_offload:
        return 0.0
    key = (cfg, layout.gpus_per_node)
    found = ctx.memo.host_ram_needs.get(key)
    if found is None:
        found = ctx.memo.host_ram_needs[key] = _offloaded_bytes_per_gpu(ctx, cfg) * layout.gpus_per_node
    return found


def _offloaded_bytes_per_gpu(ctx: PlanContext, cfg: Config) -> float:
    kept = ctx.evaluator.model_states(
        Config(cfg.gpus, cfg.sharding, cfg.micro_batch_size, cfg.accumulation_steps, cfg.checkpointing, False, None)
    )
    grad_width = 4.0 if ctx.plan.precision == "fp32" else 2.0
    per_gpu = kept.master_weights + kept.optimizer_states + kept.optimizer_states_paged
    per_gpu += kept.trainable_params * grad_width / cfg.gpus
    if cfg.sharding in ("zero3", "fsdp"):
        per_gpu += kept.weights + kept.adapters
    return per_gpu


def host_ram_available_bytes(offer: Offer, layout: Layout) -> float | None:
    """Host RAM of one node of ``layout`` on ``offer``; None when the offer does not say.

    ``host_ram_gib_per_node`` is the RAM of a node of ``gpus_per_node`` GPUs; a setup renting k of them is
    credited k / gpus_per_node of it, the share AWS's smaller sizes keep per GPU (g4dn.12xlarge 4 x T4 192 GiB
    of g4dn.metal's 8 x T4 384 GiB; g5.24xlarge 4 x A10G 384 GiB of g5.48xlarge's 768 GiB:
    aws.amazon.com/ec2/instance-types, accelerated computing)."""
    if offer.host_ram_gib_per_node is None:
        return None
    share = min(1.0, layout.gpus_per_node / max(1, offer.gpus_per_node))
    return offer.host_ram_gib_per_node * GIB * share


# Share of a node's host RAM kept free by default: the OS, the training process and its data loaders live
# there too (it was constraints.safety_margin's default before the GPU fit moved to the band's headroom).
HOST_RAM_MARGIN = 0.10


def host_ram_margin(ctx: PlanContext) -> float:
    """The share of host RAM kept free: HOST_RAM_MARGIN, or the user's safety margin where that is larger."""
    return max(HOST_RAM_MARGIN, ctx.constraints.safety_margin)


def usable_host_ram_bytes(ctx: PlanContext, offer: Offer, layout: Layout) -> float | None:
    """The host RAM per node an offload setup may fill: the node's RAM less the host RAM margin; None when
    unknown. Memoised per plan on what it reads (the RAM per node, the node size, the layout's GPUs per node):
    thousands of offers share a few."""
    key = (offer.host_ram_gib_per_node, offer.gpus_per_node, layout.gpus_per_node)
    if key in ctx.memo.usable_ram:
        return ctx.memo.usable_ram[key]
    available = host_ram_available_bytes(offer, layout)
    found = ctx.memo.usable_ram[key] = None if available is None else available * (1.0 - host_ram_margin(ctx))
    return found


def holds(need_bytes: float, usable_bytes: float | None) -> bool:
    """Whether a node's usable host RAM holds what a setup offloads (nothing offloaded, or RAM unknown: yes)."""
    return need_bytes <= 0 or usable_bytes is None or need_bytes <= usable_bytes


def host_ram_fits(ctx: PlanContext, offer: Offer, setup: Setup) -> bool:
    """Whether the node's host RAM holds what the setup offloads (True when the offer does not say)."""
    return holds(setup.host_ram_bytes_per_node, usable_host_ram_bytes(ctx, offer, setup.layout))
