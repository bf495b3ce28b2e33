"""Training throughput: FLOPs per token, achievable utilisation, communication, time and cost.

Step time per GPU = compute (hardware FLOPs / (peak x utilisation), the block linears on a per-GEMM
roofline at the real tokens per micro-batch, plus the memory passes of unfused LoRA adapters; at least
the weight-read time and the kernel-dispatch time) + QLoRA dequantisation + the exposed part of
communication + the optimizer step, amortised over the micro-batches of an optimizer step. Sources are
named where each term is computed; the utilisation priors (the large-GEMM rate of a training step per
GPU class) come from published measurements cited below and are replaced by calibrated
values when a calibration benchmark exists for the GPU and method.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from statistics import median
from typing import TypeVar

from services.catalog.gpus import GpuSpec
from services.estimator.architecture import Architecture, parameter_counts
from services.estimator.communication import (
    Links,
    StepCommunication,
    links_for,
    offload_streaming_seconds,
    step_communication,
    total_parameters,
)
from services.estimator.elementwise import elementwise_bytes_per_token, mpt_elementwise_bytes_per_token
from services.estimator.memory import (
    ModelStates,
    adapter_params,
    lora_roles_of,
    quantized_bytes_per_weight,
    quantized_params,
)
from services.estimator.padding import batch_row_tokens, data_tokens_per_processed_token
from services.estimator.plan import Plan
from services.estimator.recipe import Recipe

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

# Sources of the constants below (docs/accuracy.md, "Other throughput constants"):
# - KERNELS_PER_BLOCK_FORWARD / BACKWARD_KERNELS_PER_FORWARD and HOST_SECONDS_PER_OP: measured by
#   ``python -m benchmarks.mechanisms.dispatch`` (benchmarks/results/dispatch.json) on transformers'
#   LlamaDecoderLayer (SDPA): 41-45 non-view aten ops per layer forward and 69-73 backward (fp32 / bf16:
#   bf16 adds RMSNorm's dtype casts; 9 more in a backward that accumulates into existing gradients),
#   counted with TorchDispatchMode over a 9-layer minus a 1-layer stack;
#   and 7.8-9.2 us of host time per op on 4-token fp32 tensors in the quietest runs (the fastest of 40
#   rounds, single-threaded, on the project's shared 2-core CI machine; up to 14 us while it is busy):
#   Python module calls, the dispatcher, autograd recording and a CPU kernel too small to matter; we take
#   8.5 us. bf16 reads 13-14 us there because CPU bf16 kernels are slow, not the host.
# - CUDA_LAUNCH_SECONDS: on a GPU the kernel runs asynchronously and its launch is host work on top:
#   cudaLaunchKernel costs 4-6 us per kernel (pegainfer's launch-overhead measurements on CUDA 13,
#   susun-blog.com "From Launch Overhead to CUDA Graph"); we take the middle, 5 us.
# - INTER_NODE_GB_PER_S: one 200 Gb/s HDR InfiniBand adapter per GPU (NVIDIA DGX A100 user guide).
# - Overlap of communication with compute: services/estimator/communication.py, per collective over the
#   real links (FSDP's prefetch, DDP's bucketed all-reduce during backward) with its sources.
# Eager PyTorch issues this many kernels per transformer block per forward (the two dtypes' mean), and its
# backward 1.7 times as many (73 / 43; 69 / 41 in fp32).
KERNELS_PER_BLOCK_FORWARD = 43
BACKWARD_KERNELS_PER_FORWARD = 1.7
# Host-side cost per kernel in eager mode (a GPU step cannot be shorter than its launches): the framework's
# host time per op plus the CUDA launch.
HOST_SECONDS_PER_OP = 8.5e-6
CUDA_LAUNCH_SECONDS = 5e-6
DISPATCH_SECONDS_PER_KERNEL = HOST_SECONDS_PER_OP + CUDA_LAUNCH_SECONDS
# DeepSpeed ZeRO's host hooks, in eager host ops (HOST_SECONDS_PER_OP each), measured by
# ``python -m benchmarks.mechanisms.zero_hooks`` (benchmarks/results/zero_hooks.json; DeepSpeed 0.19.8 on
# transformers' LlamaDecoderLayer; rounded medians of six runs, the last three in that file): ZeRO-3
# gathers and frees each module's parameters around every call of the module (17-28 ops per module per
# forward, the forward replayed under checkpointing included; 7-12 per module in the backward), and
# ZeRO-2/3 move every trained tensor's gradient into the reduce bucket in a backward hook (ZeRO-3 9-12 ops
# per tensor, ZeRO-2 6-9). Host work every micro-batch, on any number of GPUs; ZeRO-1 adds under one op
# per tensor and is left out.
ZERO3_HOST_OPS_PER_MODULE_FORWARD = 20
ZERO3_HOST_OPS_PER_MODULE_BACKWARD = 9
ZERO3_HOST_OPS_PER_TRAINED_TENSOR = 10
ZERO2_HOST_OPS_PER_TRAINED_TENSOR = 7
# Modules a block calls besides its linears and norms: the block, its attention and MLP and the activation
# module (transformers' Llama layer calls 13 with 7 linears and 2 norms; the benchmark counts them). PEFT's
# lora.Linear calls 4 more than the linear it wraps, which becomes its base_layer: itself, its dropout (an
# nn.Identity at p = 0), lora_A and lora_B (peft/tuners/lora/layer.py; tests/benchmarks/test_mechanisms.py).
BLOCK_CONTAINER_MODULES = 4
PEFT_MODULES_PER_ADAPTED_LINEAR = 4
# auto-gptq's PyTorch dequantization of a 4-bit GPTQ weight (QuantLinear.forward for 128 rows or more, exllama
# off; auto_gptq/nn_modules/qlinear/qlinear_cuda_old.py), bytes per weight element: the shift of the
# packed int32 words (read 0.5, write 4), the cast to int8 (4, 1), the mask (1, 1), minus the zeros (1, 1),
# times the scales into 16-bit (1, 2), and the matmul reading the copy (2) -- against bitsandbytes' 4.6.
# Its kernels: those five on the weight and four on the zero points.
GPTQ_DEQUANT_BYTES = 0.5 + 4 + (4 + 1) + (1 + 1) + (1 + 1) + (1 + 2) + 2
# bitsandbytes dequantises a 4-bit weight to 16-bit before each matmul: read 0.5 B and the constants,
# write 2 B, and the matmul reads the 2 B back.
BNB_DEQUANT_BYTES = 4.6
GPTQ_DEQUANT_KERNELS_PER_LINEAR = 9
GPUS_PER_NODE = 8
INTER_NODE_GB_PER_S = 25.0  # 200 Gb/s per GPU (InfiniBand HDR-class fabric)
# DeepSpeed CPU-Adam updates ~1e9 parameters/s on a server CPU (ZeRO-Offload paper, arXiv 2101.06840,
# reports 6-7x over PyTorch CPU Adam; order 1 s per billion parameters per node).
CPU_ADAM_PARAMS_PER_S = 1.0e9

# GPU-independent work of the last plans, keyed by the identity of their (frozen) architecture and
# recipe objects: the estimate and the planner evaluate one plan on every card, and hashing or comparing
# the nested dataclasses would cost more than recomputing.
_BY_IDENTITY: dict[tuple[object, ...], tuple[object, object, object]] = {}
_BY_IDENTITY_MAX = 256
T = TypeVar("T")


def _cached(kind: str, arch: Architecture, recipe: Recipe, key: tuple[object, ...], compute: Callable[[], T]) -> T:
    k = (kind, id(arch), id(recipe), *key)
    hit = _BY_IDENTITY.get(k)
    if hit is not None and hit[0] is arch and hit[1] is recipe:
        return hit[2]  # type: ignore[return-value]
    value = compute()
    if len(_BY_IDENTITY) >= _BY_IDENTITY_MAX:
        _BY_IDENTITY.clear()
    _BY_IDENTITY[k] = (arch, recipe, value)
    return value


def forward_replay_share(plan: Plan, recipe: Recipe) -> float:
    """Share of the block forward that activation checkpointing replays in backward: all of it, half for
    selective checkpointing (llm-foundry HFU accounting), none without checkpointing or outside training."""
    if not (plan.is_training and plan.gradient_checkpointing):
        return 0.0
    return 0.5 if recipe.checkpoint_granularity == "selective" else 1.0


def micro_batch_tokens(plan: Plan, recipe: Recipe) -> float:
    """Tokens one micro-batch processes, pad tokens included: its rows x their length, which under padding
    to the longest sample is that sample's expected length, not ``seq_len`` (services.estimator.padding)."""
    return plan.micro_batch_size * batch_row_tokens(plan, recipe)


