"""Spot pricing with lost work: sourced preemption rates, checkpoint size, the Young/Daly interval, rework.

No orchestrator prices spot with the work a preemption throws away (shared/reference/
orchestration_lessons.md section 4.6); this module computes
``expected hours = hours + checkpoint writes + E[preemptions] x (restart + interval / 2 + wait for capacity)``,
and what finishing on demand costs when spot capacity does not come back (``SPOT_RISKS``, docs/planner.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from services.estimator.architecture import Architecture
from services.estimator.memory import adapter_params, model_states
from services.estimator.plan import Plan
from services.estimator.recipe import resolve_recipe

# Where the spot figures come from: skypilot-org/spot-traces (the traces of "Can't Be Late", Wu et al., NSDI '24),
# commit 221da1a, counted as docs/planner.md ("Spot risk") describes. A trace's value is the number of its instances
# running at each tick: a preemption is a 1 -> 0 step, the wait is how long it stays 0.
SPOT_TRACE = "skypilot-org/spot-traces (Can't Be Late, NSDI '24)"
# ASSUMPTION: a job waits at most an hour for spot capacity after a preemption, then finishes on demand (what
# Can't Be Late's policies do when waiting would cost the deadline).
CAPACITY_WAIT_CAP_HOURS = 1.0
# preemption/1-node/aws-04-22-2023, p3.2xlarge (1 x V100) in us-east-1c/1f and us-west-2b/2c, 2023-04-22..29: 202
# preemptions in 431 running instance-hours; after one, capacity back within the hour 75% of the time (200 waits;
# mean wait, counting an hour at most, 0.50 h). No published trace covers A100/H100 spot; the Spot Instance
# Advisor puts p4d/p5 in its ">20%" bucket (the share of instances interrupted in the trailing month: a floor, not
# a per-hour rate), so the V100 figure stands for every AWS-shaped GPU spot offer.
AWS_GPU_PREEMPTIONS_PER_NODE_HOUR = 0.468
AWS_GPU_WAIT_HOURS = 0.50
AWS_GPU_NO_CAPACITY_SHARE = 0.25
# availability/1-node/aws-10-26-2022, us-west-2a/2b, 2022-10-26..11-08 (13 days): capacity for a whole 8 x V100
# p3.16xlarge vanished 1.088 times per available hour against 0.303 for a 1 x V100 p3.2xlarge (available 47% of
# the time against 75%): a whole 8-GPU node is lost 3.6x as often as one card.
EIGHT_GPU_NODE_SCARCITY = 3.6
SCARCITY_NODE_GPUS = 8  # the node size that factor was measured on (p3.16xlarge)


@dataclass(frozen=True)
class SpotRisk:
    """How often one spot node of one GPU is preempted, how long capacity takes to come back, and the source."""

    preemptions_per_node_hour: float
    wait_hours: float  # mean wait for capacity after a preemption, counting CAPACITY_WAIT_CAP_HOURS at most
    no_capacity_share: float  # share of preemptions after which capacity is not back within the cap
    source: str
    as_of: str  # when the figure was measured or the page read


_AWS_TRACE = SpotRisk(
    AWS_GPU_PREEMPTIONS_PER_NODE_HOUR,
    AWS_GPU_WAIT_HOURS,
    AWS_GPU_NO_CAPACITY_SHARE,
    f"{SPOT_TRACE}: 1 x V100 spot on AWS, 202 preemptions in 431 h",
    "2023-04-22..29",
)
# Per provider (lower-case name); any other provider's GPU spot gets DEFAULT_SPOT_RISK.
SPOT_RISKS: dict[str, SpotRisk] = {
    "aws": _AWS_TRACE,
    # cloud.google.com/compute/docs/instances/spot (read 2026-12-02): Spot VMs can be preempted at any time, with
    # 30 s notice, and publish no rate; the only GCP trace (c3-highcpu-88 CPUs, 3 preemptions in 180 h) is not GPUs.
    "gcp": SpotRisk(
        AWS_GPU_PREEMPTIONS_PER_NODE_HOUR,
        AWS_GPU_WAIT_HOURS,
        AWS_GPU_NO_CAPACITY_SHARE,
        "GCP publishes no rate (Spot VMs preempted at any time, 30 s notice); the AWS GPU trace of " + SPOT_TRACE,
        "2026-12-02",
    ),
    # learn.microsoft.com/azure/virtual-machines/spot-vms (read 2026-12-02): evicted with 30 s notice whenever Azure
    # needs the capacity, no SLA; the per-SKU eviction-rate buckets (0-5% .. 20+%) are shown per region, not listed.
    "azure": SpotRisk(
        AWS_GPU_PREEMPTIONS_PER_NODE_HOUR,
        AWS_GPU_WAIT_HOURS,
        AWS_GPU_NO_CAPACITY_SHARE,
        "Azure publishes per-region eviction buckets only (30 s notice); the AWS GPU trace of " + SPOT_TRACE,
        "2026-12-02",
    ),
}
DEFAULT_SPOT_RISK = SpotRisk(
    AWS_GPU_PREEMPTIONS_PER_NODE_HOUR,
    AWS_GPU_WAIT_HOURS,
    AWS_GPU_NO_CAPACITY_SHARE,
    f"no rate from the provider: the AWS GPU trace of {SPOT_TRACE}",
    "2023-04-22..29",
)


def spot_risk(provider: str) -> SpotRisk:
    """The sourced spot figures for a provider (the generic GPU-spot trace where it has none of its own)."""
    return SPOT_RISKS.get(provider.strip().lower(), DEFAULT_SPOT_RISK)


def node_scarcity(gpus_on_node: int) -> float:
    """How many times as often a spot node of this many GPUs is lost as one of a single GPU.

    Measured at 1 and 8 GPUs (EIGHT_GPU_NODE_SCARCITY); ASSUMPTION: linear in between (2 GPUs 1.37x, 4 GPUs 2.1x),
    and no worse beyond 8 (no larger node is traced).
    """
    g = min(max(gpus_on_node, 1), SCARCITY_NODE_GPUS)
    return 1.0 + (EIGHT_GPU_NODE_SCARCITY - 1.0) * (g - 1) / (SCARCITY_NODE_GPUS - 1)


def on_demand_fallback_hours(job_hours: float, no_capacity_per_hour: float) -> float:
    """Expected hours left to run on demand when spot capacity fails to come back at ``no_capacity_per_hour``.

    The first preemption without capacity comes at an exponential time t (rate lambda); the job then finishes the
    remaining ``job_hours - t`` on demand: E[max(0, T - t)] = T - (1 - exp(-lambda T)) / lambda.
    """
    if no_capacity_per_hour <= 0 or job_hours <= 0:
        return 0.0
    lam = no_capacity_per_hour
    return job_hours - (1.0 - math.exp(-lam * job_hours)) / lam


# ASSUMPTION: sustained write speed of a checkpoint to the node's disk or object storage (200 MB/s, 10^6 B).
CHECKPOINT_WRITE_BYTES_PER_S = 200e6
# LoRA adapters are saved in 16-bit (PEFT save_pretrained of a bf16/fp16 run).
ADAPTER_SAVE_BYTES = 2


def checkpoint_bytes(plan: Plan, arch: Architecture) -> float:
    """Bytes of a checkpoint that training can resume from after a preemption.

    Full fine-tuning: the weights as stored plus fp32 master weights (if any) plus optimizer states.
    LoRA/QLoRA: the adapters in 16-bit plus their optimizer states (the frozen base is re-downloaded,
    not saved). Optimizer states are counted for LoRA too because resuming without them restarts
    AdamW's moments (transformers' Trainer saves optimizer.pt beside the adapter).
    """
    whole = plan.model_copy(update={"gpus": 1, "sharding": "none", "cpu_offload": False})
    recipe = resolve_recipe(whole)
    states = model_states(whole, arch, recipe)
    optimizer = states.optimizer_states + states.optimizer_states_paged + states.master_weights
    if plan.method == "full":
        return states.weights + optimizer
    return float(adapter_params(arch, recipe) * ADAPTER_SAVE_BYTES) + optimizer


def checkpoint_write_seconds(size_bytes: float, write_bytes_per_s: float = CHECKPOINT_WRITE_BYTES_PER_S) -> float:
    """Seconds training stalls to write one checkpoint (synchronous save)."""
    return size_bytes / write_bytes_per_s


def young_daly_interval_seconds(write_seconds: float, mtbf_seconds: float) -> float:
    """Checkpoint interval that minimises write time plus expected rework: sqrt(2 x write x MTBF).

    Young 1974, "A first order approximation to the optimum checkpoint interval" (CACM 17(9)); Daly 2006
    refines it for short MTBFs, the same to first order when the write is much shorter than the MTBF.
    """
    return math.sqrt(2.0 * write_seconds * mtbf_seconds)


@dataclass(frozen=True)
class SpotRun:
    """Expected wall-clock of a job on spot GPUs and where the extra time goes."""

    hours: float  # expected wall-clock, everything included
    expected_preemptions: float
    checkpoint_interval_seconds: float
    checkpoint_write_seconds: float
    checkpoint_hours: float  # time spent writing checkpoints
    rework_hours: float  # restarts plus recomputed work lost since the last checkpoint


def spot_run(
    hours: float, nodes: int, preemptions_per_node_hour: float, restart_minutes: float, write_seconds: float
) -> SpotRun:
    """Expected spot wall-clock for a job of ``hours`` uninterrupted hours on ``nodes`` nodes.

    A preemption of any node stops the job, so the job's rate is nodes x the per-node rate and its MTBF
    is the inverse. Checkpoints are written every Young/Daly interval (an interval longer than the job
    means no checkpoint before the final save); each preemption costs the restart plus, on average, half
    an interval of work. First order: the rework
    itself is not preempted again, which holds while rate x (restart + interval/2) is much below 1.
    """
    rate_per_hour = preemptions_per_node_hour * nodes
    job_seconds = hours * 3600.0
    if rate_per_hour > 0:
        interval = min(young_daly_interval_seconds(write_seconds, 3600.0 / rate_per_hour), job_seconds)
    else:
        interval = job_seconds
    interval = max(interval, 1e-9)
    # Writes between the start and the end; the final save is not counted (an on-demand run makes it too).
    checkpoint_hours = max(0.0, job_seconds / interval - 1.0) * write_seconds / 3600.0
    base_hours = hours + checkpoint_hours
    preemptions = base_hours * rate_per_hour
    rework_hours = preemptions * (restart_minutes / 60.0 + interval / 2.0 / 3600.0)
    return SpotRun(
        hours=base_hours + rework_hours,
        expected_preemptions=preemptions,
        checkpoint_interval_seconds=interval,
        checkpoint_write_seconds=write_seconds,
        checkpoint_hours=checkpoint_hours,
        rework_hours=rework_hours,
    )
