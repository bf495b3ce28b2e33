"""Training throughput: FLOPs per token, step time per GPU, communication and cost.

Step time per GPU = compute (hardware FLOPs / (peak x utilisation), the block linears on a per-GEMM
roofline at the real tokens per micro-batch, plus the memory passes of unfused LoRA adapters; at least
the weight-read time and the kernel-dispatch time) + QLoRA dequantisation + the exposed part of
communication + the optimizer step, amortised over the micro-batches of an optimizer step.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from services.catalog.gpus import GpuSpec
from services.estimator.architecture import Architecture, parameter_counts
from services.estimator.communication import (
    DATA_PARALLEL_SYNC_OVERHEAD,
    Links,
    StepCommunication,
    communication_seconds,
    links_for,
    offload_streaming_seconds,
    step_communication,
    total_parameters,
    zero3_gathers_per_pass,
)
from services.estimator.memo import Memo, quick_init
from services.estimator.memory import (
    ModelStates,
    adapter_params,
    quantized_bytes_per_weight,
    quantized_params,
)
from services.estimator.padding import data_tokens_per_processed_token
from services.estimator.plan import Plan
from services.estimator.recipe import Recipe
from services.estimator.throughput.kernels import (
    BNB_DEQUANT_BYTES,
    GPTQ_DEQUANT_BYTES,
    WORK_CACHE_SIZE,
    GemmWork,
    dispatch_seconds,
    forward_replay_share,
    gptq_dequant_passes,
    linear_gemm_seconds,
    linear_gemm_work,
    lora_unfused_work,
    micro_batch_tokens,
    step_elementwise_bytes,
)
from services.estimator.throughput.rates import utilisation_or_prior

GPUS_PER_NODE = 8
INTER_NODE_GB_PER_S = 25.0  # 200 Gb/s per GPU (InfiniBand HDR-class fabric)
# DeepSpeed CPU-Adam update rate, ~1e9 parameters/s per node: an ASSUMPTION of the order of magnitude. The
# ZeRO-Offload paper (arXiv 2101.06840) gives CPU-Adam's speed-up over PyTorch's CPU Adam (6-7x), not a rate.
CPU_ADAM_PARAMS_PER_S = 1.0e9


@dataclass(frozen=True)
class FlopsPerToken:
    forward: float
    backward: float
    recompute: float
    model_flops: float  # 6N + 12 L h s convention (MFU numerator), per token

    @property
    def hardware(self) -> float:
        return self.forward + self.backward + self.recompute


@quick_init
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
    # The key holds every plan field the count reads.
    key = (arch, recipe, plan.seq_len, plan.is_training, plan.method, plan.gradient_checkpointing)
    return _FLOPS.get(key, lambda: _flops_per_token(plan, arch, recipe))


def _flops_per_token(plan: Plan, arch: Architecture, recipe: Recipe) -> FlopsPerToken:
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


@quick_init
@dataclass(frozen=True)
class StepWork:
    """The parts of a step's cost that no GPU changes, worked out once per plan and priced on every card: the
    work of one micro-batch as FLOPs, bytes and seconds, which ``card_step`` divides by the card's rates."""

    flops: FlopsPerToken
    tokens: float  # per micro-batch, pad tokens included
    gemms: GemmWork  # the block linears' GEMMs (linear_gemm_work)
    other_flops: float  # the hardware FLOPs beside the block linears: attention, head, adapters' own
    lora_bytes: float  # unfused LoRA adapters' memory passes over the activations
    elementwise_bytes: float  # norms, rotary, activations, residual adds and the loss
    weight_read_bytes: float  # every pass (forward, backward, replay) streams the weights at least once
    dispatch_s: float
    dequant_bytes: float  # a quantized base dequantised before its matmuls
    streamed_shard_bytes: float | None  # an offloaded parameter shard streamed in per micro-batch (FSDP/ZeRO-3)
    optimizer_params: float  # trainable parameters each GPU's optimizer step updates
    optimizer_bytes: float  # what that step reads and writes on the GPU (0 with CPU offload)
    data_tokens_per_token: float
    traffic: _Traffic  # what the layout's communication moves (step_communication's arguments but the links)