def dispatch_seconds(plan: Plan, arch: Architecture, recipe: Recipe, lora_kernels_per_layer: int) -> float:
    """Host time to issue one micro-batch in eager mode: layers x (block + unfused-LoRA kernels) x the dispatch
    cost per kernel, for the forward, the backward (1.7 times its kernels) and a checkpoint replay, plus a GPTQ
    checkpoint's dequantization kernels and the hooks of DeepSpeed ZeRO-2/3 (``zero_hook_seconds``)."""
    passes = 1.0
    if plan.is_training:
        passes += BACKWARD_KERNELS_PER_FORWARD + (1 if plan.gradient_checkpointing else 0)
    kernels = arch.num_layers * (KERNELS_PER_BLOCK_FORWARD + lora_kernels_per_layer) * DISPATCH_SECONDS_PER_KERNEL
    return (
        kernels * passes
        + gptq_dequant_passes(plan, recipe) * _gptq_dequant_kernel_seconds(arch)
        + zero_hook_seconds(plan, arch, recipe)
    )


def gptq_dequant_passes(plan: Plan, recipe: Recipe) -> float:
    """Times a GPTQ checkpoint's weights are dequantized per micro-batch: the forward and its replay under
    checkpointing; the backward uses the copy autograd saved (services.estimator.memory.gptq_dequantized_bytes)."""
    if plan.quantized is None or recipe.quant_backend != "auto-gptq":
        return 0.0
    return 1.0 + (forward_replay_share(plan, recipe) if plan.is_training else 0.0)


