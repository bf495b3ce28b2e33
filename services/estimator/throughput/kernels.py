"""What a step costs beside its large GEMMs: kernel dispatch, dequantisation, ZeRO hooks, unfused LoRA
and element-wise passes, and the block linears as GEMM shapes.
"""

from __future__ import annotations

from functools import lru_cache

from services.estimator.architecture import Architecture
from services.estimator.elementwise import elementwise_bytes_per_token
from services.estimator.memory.activations import clear_activation_cache
from services.estimator.memory.states import clear_adapter_caches
from services.estimator.padding import batch_row_tokens
from services.estimator.plan import Plan
from services.estimator.recipe import Recipe

# In eager mode a GPU step cannot be shorter than the host work that issues its kernels, which short
# micro-batches expose. What each constant below is measured by (benchmarks/mechanisms/dispatch.py,
# zero_hooks.py) or cited from, with the figures, is in services/estimator/constants.toml (docs/constants.md).
# Eager PyTorch kernels per transformer block forward, and the backward's multiple of it.
KERNELS_PER_BLOCK_FORWARD = 43
BACKWARD_KERNELS_PER_FORWARD = 1.7
# Host-side cost per kernel in eager mode (a GPU step cannot be shorter than its launches): the framework's
# host time per op plus the CUDA launch.
HOST_SECONDS_PER_OP = 8.5e-6
CUDA_LAUNCH_SECONDS = 5e-6
DISPATCH_SECONDS_PER_KERNEL = HOST_SECONDS_PER_OP + CUDA_LAUNCH_SECONDS
# DeepSpeed ZeRO's host hooks, in eager host ops (HOST_SECONDS_PER_OP each), every micro-batch on any number of
# GPUs: ZeRO-3 gathers and frees each module's parameters around every call of it (the forward replayed under
# checkpointing included); ZeRO-2/3 move each trained tensor's gradient into the reduce bucket in a backward
# hook; ZeRO-1 adds under one op per tensor and is left out.
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

# GPU-independent work of the last plan shapes, memoised by value (the architecture hashes itself once; the
# other keys are the plain values the work reads): the planner prices one plan on every card.
WORK_CACHE_SIZE = 256


def clear_work_caches() -> None:
    """Forget the memoised work (tests that count the work of one estimate start from none)."""
    for memo in (_gemm_work_of, _lora_work_of, _hooked):
        memo.cache_clear()
    clear_adapter_caches()
    clear_activation_cache()


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
    gptq_passes = gptq_dequant_passes(plan, recipe)
    gptq = gptq_passes * _gptq_dequant_kernel_seconds(arch) if gptq_passes else 0.0
    return kernels * passes + gptq + zero_hook_seconds(plan, arch, recipe)


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
    full = plan.method == "full"
    modules, tensors = _hooked(arch, () if full else recipe.lora_targets, full)
    ops = float(tensors) * (
        ZERO3_HOST_OPS_PER_TRAINED_TENSOR if plan.sharding == "zero3" else ZERO2_HOST_OPS_PER_TRAINED_TENSOR
    )
    if plan.sharding == "zero3":
        ops += modules * (ZERO3_HOST_OPS_PER_MODULE_FORWARD * (1.0 + replay) + ZERO3_HOST_OPS_PER_MODULE_BACKWARD)
    return ops * HOST_SECONDS_PER_OP


@lru_cache(maxsize=WORK_CACHE_SIZE)
def _hooked(arch: Architecture, targets: tuple[str, ...], full: bool) -> tuple[int, int]:
    """(modules called, trained tensors) over the blocks: a linear is one module and one weight (+ a bias), a
    mixture-of-experts linear one module holding every expert's weights (transformers' grouped experts), a
    norm one module of one tensor (two for LayerNorm); a LoRA adapter adds PEFT's modules and its A and B."""
    norm_tensors = 2 if arch.norm == "layer" else (0 if arch.norm == "nonparam" else 1)
    modules = tensors = 0
    for b in arch.blocks:
        adapted = 0 if full else sum(1 for lin in b.linears if _adapted_roles(lin.roles, targets))
        modules += b.count * (
            BLOCK_CONTAINER_MODULES + len(b.linears) + b.norm_count + PEFT_MODULES_PER_ADAPTED_LINEAR * adapted
        )
        if full:
            tensors += b.count * (sum(1 + lin.bias for lin in b.linears) + b.norm_count * norm_tensors)
        else:
            tensors += b.count * 2 * adapted
    return modules, tensors


# (total FLOPs, least FLOPs per byte, (FLOPs, bytes) per GEMM) of a micro-batch's block linears.
GemmWork = tuple[float, float, tuple[tuple[float, float], ...]]