def step_work(
    plan: Plan, arch: Architecture, recipe: Recipe, states: ModelStates, flops: FlopsPerToken | None = None
) -> StepWork:
    """``StepWork`` of the plan with its model ``states`` (``flops``: its FLOPs per token when the caller has them)."""
    lora_bytes, lora_kernels = lora_unfused_work(plan, arch, recipe)
    flops = flops if flops is not None else flops_per_token(plan, arch, recipe)
    tokens = micro_batch_tokens(plan, recipe)
    gemms = linear_gemm_work(plan, arch, recipe, tokens)
    passes = 1 if not plan.is_training else (2 + (1 if plan.gradient_checkpointing else 0))

    # QLoRA dequantises every 4-bit weight to 16-bit before its matmuls (BNB_DEQUANT_BYTES or, for a GPTQ
    # checkpoint, GPTQ_DEQUANT_BYTES per weight): bandwidth-bound work on top of the matmuls. Under FSDP/ZeRO-3
    # each GPU gathers and dequantises every layer itself: no division by GPUs.
    dequant = 0.0
    if plan.quantized is not None:
        q = quantized_params(arch, recipe)
        if recipe.quant_backend == "auto-gptq":
            dequant = gptq_dequant_passes(plan, recipe) * q * GPTQ_DEQUANT_BYTES
        else:
            dequant = passes * q * BNB_DEQUANT_BYTES

    shard = None
    if plan.is_training and plan.cpu_offload and plan.sharding in ("zero3", "fsdp"):
        weight_width = quantized_bytes_per_weight(plan, recipe) if plan.quantized else compute_width(plan)
        shard = total_parameters(arch) * weight_width / plan.gpus

    trainable = 0.0
    optimizer_bytes = 0.0
    if plan.is_training:
        trainable = states.trainable_params / (plan.gpus if plan.sharding in ("zero1", "zero2", "zero3", "fsdp") else 1)
        if not plan.cpu_offload:
            # AdamW reads param, grad, m, v and writes param, m, v: ~16 B/param in 16-bit, 28 in fp32.
            touched = 7 * (4 if recipe.weight_bytes == 4 or recipe.master_weights else 2)
            optimizer_bytes = trainable * touched

    return StepWork(
        flops=flops,
        tokens=tokens,
        gemms=gemms,
        other_flops=max(0.0, flops.hardware * tokens - gemms[0]),
        lora_bytes=lora_bytes * tokens,
        elementwise_bytes=_elementwise(plan, arch, recipe) * tokens,
        weight_read_bytes=passes * (states.weights + states.adapters),
        dispatch_s=dispatch_seconds(plan, arch, recipe, lora_kernels),
        dequant_bytes=dequant,
        streamed_shard_bytes=shard,
        optimizer_params=trainable,
        optimizer_bytes=optimizer_bytes,
        data_tokens_per_token=data_tokens_per_processed_token(plan, recipe),
        traffic=_traffic(plan, arch, recipe, states, flops),
    )


# Memos by value of the plan-shape work every card shares (the planner prices one plan on thousands of setups).
_FLOPS: Memo[FlopsPerToken] = Memo(WORK_CACHE_SIZE)
_ELEMENTWISE: Memo[float] = Memo(WORK_CACHE_SIZE)


def clear_step_caches() -> None:
    """Forget the memoised FLOPs and element-wise bytes."""
    _FLOPS.clear()
    _ELEMENTWISE.clear()


def _elementwise(plan: Plan, arch: Architecture, recipe: Recipe) -> float:
    """``step_elementwise_bytes``, memoised on the plan fields it reads."""
    key = (arch, recipe, plan.is_training, plan.method, plan.seq_len, plan.gradient_checkpointing)
    return _ELEMENTWISE.get(key, lambda: step_elementwise_bytes(plan, arch, recipe))


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
    return _traffic_over(_traffic(plan, arch, recipe, states, fpt), plan, gpu, links, compute_s)


@quick_init
@dataclass(frozen=True)
class _Traffic:
    """What a layout's communication moves per micro-batch and the share of the compute in the forward pass (the
    arguments of ``step_communication`` besides the links and the compute time: the same on every card)."""

    grad_bytes: float
    param_bytes_16bit: float
    gathered_weight_bytes: float
    layers: int
    forward_share: float
    accumulation: int
    gathers_per_pass: int | None


_NO_TRAFFIC = _Traffic(0.0, 0.0, 0.0, 1, 0.0, 1, None)
_ONE_GPU = Links(1, 1, "NVLink", 0.0)