def _gptq_dequant_kernel_seconds(arch: Architecture) -> float:
    linears = sum(b.count * len(b.linears) for b in arch.blocks)
    return linears * GPTQ_DEQUANT_KERNELS_PER_LINEAR * DISPATCH_SECONDS_PER_KERNEL


def zero_hook_seconds(plan: Plan, arch: Architecture, recipe: Recipe) -> float:
    """Host seconds DeepSpeed ZeRO's hooks take per micro-batch (constants above): under ZeRO-3 every module
    call gathers and frees its parameters in the forward, its replay under checkpointing and the backward;
    under ZeRO-2 and ZeRO-3 every trained tensor's gradient is bucketed by a backward hook."""
    if not plan.is_training or plan.sharding not in ("zero2", "zero3"):
        return 0.0
    replay = forward_replay_share(plan, recipe)
    modules, tensors = _cached("zero", arch, recipe, (plan.method == "full",), lambda: _hooked(arch, recipe, plan))
    ops = float(tensors) * (
        ZERO3_HOST_OPS_PER_TRAINED_TENSOR if plan.sharding == "zero3" else ZERO2_HOST_OPS_PER_TRAINED_TENSOR
    )
    if plan.sharding == "zero3":
        ops += modules * (ZERO3_HOST_OPS_PER_MODULE_FORWARD * (1.0 + replay) + ZERO3_HOST_OPS_PER_MODULE_BACKWARD)
    return ops * HOST_SECONDS_PER_OP


def _hooked(arch: Architecture, recipe: Recipe, plan: Plan) -> tuple[int, int]:
    """(modules called, trained tensors) over the blocks: a linear is one module and one weight (+ a bias), a
    mixture-of-experts linear one module holding every expert's weights (transformers' grouped experts), a
    norm one module of one tensor (two for LayerNorm); a LoRA adapter adds PEFT's modules and its A and B."""
    full = plan.method == "full"
    norm_tensors = 2 if arch.norm == "layer" else (0 if arch.norm == "nonparam" else 1)
    modules = tensors = 0
    for b in arch.blocks:
        adapted = 0 if full else sum(1 for lin in b.linears if lora_roles_of(lin, recipe))
        modules += b.count * (
            BLOCK_CONTAINER_MODULES + len(b.linears) + b.norm_count + PEFT_MODULES_PER_ADAPTED_LINEAR * adapted
        )
        if full:
            tensors += b.count * (sum(1 + lin.bias for lin in b.linears) + b.norm_count * norm_tensors)
        else:
            tensors += b.count * 2 * adapted
    return modules, tensors


def utilisation_or_prior(gpu: GpuSpec, utilisation: float | None) -> float:
    """The calibrated utilisation where one is given, else the card's class prior."""
    return utilisation if utilisation is not None else UTILISATION_PRIOR.get(gpu.gpu_class, 0.4)


