"""Training throughput: FLOPs per token, achievable utilisation, communication, time and cost.

``rates`` holds the utilisation priors and the GEMM roofline, ``kernels`` what a step costs beside its
large GEMMs, ``step`` the step time, communication and run cost that put them together.
"""

from services.estimator.architecture.parse import canonical_architecture
from services.estimator.recipe import canonical_recipe
from services.estimator.throughput.kernels import (
    BACKWARD_KERNELS_PER_FORWARD,
    BLOCK_CONTAINER_MODULES,
    BNB_DEQUANT_BYTES,
    CUDA_LAUNCH_SECONDS,
    DISPATCH_SECONDS_PER_KERNEL,
    GPTQ_DEQUANT_BYTES,
    GPTQ_DEQUANT_KERNELS_PER_LINEAR,
    HOST_SECONDS_PER_OP,
    KERNELS_PER_BLOCK_FORWARD,
    PEFT_MODULES_PER_ADAPTED_LINEAR,
    ZERO2_HOST_OPS_PER_TRAINED_TENSOR,
    ZERO3_HOST_OPS_PER_MODULE_BACKWARD,
    ZERO3_HOST_OPS_PER_MODULE_FORWARD,
    ZERO3_HOST_OPS_PER_TRAINED_TENSOR,
    dispatch_seconds,
    forward_replay_share,
    gptq_dequant_passes,
    linear_gemm_seconds,
    linear_gemm_work,
    lora_unfused_bytes_per_token,
    lora_unfused_kernels_per_linear,
    lora_unfused_work,
    micro_batch_tokens,
    step_elementwise_bytes,
    zero_hook_seconds,
)
from services.estimator.throughput.kernels import (
    clear_work_caches as _clear_kernel_caches,
)
from services.estimator.throughput.rates import (
    ADA_MATMUL_SHARES,
    END_TO_END_OVER_MATMUL,
    GEMM_RATE,
    MATMUL_SHARE,
    MPT_7B,
    PUBLISHED_CARDS,
    PUBLISHED_MFU,
    TYPICAL_MATMUL_SHARE,
    UNMEASURED_CLASSES,
    UTILISATION_PRIOR,
    UTILISATION_PRIORS,
    gemm_seconds,
    utilisation_or_prior,
)
from services.estimator.throughput.step import (
    CPU_ADAM_PARAMS_PER_S,
    GPUS_PER_NODE,
    INTER_NODE_GB_PER_S,
    CardStep,
    FlopsPerToken,
    RunCost,
    StepWork,
    Throughput,
    card_step,
    clear_step_caches,
    compute_width,
    data_parallel_communication,
    default_links,
    estimate_throughput,
    flops_per_token,
    run_cost,
    step_work,
)


def clear_work_caches() -> None:
    """Forget every memo of GPU-independent work and the interned architectures and recipes (tests that count
    the work of one estimate start from none)."""
    _clear_kernel_caches()
    clear_step_caches()
    canonical_architecture.clear()
    canonical_recipe.clear()


__all__ = [
    "ADA_MATMUL_SHARES",
    "BACKWARD_KERNELS_PER_FORWARD",
    "BLOCK_CONTAINER_MODULES",
    "BNB_DEQUANT_BYTES",
    "CPU_ADAM_PARAMS_PER_S",
    "CUDA_LAUNCH_SECONDS",
    "DISPATCH_SECONDS_PER_KERNEL",
    "END_TO_END_OVER_MATMUL",
    "GEMM_RATE",
    "GPTQ_DEQUANT_BYTES",
    "GPTQ_DEQUANT_KERNELS_PER_LINEAR",
    "GPUS_PER_NODE",
    "HOST_SECONDS_PER_OP",
    "INTER_NODE_GB_PER_S",
    "KERNELS_PER_BLOCK_FORWARD",
    "MATMUL_SHARE",
    "MPT_7B",
    "PEFT_MODULES_PER_ADAPTED_LINEAR",
    "PUBLISHED_CARDS",
    "PUBLISHED_MFU",
    "TYPICAL_MATMUL_SHARE",
    "UNMEASURED_CLASSES",
    "UTILISATION_PRIOR",
    "UTILISATION_PRIORS",
    "ZERO2_HOST_OPS_PER_TRAINED_TENSOR",
    "ZERO3_HOST_OPS_PER_MODULE_BACKWARD",
    "ZERO3_HOST_OPS_PER_MODULE_FORWARD",
    "ZERO3_HOST_OPS_PER_TRAINED_TENSOR",
    "CardStep",
    "FlopsPerToken",
    "RunCost",
    "StepWork",
    "Throughput",
    "card_step",
    "clear_work_caches",
    "compute_width",
    "data_parallel_communication",
    "default_links",
    "dispatch_seconds",
    "estimate_throughput",
    "flops_per_token",
    "forward_replay_share",
    "gemm_seconds",
    "gptq_dequant_passes",
    "linear_gemm_seconds",
    "linear_gemm_work",
    "lora_unfused_bytes_per_token",
    "lora_unfused_kernels_per_linear",
    "lora_unfused_work",
    "micro_batch_tokens",
    "run_cost",
    "step_elementwise_bytes",
    "step_work",
    "utilisation_or_prior",
    "zero_hook_seconds",
]