def _traffic(plan: Plan, arch: Architecture, recipe: Recipe, states: ModelStates, fpt: FlopsPerToken) -> _Traffic:
    if not plan.is_training or plan.gpus <= 1:
        return _NO_TRAFFIC
    grad_width = compute_width(plan)  # gradients are reduced in the compute dtype
    # A quantized base is gathered as stored: its codes and quantisation constants per weight.
    weight_width = quantized_bytes_per_weight(plan, recipe) if plan.quantized else grad_width
    return _Traffic(
        grad_bytes=states.trainable_params * grad_width,
        param_bytes_16bit=states.trainable_params * grad_width,
        gathered_weight_bytes=total_parameters(arch) * weight_width,
        layers=arch.num_layers,
        forward_share=fpt.forward / fpt.hardware if fpt.hardware else 0.5,
        accumulation=plan.gradient_accumulation_steps or 1,
        gathers_per_pass=zero3_gathers_per_pass(arch) if plan.sharding == "zero3" else None,
    )


@cache
def _no_communication() -> StepCommunication:
    """A step that moves nothing between GPUs (one GPU, or no training): the same answer every time."""
    return step_communication(
        "none",
        _ONE_GPU,
        grad_bytes=0.0,
        param_bytes_16bit=0.0,
        gathered_weight_bytes=0.0,
        layers=1,
        forward_s=0.0,
        backward_s=0.0,
        accumulation=1,
    )


def _traffic_over(
    traffic: _Traffic, plan: Plan, gpu: GpuSpec, links: Links | None, compute_s: float
) -> StepCommunication:
    if traffic is _NO_TRAFFIC:
        return _no_communication()
    links = links if links is not None else default_links(plan.gpus, gpu)
    return StepCommunication(*_traffic_seconds(traffic, plan, links, compute_s), links.label())


def _traffic_seconds(
    traffic: _Traffic, plan: Plan, links: Links, compute_s: float
) -> tuple[float, float, float, float]:
    """``step_communication``'s numbers for the traffic over ``links`` (communication_seconds)."""
    return communication_seconds(
        plan.sharding,
        links,
        traffic.grad_bytes,
        traffic.param_bytes_16bit,
        traffic.gathered_weight_bytes,
        traffic.layers,
        compute_s * traffic.forward_share,  # forward_s
        compute_s * (1.0 - traffic.forward_share),  # backward_s
        traffic.accumulation,
        DATA_PARALLEL_SYNC_OVERHEAD,
        traffic.gathers_per_pass,
    )


@quick_init
@dataclass(frozen=True)
class CardStep:
    """The part of a step's time on one card that no link changes (everything but the gradient and weight
    traffic between GPUs), with what that traffic is worked out from: ``over_links`` finishes the step."""

    plan: Plan
    arch: Architecture
    recipe: Recipe
    states: ModelStates
    gpu: GpuSpec
    work: StepWork
    peak_flops_per_s: float
    utilisation: float
    utilisation_source: str
    compute_s: float
    dequant_s: float
    offload_streaming_s: float
    optimizer_s: float

    def _step_seconds(self, exposed_comm: float) -> float:
        return self.compute_s + self.dequant_s + exposed_comm + self.optimizer_s

    def data_tokens_per_s_ceiling(self) -> float:
        """``over_links(links).data_tokens_per_s`` with no time between the GPUs: at least as high on any links, as
        computed too (the exposed time it adds is never negative, and the same operations round monotonically)."""
        return self.work.tokens / self._step_seconds(0.0) * self.plan.gpus * self.work.data_tokens_per_token

    def over_links(self, links: Links | None = None) -> Throughput:
        """Tokens/s of the step with its GPUs connected by ``links`` (default: ``default_links``)."""
        plan, fpt, compute = self.plan, self.work.flops, self.compute_s
        traffic = self.work.traffic
        exposed_comm = 0.0  # no traffic: nothing between GPUs
        if traffic is not _NO_TRAFFIC:
            links = links if links is not None else default_links(plan.gpus, self.gpu)
            _, _, exposed, wait = _traffic_seconds(traffic, plan, links, compute)
            exposed_comm = exposed + wait
        if plan.cpu_offload and plan.is_training and plan.sharding in ("zero3", "fsdp"):
            exposed_comm += self.offload_streaming_s
        step = self._step_seconds(exposed_comm)
        tokens = self.work.tokens
        per_gpu = tokens / step
        total = per_gpu * plan.gpus
        mfu = fpt.model_flops * per_gpu / self.peak_flops_per_s
        seconds = {
            "compute": compute,
            "dequantization": self.dequant_s,
            "communication": exposed_comm,
            "optimizer": self.optimizer_s,
        }
        # In field order, positionally: a planner builds one per setup and links it prices.
        return Throughput(
            total,  # tokens_per_s
            per_gpu,  # tokens_per_s_per_gpu
            total * self.work.data_tokens_per_token,  # data_tokens_per_s
            step,  # step_seconds
            mfu,
            self.utilisation,  # utilisation_assumed
            fpt,  # flops_per_token
            seconds,
            self.utilisation_source,
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
    work: StepWork | None = None,
) -> Throughput:
    """Tokens/s of the plan on ``gpu`` (x plan.gpus), with the time split by what it is spent on.

    ``peak_device_bytes`` (the memory estimate) lets paged optimizer states that do not fit beside it
    cost their round trip over PCIe every optimizer step. ``links`` says how the GPUs are connected
    (default: one node of up to 8 on the card's own link, nodes of 8 over the assumed fabric beyond).
    ``flops``: the plan's FLOPs per token when the caller has them already (they do not depend on the GPU);
    ``work``: its whole ``step_work``, for a caller that prices one plan on many cards.
    """
    step = card_step(plan, arch, recipe, states, gpu, utilisation, utilisation_source, peak_device_bytes, flops, work)
    return step.over_links(links)