def large_gemm_flops_per_s(plan: Plan, gpu: GpuSpec, utilisation: float | None) -> float:
    """The card's large-GEMM rate for the plan's precision: dense peak x the utilisation (or its class prior)."""
    return gpu.dense_tflops(plan.precision) * 1e12 * utilisation_or_prior(gpu, utilisation)


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


def block_linear_gemms(
    plan: Plan,
    arch: Architecture,
    recipe: Recipe,
    flops_per_s: float,
    bytes_per_s: float,
    tokens: float | None = None,
) -> tuple[float, float]:
    """(FLOPs, roofline seconds) of every block linear's GEMMs in one micro-batch.

    The GEMMs of a linear (Narayanan et al. 2021, arXiv 2104.04473, section 5.1: forward, the
    input-gradient and the weight-gradient matmul, each 2mkn): forward at m = tokens, the input
    gradient (m x n @ n x k), the weight gradient (k x m @ m x n) only for trained weights, and the
    forward again under activation checkpointing (half of it for selective). Expert linears of a
    mixture-of-experts layer each see tokens x experts_per_token / experts rows. Same accounting as
    ``flops_per_token``, so for large m the seconds equal FLOPs / ``flops_per_s``. ``tokens``: the micro-batch's
    tokens when the caller has them (``micro_batch_tokens``).
    """
    replay = forward_replay_share(plan, recipe)
    tokens = micro_batch_tokens(plan, recipe) if tokens is None else tokens
    training, full = plan.is_training, plan.method == "full"
    width = recipe.compute_bytes
    total, least_intensity, gemms = _cached(
        "gemms",
        arch,
        recipe,
        (tokens, training, full, replay, width),
        lambda: _gemm_work(_linear_gemm_shapes(arch, tokens, training, full, replay), width),
    )
    if flops_per_s / bytes_per_s <= least_intensity:  # every GEMM is math-bound on this card
        return total, total / flops_per_s
    return total, sum(max(f / flops_per_s, nbytes / bytes_per_s) for f, nbytes in gemms)


def _gemm_work(
    shapes: tuple[tuple[float, float, float, float], ...], width: int
) -> tuple[float, float, tuple[tuple[float, float], ...]]:
    """(total FLOPs, least FLOPs per byte, (FLOPs, bytes) per GEMM) of the shapes: ``gemm_seconds``'s terms."""
    gemms = tuple((t * 2.0 * m * k * n, t * (m * k + k * n + m * n) * width) for m, k, n, t in shapes)
    total = sum(f for f, _ in gemms)
    least = min((f / nbytes for f, nbytes in gemms if nbytes > 0), default=float("inf"))
    return total, least, gemms


def _linear_gemm_shapes(
    arch: Architecture, tokens: float, training: bool, weight_grads: bool, replay: float
) -> tuple[tuple[float, float, float, float], ...]:
    """(m, k, n, how many) of each block-linear GEMM of a micro-batch; cached, as the planner asks per card."""
    out: list[tuple[float, float, float, float]] = []
    for b in arch.blocks:
        for lin in b.linears:
            k, n = float(lin.in_features), float(lin.out_features)
            m = tokens * b.experts_per_token / lin.copies if lin.copies > 1 else tokens
            times = float(b.count * lin.copies)
            out.append((m, k, n, times * (1.0 + (replay if training else 0.0))))
            if training:
                out.append((m, n, k, times))
                if weight_grads:
                    out.append((k, m, n, times))
    return tuple(out)


