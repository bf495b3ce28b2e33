"""Achievable matmul rates: the utilisation priors per GPU class and the per-GEMM roofline.

The priors (the large-GEMM rate of a training step per GPU class) come from the published
measurements cited below; calibration replaces them per GPU and method.
"""

from __future__ import annotations

from statistics import median

from services.catalog.gpus import GpuSpec
from services.estimator.elementwise import mpt_elementwise_bytes_per_token

# Share of dense peak that the matmul-heavy part of a training step reaches, by GPU class, for a
# well-fed micro-batch (the MFU-style utilisation prior; calibration replaces it per GPU and method).
#
# The prior multiplies *hardware* FLOPs (recompute included), so what it must match is hardware FLOPs
# utilisation (HFU). llm-foundry's benchmarking README (mosaicml/llm-foundry scripts/train/benchmarking/
# README.md; shared/reference/orchestration_lessons.md section 3.2) measured MPT-7B at seq 2048 without
# activation checkpointing, where HFU = MFU: 46.4% on 8xH100 and 64.2% on 8xA100 80GB. Other classes are
# derived: END_TO_END_OVER_MATMUL (what a training step keeps of the best achievable matmul rate, from
# those two classes) times the class's measured best-case matmul share (MAMF / datasheet dense peak).
# These are pretraining-stack figures; a less tuned fine-tuning stack runs slower, which calibration
# measures (the earlier 0.42 / 0.50 were such a discount, inferred rather than measured).
PUBLISHED_MFU: dict[str, float] = {"hopper": 0.464, "ampere-dc": 0.642}
# Maximum achievable matmul FLOPS over the datasheet dense bf16 peak, measured with stas00's
# mamf-finder (stas00/ml-engineering compute/accelerator/README.md: A100 SXM 86.9%, H100 SXM 80.3%,
# B200 77.6%; mag-/gpu_benchmark README, the same finder: RTX 4090 178.5 TFLOPS against 165.2 dense
# with FP32 accumulate, because GeForce cards boost above their rated clock).
# The ada class: mag-/gpu_benchmark README "Stats" table (mamf-finder with an Optuna shape search) measured
# all four Ada datacenter/workstation cards of the catalog: L4 91.4 TFLOPS (dense bf16 121), L40 170.3 (181),
# L40S 252.0 (362), RTX 6000 Ada 278.5 (364.2); the class gets the median of their shares.
ADA_MATMUL_SHARES = (91.4 / 121.0, 170.3 / 181.0, 252.0 / 362.0, 278.5 / 364.2)
MATMUL_SHARE: dict[str, float] = {
    "ampere-dc": 0.869,
    "hopper": 0.803,
    "blackwell": 0.776,
    "consumer": 178.5 / 165.2,
    "ada": median(ADA_MATMUL_SHARES),
}
# The published step includes MPT-7B's own element-wise kernels (LayerNorm, GELU, residual adds, the loss;
# mosaicml/mpt-7b config.json: d_model 4096, 32 layers, expansion_ratio 4, vocab 50,432; 6.65e9 parameters),
# which the estimator charges separately (services/estimator/elementwise.py), and llm-foundry's HFU counts
# attention as 12 x layers x d_model x seq FLOPs per token where causal flash attention does half, as the
# estimator counts it. The GEMM-and-attention rate behind each published figure is what the published step
# time leaves for the FLOPs the estimator counts once the element-wise time is taken out; datasheet peaks
# and bandwidths of the SXM cards llm-foundry measured (NVIDIA A100 80GB: 312 TFLOPS bf16, 2,039 GB/s;
# H100 SXM: 989 TFLOPS, 3,350 GB/s).
MPT_7B = {"params": 6.65e9, "d_model": 4096, "layers": 32, "ffn": 4 * 4096, "vocab": 50432, "seq": 2048}
PUBLISHED_CARDS = {"ampere-dc": (312e12, 2039e9), "hopper": (989e12, 3350e9)}


