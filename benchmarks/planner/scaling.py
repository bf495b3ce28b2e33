"""The communication model (services.estimator.communication) against published scaling measurements.

Each case is a measured pair: per-GPU throughput (or run time) of the same training at two scales or over
two links. The model gets the compute time of one micro-batch from the first measurement (solving
measured step = compute + exposed communication + straggler wait) and predicts the second; the error is
predicted / measured - 1 of the second-to-first ratio. Nothing is fitted: every constant is the one the
planner uses.

Run: ``python -m benchmarks.planner.scaling`` (prints the table; writes benchmarks/results/planner_scaling.json).
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from services.estimator.communication import DATA_PARALLEL_SYNC_OVERHEAD, Links, step_communication

RESULTS = Path(__file__).resolve().parents[1] / "results"


@dataclass(frozen=True)
class Scale:
    links: Links
    throughput: float  # per GPU: tokens/s, or steps/s for a fixed job


@dataclass(frozen=True)
class Case:
    name: str
    source: str
    sharding: str
    params: float
    trainable: float
    layers: int
    weight_bytes: float  # per parameter as gathered
    grad_bytes: float  # per trainable parameter as reduced
    forward_share: float  # of one micro-batch's compute (replayed forward counts as backward)
    accumulation: int
    per_micro_batch: float  # tokens (or steps) one micro-batch is, in the unit of throughput
    base: Scale
    target: Scale
    tolerance: float  # the stated tolerance on the predicted ratio

    @property
    def measured_ratio(self) -> float:
        return self.target.throughput / self.base.throughput


def _step_s(case: Case, links: Links, compute_s: float, sync_overhead: float) -> float:
    comm = step_communication(
        case.sharding,
        links,
        grad_bytes=case.trainable * case.grad_bytes,
        param_bytes_16bit=case.trainable * 2.0,
        gathered_weight_bytes=case.params * case.weight_bytes,
        layers=case.layers,
        forward_s=compute_s * case.forward_share,
        backward_s=compute_s * (1 - case.forward_share),
        accumulation=case.accumulation,
        sync_overhead=sync_overhead,
    )
    return compute_s + comm.exposed_seconds + comm.straggler_seconds


def predicted_ratio(case: Case, sync_overhead: float = DATA_PARALLEL_SYNC_OVERHEAD) -> float:
    """Per-GPU throughput at the target scale over the base scale, as the model predicts it (``sync_overhead``:
    the data-parallel synchronisation overhead to use; benchmarks/planner/fit_sync.py fits it)."""
    measured_step = case.per_micro_batch / case.base.throughput
    lo, hi = 0.0, measured_step
    for _ in range(80):  # bisection: step time grows with compute
        mid = (lo + hi) / 2
        if _step_s(case, case.base.links, mid, sync_overhead) > measured_step:
            hi = mid
        else:
            lo = mid
    compute = lo
    base = _step_s(case, case.base.links, compute, sync_overhead)
    return base / _step_s(case, case.target.links, compute, sync_overhead)


def _h100_node(nodes: int) -> Links:
    # Grand Teton: 8 H100 on NVLink4 (450 GB/s per direction), 400 Gb/s RDMA per GPU = 3200 per node.
    return Links(8, nodes, "NVLink", 450.0, 3200.0 if nodes > 1 else None)


def _a100_40_node(nodes: int) -> Links:
    # MosaicML: 8 A100-40GB on NVLink3 (300 GB/s per direction), 1600 Gbit/s RoCE per node.
    return Links(8, nodes, "NVLink", 300.0, 1600.0 if nodes > 1 else None)


TORCHTITAN = (
    "pytorch/torchtitan docs/performance.md, Tables 1 and 3 (Llama 3.1 8B, FSDP, local batch 2 x 8192 tokens, "
    "selective activation checkpointing, bf16 parameters, fp32 gradient reduction; H100 Grand Teton hosts)"
)
FOUNDRY = (
    "mosaicml/llm-foundry scripts/train/benchmarking/README.md, 'A100 40GB with 1600 Gbps node-node "
    "interconnect (RoCE)' (MPT, FULL_SHARD, PURE bf16, activation checkpointing, seq 2048)"
)
HF_NVLINK = (
    "huggingface/transformers docs perf_hardware.md 'NVlink' benchmark: GPT-2 (124M) run_clm on wikitext, "
    "2 x TITAN RTX, DDP, 200 steps: 101 s with NVLink (NV2), 131 s with NCCL_P2P_DISABLE=1 (PCIe)"
)
EXXACT = (
    "Exxact, 'LoRA Fine Tuning Benchmark on NVIDIA RTX PRO GPUs' (2026-06-04): Llama-3.1-8B-Instruct LoRA, "
    "HF Transformers DDP (torchrun), per-step tokens/s averaged over steps 1-60; PCIe Gen5 cards, no NVLink. "
    "The page gives no LoRA rank or micro-batch: r=16 on every linear (41.9M fp32 adapter parameters, PEFT "
    "keeps adapters in fp32) and 4,096 tokens per micro-batch are assumed; over ranks 8-16 and micro-batches "
    "of 512-16,384 tokens the predicted ratio spans 0.957-0.968 (two GPUs) and 0.949-0.959 (four)"
)


def _pcie5(gpus: int) -> Links:
    return Links(gpus, 1, "PCIe", 64.0)


CASES: tuple[Case, ...] = (
    Case(
        "torchtitan 8B FSDP, 8 -> 128 H100",
        TORCHTITAN,
        "fsdp",
        8.03e9,
        8.03e9,
        32,
        2.0,
        4.0,
        0.25,
        1,
        2 * 8192,
        Scale(_h100_node(1), 5762),
        Scale(_h100_node(16), 5605),
        0.03,
    ),
    Case(
        "torchtitan 8B FSDP + compile, 8 -> 128 H100",
        TORCHTITAN,
        "fsdp",
        8.03e9,
        8.03e9,
        32,
        2.0,
        4.0,
        0.25,
        1,
        2 * 8192,
        Scale(_h100_node(1), 6667),
        Scale(_h100_node(16), 6514),
        0.03,
    ),
    Case(
        "MPT-7B FSDP, 32 -> 64 A100-40GB",
        FOUNDRY + "; micro-batch 18: 3725 and 3665 tokens/s/GPU",
        "fsdp",
        6.66e9,
        6.66e9,
        32,
        2.0,
        2.0,
        0.25,
        1,
        18 * 2048,
        Scale(_a100_40_node(4), 3725),
        Scale(_a100_40_node(8), 3665),
        0.03,
    ),
    Case(
        "MPT-7B FSDP, 32 -> 128 A100-40GB",
        FOUNDRY + "; micro-batch 18: 3725 and 3623 tokens/s/GPU",
        "fsdp",
        6.66e9,
        6.66e9,
        32,
        2.0,
        2.0,
        0.25,
        1,
        18 * 2048,
        Scale(_a100_40_node(4), 3725),
        Scale(_a100_40_node(16), 3623),
        0.03,
    ),
    Case(
        "MPT-13B FSDP, 64 -> 128 A100-40GB",
        FOUNDRY + "; micro-batch 16: 1976 and 1972 tokens/s/GPU",
        "fsdp",
        12.85e9,
        12.85e9,
        40,
        2.0,
        2.0,
        0.25,
        1,
        16 * 2048,
        Scale(_a100_40_node(8), 1976),
        Scale(_a100_40_node(16), 1972),
        0.03,
    ),
    Case(
        "GPT-2 DDP, 2 x TITAN RTX: NVLink -> PCIe without P2P",
        HF_NVLINK,
        "none",
        124.4e6,
        124.4e6,
        12,
        4.0,
        4.0,
        1 / 3,
        1,
        1,
        Scale(Links(2, 1, "NVLink", 50.0), 200 / 101),
        Scale(Links(2, 1, "PCIe (no P2P)", 16.0), 200 / 131),
        # The case behind hides_communication(): without P2P nothing of the all-reduce is hidden (the model
        # predicted 0.988, +28%, while it overlapped the all-reduce with the backward pass).
        0.06,
    ),
    # The two cases DATA_PARALLEL_SYNC_OVERHEAD is fitted on (benchmarks/planner/fit_sync.py: in-sample here).
    Case(
        "Llama-3.1-8B LoRA DDP, 1 -> 2 x RTX PRO 6000 (PCIe)",
        EXXACT + "; 4,962 tokens/s on one GPU, 9,541 on two",
        "none",
        8.03e9,
        41.9e6,
        32,
        2.0,
        4.0,
        0.45,
        1,
        4096,
        Scale(_pcie5(1), 4962),
        Scale(_pcie5(2), 9541 / 2),
        0.03,
    ),
    Case(
        "Llama-3.1-8B LoRA DDP, 1 -> 4 x RTX PRO 4500 (PCIe)",
        EXXACT + "; 2,777 tokens/s per GPU on one GPU, 2,679 per GPU on four",
        "none",
        8.03e9,
        41.9e6,
        32,
        2.0,
        4.0,
        0.45,
        1,
        4096,
        Scale(_pcie5(1), 2777),
        Scale(_pcie5(4), 2679),
        0.03,
    ),
)


def rows() -> list[dict[str, object]]:
    out = []
    for case in CASES:
        predicted = predicted_ratio(case)
        out.append(
            {
                "case": case.name,
                "measured_ratio": round(case.measured_ratio, 4),
                "predicted_ratio": round(predicted, 4),
                "error": round(predicted / case.measured_ratio - 1.0, 4),
                "tolerance": case.tolerance,
                "source": case.source,
                "base_links": case.base.links.label(),
                "target_links": case.target.links.label(),
            }
        )
    return out


def main() -> int:
    table = rows()
    RESULTS.mkdir(parents=True, exist_ok=True)
    errors = [abs(float(str(r["error"]))) for r in table]
    summary = {"cases": table, "median_abs_error": round(statistics.median(errors), 4), "max_abs_error": max(errors)}
    (RESULTS / "planner_scaling.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    for r in table:
        print(
            f"{r['case']:55} measured {r['measured_ratio']:.3f} predicted {r['predicted_ratio']:.3f} "
            f"error {r['error']:+.1%}"
        )
    print(f"median |error| {summary['median_abs_error']:.1%}, max {summary['max_abs_error']:.1%}")
    return 0 if all(abs(float(str(r["error"]))) <= float(str(r["tolerance"])) for r in table) else 1


if __name__ == "__main__":
    sys.exit(main())