def linear_gemm_work(plan: Plan, arch: Architecture, recipe: Recipe, tokens: float | None = None) -> GemmWork:
    """Every block linear's GEMMs in one micro-batch, as ``linear_gemm_seconds`` prices them on a card (the same on
    every card).

    The GEMMs of a linear (Narayanan et al. 2021, arXiv 2104.04473, section 5.1: forward, the
    input-gradient and the weight-gradient matmul, each 2mkn): forward at m = tokens, the input
    gradient (m x n @ n x k), the weight gradient (k x m @ m x n) only for trained weights, and the
    forward again under activation checkpointing (half of it for selective). Expert linears of a
    mixture-of-experts layer each see tokens x experts_per_token / experts rows. Same accounting as
    ``flops_per_token``, so for large m the seconds equal FLOPs / the large-GEMM rate. ``tokens``: the
    micro-batch's tokens when the caller has them (``micro_batch_tokens``).
    """
    replay = forward_replay_share(plan, recipe)
    tokens = micro_batch_tokens(plan, recipe) if tokens is None else tokens
    return _gemm_work_of(arch, tokens, plan.is_training, plan.method == "full", replay, recipe.compute_bytes)


def linear_gemm_seconds(work: GemmWork, flops_per_s: float, bytes_per_s: float) -> float:
    """Roofline seconds of the GEMMs of ``linear_gemm_work`` on a card of those rates."""
    total, least_intensity, gemms = work
    if flops_per_s / bytes_per_s <= least_intensity:  # every GEMM is math-bound on this card
        return total / flops_per_s
    return sum(max(f / flops_per_s, nbytes / bytes_per_s) for f, nbytes in gemms)


@lru_cache(maxsize=WORK_CACHE_SIZE)
def _gemm_work_of(arch: Architecture, tokens: float, training: bool, full: bool, replay: float, width: int) -> GemmWork:
    """``_gemm_work`` of the block linears of one micro-batch shape (memoised: the planner asks per card)."""
    return _gemm_work(_linear_gemm_shapes(arch, tokens, training, full, replay), width)


def _gemm_work(shapes: tuple[tuple[float, float, float, float], ...], width: int) -> GemmWork:
    """(total FLOPs, least FLOPs per byte, (FLOPs, bytes) per GEMM) of the shapes: ``gemm_seconds``'s terms."""
    gemms = tuple((t * 2.0 * m * k * n, t * (m * k + k * n + m * n) * width) for m, k, n, t in shapes)
    total = sum(f for f, _ in gemms)
    least = min((f / nbytes for f, nbytes in gemms if nbytes > 0), default=float("inf"))
    return total, least, gemms


def _linear_gemm_shapes(
    arch: Architecture, tokens: float, training: bool, weight_grads: bool, replay: float
) -> tuple[tuple[float, float, float, float], ...]:
    """(m, k, n, how many) of each block-linear GEMM of a micro-batch."""
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
    return _lora_work_of(
        arch, recipe.lora_targets, recipe.compute_bytes, recipe.adapter_input_bytes, recipe.lora_dropout > 0.0, replay
    )


def step_elementwise_bytes(plan: Plan, arch: Architecture, recipe: Recipe) -> float:
    """Bytes per token of the step's element-wise kernels (services.estimator.elementwise)."""
    return elementwise_bytes_per_token(plan, arch, recipe, forward_replay_share(plan, recipe))


def _adapted_roles(roles: tuple[str, ...], targets: tuple[str, ...]) -> int:
    """How many of a linear's roles carry a LoRA adapter (``lora_roles_of`` on plain values)."""
    return sum(1 for role in roles if role in targets)


@lru_cache(maxsize=WORK_CACHE_SIZE)
def _lora_work_of(
    arch: Architecture,
    targets: tuple[str, ...],
    compute_bytes: int,
    adapter_input_bytes: int,
    dropout: bool,
    replay: float,
) -> tuple[float, int]:
    """``lora_unfused_work`` for a trained LoRA plan (memoised: the planner asks once per card)."""
    total = 0.0
    kernels = 0
    layers = max(1, arch.num_layers)
    for b in arch.blocks:
        for lin in b.linears:
            roles = _adapted_roles(lin.roles, targets)
            if not roles:
                continue
            d_out = lin.out_features * roles // len(lin.roles)
            fwd, bwd = lora_unfused_bytes_per_token(lin.in_features, d_out, compute_bytes, adapter_input_bytes, dropout)
            # Expert copies each see their share of the tokens: per token the traffic is experts_per_token x.
            share = b.experts_per_token if lin.copies > 1 else 1
            total += b.count * share * (fwd * (1.0 + replay) + bwd)
            kernels += (
                b.count * lin.copies * lora_unfused_kernels_per_linear(adapter_input_bytes, compute_bytes, dropout)
            )
    return total, -(-kernels // layers)