def lora_unfused_bytes_per_token(
    in_features: int, out_features: int, compute_bytes: int, adapter_input_bytes: int, dropout: bool
) -> tuple[float, float]:
    """(forward, backward) bytes one token moves through one PEFT-style LoRA linear besides its GEMMs.

    PEFT's ``lora.Linear.forward`` (peft/tuners/lora/layer.py) runs, after the base layer:
    ``x = self._cast_input_dtype(x, lora_A.weight.dtype)``, ``result = result + lora_B(lora_A(dropout(x)))
    * scaling`` and ``result.to(torch_result_dtype)``; each is a separate memory-bound kernel over a
    full activation (LoRAFusion, Zhu et al. 2025, arXiv 2510.00206, section 3: redundant memory traffic
    of unfused LoRA on large activation tensors). Counted per token, with ``a`` the adapter's input
    width (``adapter_input_bytes``, or the compute width when it shares the input) and ``c`` the compute
    width: forward = cast (read c, write a per input feature) + dropout (read a, write a + a 1-byte mask)
    + lora_A reading its input (a) + lora_B writing its output (a per output feature) + the scaling
    (read a, write a) + the add (read c and a, write a) + the cast back (read a, write c, when a != c).
    Backward = the cast back's gradient (c, a) + the scaling (a, a) + lora_B's two GEMMs reading the
    output gradient (2a) + lora_A's weight gradient reading the saved input (a) and its input gradient
    written (a) + dropout (read a + mask, write a) + the cast (a, c) + accumulating into the base
    layer's input gradient (read 2c, write c). The rank-wide intermediates are negligible.
    """
    c = float(compute_bytes)
    a = float(adapter_input_bytes or compute_bytes)
    d_in, d_out = float(in_features), float(out_features)
    cast = a != c
    fwd = d_in * a + d_out * a  # lora_A reads its input, lora_B writes its output
    fwd += d_out * 2 * a  # * scaling
    fwd += d_out * (c + 2 * a)  # result + ...
    bwd = d_out * 2 * a + d_out * 2 * a  # scaling backward, lora_B dX and dW read the gradient
    bwd += d_in * 2 * a  # lora_A weight gradient reads the input, its input gradient is written
    bwd += d_in * 3 * c  # accumulate into the base layer's input gradient
    if cast:
        fwd += d_in * (c + a) + d_out * (a + c)
        bwd += d_out * (c + a) + d_in * (a + c)
    if dropout:
        fwd += d_in * (2 * a + 1)
        bwd += d_in * (2 * a + 1)
    return fwd, bwd


def lora_unfused_kernels_per_linear(adapter_input_bytes: int, compute_bytes: int, dropout: bool) -> int:
    """Forward kernels PEFT's ``lora.Linear.forward`` adds per adapted linear (see above).

    lora_A, lora_B, the scaling multiply and the add, plus the input cast and the cast back when the
    adapter runs in another dtype, plus dropout when its probability is not 0 (``nn.Identity`` then).
    """
    cast = 2 if adapter_input_bytes and adapter_input_bytes != compute_bytes else 0
    return 4 + cast + (1 if dropout else 0)


def lora_unfused_work(plan: Plan, arch: Architecture, recipe: Recipe) -> tuple[float, int]:
    """(bytes per token over all passes, forward kernels per layer) of the plan's unfused LoRA adapters.

    Zero for full fine-tuning, for unsloth, whose LoRA MLP/QKV/O autograd functions fuse the adapter
    into the base matmul's kernels (unslothai/unsloth unsloth/kernels/fast_lora.py), and for compiled
    blocks, where TorchInductor fuses the casts, dropout, scaling and add into the neighbouring kernels
    (Ansel et al. 2024, "PyTorch 2", ASPLOS, section 4: pointwise fusion).
    Checkpointing replays the forward (half of it for selective checkpointing, as in ``flops_per_token``).
    """
    if plan.method == "full" or recipe.fused_lora_kernels or recipe.compiled or not plan.is_training:
        return 0.0, 0
    replay = forward_replay_share(plan, recipe)
    return _cached("lora", arch, recipe, (replay,), lambda: _lora_unfused_work(arch, recipe, replay))


def step_elementwise_bytes(plan: Plan, arch: Architecture, recipe: Recipe) -> float:
    """Bytes per token of the step's element-wise kernels (services.estimator.elementwise); cached per plan shape."""
    replay = forward_replay_share(plan, recipe)
    key = (plan.is_training, plan.method == "full", plan.seq_len, replay)  # the recipe holds the framework
    return _cached("elementwise", arch, recipe, key, lambda: elementwise_bytes_per_token(plan, arch, recipe, replay))