def _gemm_rate_behind(hfu: float, peak_flops: float, bytes_per_s: float) -> float:
    """The share of peak the GEMMs and attention of llm-foundry's MPT-7B reached, given its published HFU."""
    m = MPT_7B
    attention = 12.0 * m["layers"] * m["d_model"] * m["seq"]
    published_flops = 6.0 * m["params"] + attention
    counted_flops = 6.0 * m["params"] + attention / 2
    seconds_per_token = published_flops / (hfu * peak_flops)
    elementwise = mpt_elementwise_bytes_per_token(m) / bytes_per_s
    return counted_flops / (peak_flops * (seconds_per_token - elementwise))


GEMM_RATE: dict[str, float] = {
    cls: round(_gemm_rate_behind(PUBLISHED_MFU[cls], *PUBLISHED_CARDS[cls]), 3) for cls in PUBLISHED_MFU
}
END_TO_END_OVER_MATMUL = (
    GEMM_RATE["ampere-dc"] / MATMUL_SHARE["ampere-dc"] + GEMM_RATE["hopper"] / MATMUL_SHARE["hopper"]
) / 2
# No published sustained-matmul or training-MFU figure was found for these classes (T4 is power-capped
# at 70 W, so the real figure may well be lower): they get the mean matmul share of the measured
# datacenter classes, and their utilisation_source says so.
UNMEASURED_CLASSES = ("ampere-pro", "turing", "blackwell-pro")
TYPICAL_MATMUL_SHARE = (MATMUL_SHARE["ampere-dc"] + MATMUL_SHARE["hopper"] + MATMUL_SHARE["blackwell"]) / 3


def _utilisation_priors() -> dict[str, tuple[float, str]]:
    """(prior, where it comes from) per GPU class, from the published figures above."""
    out: dict[str, tuple[float, str]] = {
        cls: (
            GEMM_RATE[cls],
            f"published training utilisation for {cls} GPUs (llm-foundry MPT-7B, {PUBLISHED_MFU[cls]:.3f}), "
            "its element-wise time taken out",
        )
        for cls in PUBLISHED_MFU
    }
    for cls in ("blackwell", "consumer", "ada"):
        out[cls] = (
            round(END_TO_END_OVER_MATMUL * MATMUL_SHARE[cls], 3),
            f"measured matmul share {MATMUL_SHARE[cls]:.2f} for {cls} GPUs x end-to-end/matmul "
            f"{END_TO_END_OVER_MATMUL:.2f}",
        )
    for cls in UNMEASURED_CLASSES:
        out[cls] = (
            round(END_TO_END_OVER_MATMUL * TYPICAL_MATMUL_SHARE, 3),
            f"no published measurement for {cls} GPUs: datacenter-typical matmul share assumed",
        )
    return out


UTILISATION_PRIORS = _utilisation_priors()
# What each prior rests on is in UTILISATION_PRIORS (and docs/accuracy.md).
UTILISATION_PRIOR: dict[str, float] = {cls: prior for cls, (prior, _) in UTILISATION_PRIORS.items()}


def utilisation_or_prior(gpu: GpuSpec, utilisation: float | None) -> float:
    """The calibrated utilisation where one is given, else the card's class prior."""
    return utilisation if utilisation is not None else UTILISATION_PRIOR.get(gpu.gpu_class, 0.4)


def gemm_seconds(m: float, k: float, n: float, flops_per_s: float, bytes_per_s: float, element_bytes: int) -> float:
    """Roofline time of one (m x k) @ (k x n) GEMM: the larger of its math time and its memory time.

    NVIDIA Deep Learning Performance guide, "Matrix Multiplication Background" (sections "Math and
    Memory Bounds" and "Dimension Quantization Effects"): a GEMM does 2mkn FLOPs and moves at least
    (mk + kn + mn) elements, so its arithmetic intensity falls with a small m (tokens per micro-batch)
    and it becomes bandwidth-bound below the card's FLOPs:bytes ratio. ``flops_per_s`` is the
    large-GEMM rate (peak x utilisation prior).
    """
    math = 2.0 * m * k * n / flops_per_s
    memory = (m * k + k * n + m * n) * element_bytes / bytes_per_s
    return max(math, memory)
