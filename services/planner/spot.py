"""Spot pricing with lost work: checkpoint size, the Young/Daly checkpoint interval, expected rework.

No orchestrator prices spot with the work a preemption throws away (shared/reference/
orchestration_lessons.md section 4.6); this module computes
``expected hours = hours + checkpoint writes + E[preemptions] x (restart + interval / 2)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from services.estimator.architecture import Architecture
from services.estimator.memory import adapter_params, model_states
from services.estimator.plan import Plan
from services.estimator.recipe import resolve_recipe

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