def _lora_unfused_work(arch: Architecture, recipe: Recipe, replay: float) -> tuple[float, int]:
    """``lora_unfused_work`` for a trained LoRA plan; cached, as the planner asks once per card."""
    dropout = recipe.lora_dropout > 0.0
    total = 0.0
    kernels = 0
    layers = max(1, arch.num_layers)
    for b in arch.blocks:
        for lin in b.linears:
            roles = lora_roles_of(lin, recipe)
            if not roles:
                continue
            d_out = lin.out_features * len(roles) // len(lin.roles)
            fwd, bwd = lora_unfused_bytes_per_token(
                lin.in_features, d_out, recipe.compute_bytes, recipe.adapter_input_bytes, dropout
            )
            # Expert copies each see their share of the tokens: per token the traffic is experts_per_token x.
            share = b.experts_per_token if lin.copies > 1 else 1
            total += b.count * share * (fwd * (1.0 + replay) + bwd)
            kernels += (
                b.count
                * lin.copies
                * lora_unfused_kernels_per_linear(recipe.adapter_input_bytes, recipe.compute_bytes, dropout)
            )
    return total, -(-kernels // layers)


@dataclass(frozen=True)
class FlopsPerToken:
    forward: float
    backward: float
    recompute: float
    model_flops: float  # 6N + 12 L h s convention (MFU numerator), per token

    @property
    def hardware(self) -> float:
        return self.forward + self.backward + self.recompute


@dataclass(frozen=True)
class Throughput:
    tokens_per_s: float  # over all GPUs of the plan; tokens processed, pad tokens included
    tokens_per_s_per_gpu: float
    data_tokens_per_s: float  # the data set's tokens consumed per second over all GPUs (time and cost use it)
    step_seconds: float  # one micro-batch on every GPU, optimizer and communication amortised
    mfu: float
    utilisation_assumed: float
    flops_per_token: FlopsPerToken
    seconds: dict[str, float]  # per micro-batch: compute, dequantization, communication, optimizer
    utilisation_source: str


def flops_per_token(plan: Plan, arch: Architecture, recipe: Recipe) -> FlopsPerToken:
    """FLOPs one token costs in a training step (Kaplan et al. 2020: 2N forward, 4N backward).

    Frozen weights skip the weight-gradient matmul (LoRA paper, Hu et al. 2021: ~25% faster than
    full); activation checkpointing replays the forward (+2N, llm-foundry HFU accounting); causal
    flash attention computes half the score matrix (2 * 2 * s/2 * d per layer forward).
    """
    seq = plan.seq_len
    matmul = float(arch.lm_head_matmul_params)
    attn_fwd = 0.0
    layer_matmul = 0.0
    for b in arch.blocks:
        active_linear = sum(
            lin.in_features * lin.out_features * (b.experts_per_token if lin.copies > 1 else 1) for lin in b.linears
        )
        layer_matmul += b.count * active_linear
        causal = 0.5 if recipe.attention != "eager" else 1.0
        n_attn = 2 if b.kind == "cross-decoder" else 1
        attn_fwd += b.count * n_attn * 2 * 2 * seq * causal * b.num_heads * b.head_dim
    matmul += layer_matmul
    adapters = float(adapter_params(arch, recipe))
    fwd = 2 * matmul + attn_fwd + 2 * adapters
    if not plan.is_training:
        return FlopsPerToken(fwd, 0.0, 0.0, fwd)
    weight_grad = 2 * matmul if plan.method == "full" else 2 * adapters
    # Attention backward = 2.5x its forward FLOPs: 5 matmuls against 2 (FlashAttention-2, Dao 2023,
    # arXiv 2307.08691; the flash-attention benchmark scripts count bwd FLOPs as 2.5 x fwd).
    bwd = 2 * matmul + 2 * adapters + weight_grad + 2.5 * attn_fwd
    recompute = 0.0
    if plan.gradient_checkpointing:
        block_fwd = 2 * layer_matmul + attn_fwd
        recompute = block_fwd * forward_replay_share(plan, recipe)
        if recipe.checkpoint_granularity == "selective":
            recompute -= attn_fwd * 0.5  # SDPA outputs are saved, not recomputed
    n_active = parameter_counts(arch).active
    layers = arch.num_layers
    width = max(b.num_heads * b.head_dim for b in arch.blocks)
    model = 6.0 * n_active + 12.0 * layers * width * seq
    return FlopsPerToken(fwd, bwd, recompute, model)


def compute_width(plan: Plan) -> float:
    """Bytes per element of the weights a GPU gathers and the gradients it reduces: fp32 or 16-bit."""
    return 4.0 if plan.precision == "fp32" else 2.0


def default_links(gpus: int, gpu: GpuSpec) -> Links:
    """One node of up to ``GPUS_PER_NODE`` GPUs on the card's own link; beyond, nodes of 8 over the fabric."""
    if gpus <= GPUS_PER_NODE:
        return links_for(gpu, gpus)
    nodes = -(-gpus // GPUS_PER_NODE)
    return links_for(gpu, GPUS_PER_NODE, nodes, inter_node_gbit_per_s=INTER_NODE_GB_PER_S * 8 * GPUS_PER_NODE)


def data_parallel_communication(
    plan: Plan,
    arch: Architecture,
    recipe: Recipe,
    states: ModelStates,
    gpu: GpuSpec,
    fpt: FlopsPerToken,
    compute_s: float,
    links: Links | None,
) -> StepCommunication:
    """Gradient and weight traffic of the plan's layout per micro-batch (services.estimator.communication)."""
    if not plan.is_training or plan.gpus <= 1:
        return step_communication(
            "none",
            Links(1, 1, "NVLink", 0.0),
            grad_bytes=0.0,
            param_bytes_16bit=0.0,
            gathered_weight_bytes=0.0,
            layers=1,
            forward_s=0.0,
            backward_s=0.0,
            accumulation=1,
        )
    links = links if links is not None else default_links(plan.gpus, gpu)
    grad_width = compute_width(plan)  # gradients are reduced in the compute dtype
    # A quantized base is gathered as stored: its codes and quantisation constants per weight.
    weight_width = quantized_bytes_per_weight(plan, recipe) if plan.quantized else grad_width
    forward_share = fpt.forward / fpt.hardware if fpt.hardware else 0.5
    return step_communication(
        plan.sharding,
        links,
        grad_bytes=states.trainable_params * grad_width,
        param_bytes_16bit=states.trainable_params * grad_width,
        gathered_weight_bytes=total_parameters(arch) * weight_width,
        layers=arch.num_layers,
        forward_s=compute_s * forward_share,
        backward_s=compute_s * (1.0 - forward_share),
        accumulation=plan.gradient_accumulation_steps or 1,
    )


def estimate_throughput(
    plan: Plan,
    arch: Architecture,
    recipe: Recipe,
    states: ModelStates,
    gpu: GpuSpec,
    utilisation: float | None = None,
    utilisation_source: str | None = None,
    peak_device_bytes: float | None = None,
    links: Links | None = None,
    flops: FlopsPerToken | None = None,
) -> Throughput:
    """Tokens/s of the plan on ``gpu`` (x plan.gpus), with the time split by what it is spent on.

    ``peak_device_bytes`` (the memory estimate) lets paged optimizer states that do not fit beside it
    cost their round trip over PCIe every optimizer step. ``links`` says how the GPUs are connected
    (default: one node of up to 8 on the card's own link, nodes of 8 over the assumed fabric beyond).
    ``flops``: the plan's FLOPs per token when the caller has them already (they do not depend on the GPU).
    """
    peak = gpu.dense_tflops(plan.precision) * 1e12
    util = utilisation_or_prior(gpu, utilisation)
    source = utilisation_source or f"prior for {gpu.gpu_class} GPUs"
    fpt = flops if flops is not None else flops_per_token(plan, arch, recipe)
    tokens = micro_batch_tokens(plan, recipe)
    bandwidth = gpu.hbm_bandwidth_gb_per_s * 1e9

    # Block linears at their real GEMM shapes (roofline per GEMM), the rest (attention, head, adapters'
    # own FLOPs) at the large-GEMM rate.
    linear_flops, linear_s = block_linear_gemms(plan, arch, recipe, peak * util, bandwidth, tokens)
    compute = max(0.0, fpt.hardware * tokens - linear_flops) / (peak * util) + linear_s
    # Unfused LoRA adapters: memory-bound passes over the activations beside the GEMMs.
    lora_bytes, lora_kernels = lora_unfused_work(plan, arch, recipe)
    compute += lora_bytes * tokens / bandwidth
    # Norms, rotary, activations, residual adds and the loss: memory-bound kernels of their own in eager mode.
    compute += step_elementwise_bytes(plan, arch, recipe) * tokens / bandwidth
    # Weight reads: every pass (forward, backward, replay) streams the weights at least once.
    passes = 1 if not plan.is_training else (2 + (1 if plan.gradient_checkpointing else 0))
    weight_read = passes * (states.weights + states.adapters) / bandwidth
    compute = max(compute, weight_read)
    compute = max(compute, dispatch_seconds(plan, arch, recipe, lora_kernels))

    # QLoRA dequantises every 4-bit weight to 16-bit before its matmuls (BNB_DEQUANT_BYTES or, for a GPTQ
    # checkpoint, GPTQ_DEQUANT_BYTES per weight): bandwidth-bound work on top of the matmuls.
    dequant = 0.0
    if plan.quantized is not None:
        # Under FSDP/ZeRO-3 each GPU gathers and dequantises every layer itself: no division by GPUs.
        q = quantized_params(arch, recipe)
        if recipe.quant_backend == "auto-gptq":
            dequant = gptq_dequant_passes(plan, recipe) * q * GPTQ_DEQUANT_BYTES / bandwidth
        else:
            dequant = passes * q * BNB_DEQUANT_BYTES / bandwidth

    accumulation = plan.gradient_accumulation_steps or 1
    comm = data_parallel_communication(plan, arch, recipe, states, gpu, fpt, compute, links)
    exposed_comm = comm.exposed_seconds + comm.straggler_seconds
    if plan.is_training and plan.cpu_offload and plan.sharding in ("zero3", "fsdp"):
        weight_width = quantized_bytes_per_weight(plan, recipe) if plan.quantized else compute_width(plan)
        shard = total_parameters(arch) * weight_width / plan.gpus
        exposed_comm += offload_streaming_seconds(shard, gpu.pcie_gb_per_s * 1e9, arch.num_layers, compute)

    optimizer = 0.0
    if plan.is_training:
        trainable_per_gpu = states.trainable_params / (
            plan.gpus if plan.sharding in ("zero1", "zero2", "zero3", "fsdp") else 1
        )
        if plan.cpu_offload:
            optimizer = trainable_per_gpu / CPU_ADAM_PARAMS_PER_S + 4.0 * trainable_per_gpu / (gpu.pcie_gb_per_s * 1e9)
        else:
            # AdamW reads param, grad, m, v and writes param, m, v: ~16 B/param in 16-bit, 28 in fp32.
            touched = 7 * (4 if recipe.weight_bytes == 4 or recipe.master_weights else 2)
            optimizer = trainable_per_gpu * touched / bandwidth
        if states.optimizer_states_paged and peak_device_bytes is not None:
            # bitsandbytes paged states live in unified memory: what does not fit in the GPU's free
            # memory is paged in for the optimizer step and out again (NVIDIA unified memory paging).
            free = max(0.0, gpu.memory_gib * 2**30 - peak_device_bytes)
            spilled = max(0.0, states.optimizer_states_paged - free)
            optimizer += 2 * spilled / (gpu.pcie_gb_per_s * 1e9)
        optimizer /= accumulation

    step = compute + dequant + exposed_comm + optimizer
    per_gpu = tokens / step
    total = per_gpu * plan.gpus
    mfu = fpt.model_flops * per_gpu / peak
    return Throughput(
        tokens_per_s=total,
        tokens_per_s_per_gpu=per_gpu,
        data_tokens_per_s=total * data_tokens_per_processed_token(plan, recipe),
        step_seconds=step,
        mfu=mfu,
        utilisation_assumed=util,
        flops_per_token=fpt,
        seconds={
            "compute": compute,
            "dequantization": dequant,
            "communication": exposed_comm,
            "optimizer": optimizer,
        },
        utilisation_source=source,
    )


@dataclass(frozen=True)
class RunCost:
    tokens: float
    hours: float
    gpu_hours: float
    on_demand_usd: float | None
    spot_usd: float | None


def run_cost(
    total_tokens: float,
    tokens_per_s: float,
    gpus: int,
    on_demand_usd_per_gpu_hour: float | None,
    spot_usd_per_gpu_hour: float | None,
) -> RunCost:
    """Wall-clock hours for the data set (tokens x epochs) and its cost at per-GPU hourly prices."""
    hours = total_tokens / tokens_per_s / 3600.0
    gpu_hours = hours * gpus
    return RunCost(
        tokens=total_tokens,
        hours=hours,
        gpu_hours=gpu_hours,
        on_demand_usd=None if on_demand_usd_per_gpu_hour is None else gpu_hours * on_demand_usd_per_gpu_hour,
        spot_usd=None if spot_usd_per_gpu_hour is None else gpu_hours * spot_usd_per_gpu_hour,
    )