def card_step(
    plan: Plan,
    arch: Architecture,
    recipe: Recipe,
    states: ModelStates,
    gpu: GpuSpec,
    utilisation: float | None = None,
    utilisation_source: str | None = None,
    peak_device_bytes: float | None = None,
    flops: FlopsPerToken | None = None,
    work: StepWork | None = None,
) -> CardStep:
    """The step of ``estimate_throughput`` on ``gpu`` before its links: a caller that prices one setup over
    several links (the planner: an offer's intra-node link kinds and networks) works it out once."""
    peak = gpu.dense_tflops(plan.precision) * 1e12
    util = utilisation_or_prior(gpu, utilisation)
    source = utilisation_source or f"prior for {gpu.gpu_class} GPUs"
    work = work if work is not None else step_work(plan, arch, recipe, states, flops)
    bandwidth = gpu.hbm_bandwidth_gb_per_s * 1e9
    rate = peak * util

    # Block linears at their real GEMM shapes (roofline per GEMM), the rest at the large-GEMM rate; then the
    # memory-bound passes beside them (unfused LoRA adapters, element-wise kernels in eager mode), at least the
    # weight reads and the kernel dispatch.
    compute = work.other_flops / rate + linear_gemm_seconds(work.gemms, rate, bandwidth)
    compute += work.lora_bytes / bandwidth
    compute += work.elementwise_bytes / bandwidth
    compute = max(compute, work.weight_read_bytes / bandwidth)
    compute = max(compute, work.dispatch_s)
    dequant = work.dequant_bytes / bandwidth

    shard = work.streamed_shard_bytes
    streaming = 0.0
    if shard is not None:
        streaming = offload_streaming_seconds(shard, gpu.pcie_gb_per_s * 1e9, arch.num_layers, compute)

    optimizer = 0.0
    if plan.is_training:
        trainable_per_gpu = work.optimizer_params
        if plan.cpu_offload:
            optimizer = trainable_per_gpu / CPU_ADAM_PARAMS_PER_S + 4.0 * trainable_per_gpu / (gpu.pcie_gb_per_s * 1e9)
        else:
            optimizer = work.optimizer_bytes / bandwidth
        if states.optimizer_states_paged and peak_device_bytes is not None:
            # bitsandbytes paged states live in unified memory: what does not fit in the GPU's free
            # memory is paged in for the optimizer step and out again (NVIDIA unified memory paging).
            free = max(0.0, gpu.memory_gib * 2**30 - peak_device_bytes)
            spilled = max(0.0, states.optimizer_states_paged - free)
            optimizer += 2 * spilled / (gpu.pcie_gb_per_s * 1e9)
        optimizer /= plan.gradient_accumulation_steps or 1

    # In field order, positionally: a planner builds one per card and configuration it searches.
    return CardStep(
        plan,
        arch,
        recipe,
        states,
        gpu,
        work,
        peak,  # peak_flops_per_s
        util,  # utilisation
        source,  # utilisation_source
        compute,  # compute_s
        dequant,  # dequant_s
        streaming,  # offload_streaming_s
        optimizer,  # optimizer_s
    )


@quick_init
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
