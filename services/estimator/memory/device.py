"""Device memory outside the allocator's tensors: the CUDA context, NCCL buffers, FSDP1 stream pools."""

from __future__ import annotations

from services.estimator.architecture import Architecture
from services.estimator.memory.states import sharded_working_bytes
from services.estimator.plan import Plan
from services.estimator.recipe import Recipe

# CUDA context of a PyTorch process as nvidia-smi shows it. pytorch/pytorch PR #86509 (which made
# CUDA_MODULE_LOADING=LAZY the default in PyTorch 1.13) measured 287,047,680 bytes after CUDA init with
# lazy loading and 666,632,192 bytes with every kernel module loaded eagerly. A training step loads
# the modules of the kernels it runs (PyTorch's, cuBLAS/cuBLASLt, attention), so the context lies
# between the two; we take the eager figure, the upper bound (0.62 GiB), as fits are checked on it.
CUDA_CONTEXT_BYTES = 666_632_192
# NCCL's buffers per connection, one per protocol (NVIDIA/nccl src/init.cc): Simple = NCCL_BUFFSIZE,
# default 1 << 22 (4 MiB); LL128 = 120 elements x 640 threads x 8 steps x 8 B; LL = 8 lines x 512
# threads x 8 steps x 16 B.
NCCL_SIMPLE_BUFFER_BYTES = 1 << 22
NCCL_LL128_BUFFER_BYTES = 120 * 640 * 8 * 8
NCCL_LL_BUFFER_BYTES = 8 * 512 * 8 * 16
# MAXCHANNELS in NCCL's src/include/device.h; NCCL opens up to this many channels on NVLink systems
# (fewer over PCIe), so this bounds the buffers from above.
NCCL_MAX_CHANNELS = 32
# FSDP1's rate limiter lets at most two all-gathers run ahead of the compute stream
# (torch/distributed/fsdp/_limiter_utils.py, _FreeEventQueue, limit_all_gathers=True, the accelerate
# default).
FSDP1_INFLIGHT_ALL_GATHERS = 2


def nccl_buffer_bytes(plan: Plan) -> float:
    """NCCL's device buffers per rank: channels x connection sets x (Simple + LL128 + LL buffers).

    Ring all-gather and reduce-scatter (FSDP, ZeRO) need one connection set per channel; all-reduce
    (DDP) also builds the tree, a second set. Since NCCL 2.22 connections are made when an algorithm
    is first used (NCCL_RUNTIME_CONNECT=1), so an unused algorithm costs nothing. One GPU: no NCCL.
    """
    if plan.gpus == 1:
        return 0.0
    per_connection = NCCL_SIMPLE_BUFFER_BYTES + NCCL_LL128_BUFFER_BYTES + NCCL_LL_BUFFER_BYTES
    sets = 2 if plan.sharding == "none" else 1
    return float(NCCL_MAX_CHANNELS * sets * per_connection)


def fsdp1_stream_pool_bytes(plan: Plan, arch: Architecture, recipe: Recipe) -> float:
    """Bytes FSDP1 holds in the caching allocator's pool of its unshard stream.

    FSDP1 allocates a unit's unsharded flat parameter inside ``with unshard_stream``
    (torch/distributed/fsdp/_runtime_utils.py _unshard -> FlatParamHandle._alloc_padded_unsharded_flat_param)
    and frees it on the compute stream after record_stream (_free_unsharded_flat_param), so its block
    returns to the unshard stream's pool, which the compute stream cannot use (the recordStream behaviour
    FSDP2 removed: torchtitan docs/fsdp.md reports 7% lower peak memory for FSDP2 on Llama-7B). The pool
    holds the unit in use, the one BACKWARD_PRE prefetches and the one whose free event the rate limiter
    has not yet waited on, and the root unit (benchmarks/mechanisms/allocator.py record_fsdp1_steps:
    root + 3 units). The post-backward stream makes one unit-sized tensor only to cast a gradient to
    another reduce dtype (_post_backward_hook: flat_param.grad.to(handle._reduce_dtype)), which
    accelerate's MixedPrecision (reduce_dtype = param_dtype) and pure 16-bit or fp32 runs never do; its
    reduce-scatter outputs are the sharded gradients themselves.
    """
    if not recipe.fsdp1 or plan.sharding != "fsdp" or plan.gpus == 1:
        return 0.0
    unit = float(arch.largest_block_params * recipe.compute_bytes)
    if plan.quantized is not None:
        unit = sharded_working_bytes(plan, arch, recipe)[0] / 2  # 4-bit blocks gather as stored
    root = float((arch.embedding_params + arch.lm_head_params) * recipe.compute_bytes)
    return (1 + FSDP1_INFLIGHT_ALL_GATHERS) * unit + root
