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
    """Bytes FSDP1 holds in the caching allocator's pools of its own CUDA streams.

    FSDP1 all-gathers on an unshard stream and reduce-scatters on a post-backward stream and hands the
    buffers to the compute stream with Tensor.record_stream, so their blocks return only to those
    streams' pools and the compute stream cannot reuse them (the recordStream behaviour FSDP2 removed:
    torchtitan docs/fsdp.md reports 7% lower peak memory for FSDP2 on Llama-7B). The unshard pool
    holds the unit in use plus the in-flight all-gathers the rate limiter allows, and the root unit;
    the post-backward pool one unit's unsharded gradient and its reduced shard.
    """
    if not recipe.fsdp1 or plan.sharding != "fsdp" or plan.gpus == 1:
        return 0.0
    unit = float(arch.largest_block_params * recipe.compute_bytes)
    if plan.quantized is not None:
        unit = sharded_working_bytes(plan, arch, recipe)[0] / 2  # 4-bit blocks gather as stored
    root = float((arch.embedding_params + arch.lm_head_params) * recipe.compute_bytes)
    unshard = (1 + FSDP1_INFLIGHT_ALL_GATHERS) * unit + root
    grad_unit = 0.0
    if plan.is_training and plan.method == "full":
        grad_unit = arch.largest_block_params * (4 if recipe.weight_bytes == 4 else recipe.compute_bytes)
    return unshard + grad_unit * (1 + 1 / plan.gpus)
