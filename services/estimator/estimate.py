"""The estimator's entry point: a plan in, memory per GPU, fit per card, throughput and cost out."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, NamedTuple

from services.catalog.gpus import GpuSpec, find_gpu, gpu_specs
from services.catalog.offers import Offer, bundled_offers
from services.estimator.architecture import Architecture, parameter_counts
from services.estimator.budget import CpuBudget
from services.estimator.fit import fits_card, headroom_ratio
from services.estimator.frameworks import framework_note
from services.estimator.memory import GIB, MemoryBreakdown, groupwise_layout, peak_memory
from services.estimator.padding import padding_note, short_run_warnings
from services.estimator.plan import GenericModel, Plan
from services.estimator.recipe import Recipe
from services.estimator.reports import (
    CostReport,
    Estimate,
    FitReport,
    MemoryReport,
    ParameterReport,
    ThroughputReport,
)
from services.estimator.resolved import ResolvedPlan, as_resolved
from services.estimator.resolved import resolve_architecture as resolve_architecture  # its callers' import
from services.estimator.throughput import (
    Throughput,
    estimate_throughput,
    flops_per_token,
    run_cost,
    step_work,
    utilisation_or_prior,
)
from services.estimator.uncertainty import memory_band

# Below this share of free memory a fit is reported as tight: allocator behaviour varies by a few percent between runs.
TIGHT_HEADROOM = 0.05


def _gib(value: float) -> float:
    return round(value / GIB, 3)


# Cards estimated between two reads of the CPU budget (a few tens of microseconds of work each).
BUDGET_CHECK_EVERY_CARDS = 8


def estimate(
    plan: Plan | ResolvedPlan,
    gpu: str | GpuSpec | None = None,
    *,
    catalog: tuple[GpuSpec, ...] | None = None,
    offers: tuple[Offer, ...] | None = None,
    utilisation: float | None = None,
    utilisation_source: str | None = None,
    budget: CpuBudget | None = None,
) -> Estimate:
    """Estimate ``plan``: peak memory per GPU, fit on every catalog card, tokens/s on ``gpu``, costs.

    ``plan`` may come resolved (services.estimator.resolved), as the plan task hands it down. ``budget``
    bounds the CPU time spent (checked per priced offer); over it, WorkBudgetExceeded."""
    catalog = catalog if catalog is not None else gpu_specs()
    offers = offers if offers is not None else bundled_offers()
    target = find_gpu(gpu, catalog) if isinstance(gpu, str) else gpu
    if isinstance(plan, Plan) and plan.model.generic is not None:
        return _generic_estimate(plan, plan.model.generic, catalog)

    resolved = as_resolved(plan)
    plan, name, arch, recipe = resolved.plan, resolved.name, resolved.architecture, resolved.recipe
    mem = peak_memory(plan, arch, recipe)
    if target is not None:
        mem = cap_cache_to_card(mem, target)
    states = mem.states
    counts = parameter_counts(arch)
    warnings = [*resolved.notes, *_warnings(plan, arch, recipe, mem, target)]

    ratio = headroom_ratio(plan.framework, plan.method, plan.sharding, plan.gpus, plan.mode, arch.low_confidence)
    fits = [_fit(spec, mem.peak_device, ratio) for spec in catalog]
    throughput: ThroughputReport | None = None
    work = step_work(plan, arch, recipe, states)  # the same on every card: computed once
    if target is not None:
        throughput = _throughput_report(
            estimate_throughput(
                plan,
                arch,
                recipe,
                states,
                target,
                utilisation,
                utilisation_source,
                peak_device_bytes=mem.peak_device,
                work=work,
            ),
            target,
            plan,
        )
    total_tokens = plan.data.total_tokens() if plan.data is not None else None
    costs = []
    by_name = {s.name: s for s in catalog}
    fit_by_name = {f.gpu: f.fits for f in fits}
    per_card: dict[str, _CardRates] = {}  # offers of one card share its throughput
    unrented = 0
    for offer in offers:
        spec = by_name.get(offer.gpu)
        if spec is None:
            continue
        if not offer.rents(plan.gpus):  # priced at a count the provider does not rent, it was a price no one pays
            unrented += 1
            continue
        rates = per_card.get(spec.name)
        if rates is None:
            # The budget is read where the work is (throughput estimates per card), every few cards: reading a
            # thread's CPU clock is a system call, dearer than one card's estimate on some kernels.
            if budget is not None and len(per_card) % BUDGET_CHECK_EVERY_CARDS == 0:
                budget.check("plan", "estimate against fewer offers")
            tp = estimate_throughput(plan, arch, recipe, states, spec, peak_device_bytes=mem.peak_device, work=work)
            rates = per_card[spec.name] = _CardRates(tp, round(tp.tokens_per_s, 1), round(tp.data_tokens_per_s, 1))
        costs.append(_cost(offer, spec, plan, rates, total_tokens, fit_by_name[spec.name]))
    costs.sort(key=lambda c: (not c.fits, c.usd_per_million_tokens))
    if unrented:
        warnings.append(
            f"{unrented} offer(s) rent no {plan.gpus} GPU(s) (whole nodes of more, or one node at most): left out of "
            "costs; the planner prices every count they rent"
        )

    return Estimate(
        model=name,
        model_type=arch.model_type,
        confidence=arch.confidence,
        parameters=ParameterReport(
            total=counts.total,
            trainable=mem.trainable_params,
            active=counts.active,
            embedding=counts.embedding,
            attention=counts.attention,
            mlp=counts.mlp,
            lm_head=counts.lm_head,
        ),
        mode=plan.mode,
        memory=_memory_report(mem, states.optimizer_states_paged, plan, low_confidence=arch.low_confidence),
        fits=fits,
        throughput=throughput,
        costs=costs,
        total_tokens=total_tokens,
        warnings=warnings,
        assumptions=_assumptions(plan, recipe),
    )


# The search range of a calibrated large-GEMM utilisation (share of the dense peak: down to what a CPU standing
# in for a GPU reaches), its relative precision, and how near the measured rate an estimate must come.
UTILISATION_SEARCH = (1e-6, 1.0)
UTILISATION_TOLERANCE = 1e-4
RATE_TOLERANCE = 1e-3


def utilisation_reproducing(
    plan: Plan | ResolvedPlan, gpu: GpuSpec, tokens_per_s_per_gpu: float
) -> tuple[float, bool] | None:
    """(utilisation, met): the large-GEMM utilisation at which this estimate of ``plan`` on ``gpu`` gives the
    measured per-GPU rate, and whether it does.

    A calibration measures a whole step; the estimate charges the GEMMs and attention at peak x utilisation and
    the rest (element-wise bytes, unfused adapters, dequantisation, communication, the optimizer, the host floor)
    on its own terms, so the utilisation that replaces the class prior is the one that makes the same estimate
    meet the measurement, not the measured hardware FLOPs utilisation (which would charge the other terms
    twice). Step time falls monotonically as the utilisation rises, so bisection finds the utilisations that
    meet the rate (within ``RATE_TOLERANCE``). Where a floor binds they are a whole range, and the measurement
    says only that the rate lies in it: the class prior is kept when it does, else the crossing is taken.
    Where no utilisation up to 1 is fast enough the answer is 1, and where even 1e-6 is too fast it is 1e-6,
    not met. None for a generic model."""
    if (isinstance(plan, Plan) and plan.model.generic is not None) or tokens_per_s_per_gpu <= 0:
        return None
    resolved = as_resolved(plan)
    plan, arch, recipe = resolved.plan, resolved.architecture, resolved.recipe
    mem = cap_cache_to_card(peak_memory(plan, arch, recipe), gpu)
    states = mem.states
    fpt = flops_per_token(plan, arch, recipe)

    rates: dict[float, float] = {}

    def rate(utilisation: float) -> float:
        if utilisation not in rates:
            tp = estimate_throughput(
                plan, arch, recipe, states, gpu, utilisation, peak_device_bytes=mem.peak_device, flops=fpt
            )
            rates[utilisation] = tp.tokens_per_s_per_gpu
        return rates[utilisation]

    def boundary(at_or_above: Callable[[float], bool]) -> float:
        """The smallest utilisation where ``at_or_above`` turns true (it is false at the low end, true at the high)."""
        low, high = UTILISATION_SEARCH
        while high - low > UTILISATION_TOLERANCE * low:
            middle = (low * high) ** 0.5  # geometric: the answer may lie anywhere from 1e-6 to 1
            if at_or_above(middle):
                high = middle
            else:
                low = middle
        return high

    slow, fast = tokens_per_s_per_gpu * (1 - RATE_TOLERANCE), tokens_per_s_per_gpu * (1 + RATE_TOLERANCE)
    lowest, highest = UTILISATION_SEARCH
    if rate(highest) < slow:
        return highest, False
    if rate(lowest) > fast:
        return lowest, False
    first = lowest if rate(lowest) >= slow else boundary(lambda u: rate(u) >= slow)
    last = highest if rate(highest) <= fast else boundary(lambda u: rate(u) > fast)
    prior = utilisation_or_prior(gpu, None)
    if first <= prior <= last:
        return prior, True
    if rate(lowest) >= tokens_per_s_per_gpu:
        return lowest, True
    return boundary(lambda u: rate(u) >= tokens_per_s_per_gpu), True


def _bands(
    plan: Plan, peaks: dict[str, float], low_confidence: bool
) -> tuple[list[float], dict[str, list[float]], str]:
    """[p10, p90] per counter from the residuals of the plan's category, and a line saying whence."""
    intervals: dict[str, list[float]] = {}
    basis = ""
    for metric, peak in peaks.items():
        band = memory_band(plan.framework, plan.method, plan.sharding, plan.gpus, metric, plan.mode, low_confidence)
        low, high = band.interval(peak)
        intervals[metric] = [_gib(low), _gib(high)]
        if metric == "device":
            basis = f"p10-p90 of ln(measured/predicted) over {band.cases} measured cases in '{band.category}'" + (
                "; widened to at least the spread of all cases (low confidence)" if band.widened_low_confidence else ""
            )
    return intervals["device"], intervals, basis


def _memory_report(mem: MemoryBreakdown, paged: float, plan: Plan, low_confidence: bool) -> MemoryReport:
    interval, intervals, basis = _bands(
        plan,
        {"allocated": mem.peak_allocated, "reserved": mem.peak_reserved, "device": mem.peak_device},
        low_confidence,
    )
    return MemoryReport(
        interval_gib=interval,
        intervals_gib=intervals,
        interval_basis=basis,
        peak_allocated_gib=_gib(mem.peak_allocated),
        peak_reserved_gib=_gib(mem.peak_reserved),
        peak_device_gib=_gib(mem.peak_device),
        peak_moment=mem.peak_moment,
        breakdown={k: _gib(v) for k, v in mem.components.items()},
        moments_gib={k: _gib(v) for k, v in mem.moments.items()},
        activations_per_layer_per_token_bytes={k: round(v, 1) for k, v in mem.activations_per_layer_per_token.items()},
        optimizer_states_paged_gib=_gib(paged),
        reclaimable_cache_gib=_gib(mem.cached_reclaimable),
    )


def cap_cache_to_card(mem: MemoryBreakdown, spec: GpuSpec) -> MemoryBreakdown:
    """The free cached blocks that can exist beside the device peak on ``spec``: a cudaMalloc that finds
    the card full makes the caching allocator release its free cached segments and retry
    (CUDACachingAllocator, release_cached_blocks), so the cache never holds more than the card has left."""
    room = max(0.0, spec.memory_gib * GIB - mem.peak_device)
    if mem.cached_reclaimable <= room:
        return mem
    return replace(mem, cached_reclaimable=room)


def _fit(spec: GpuSpec, device_bytes: float, ratio: float) -> FitReport:
    """Whether the device peak fits ``spec`` by the planner's rule (services.estimator.fit), so the estimate's
    table and the planner's pick never disagree on a card."""
    headroom = spec.memory_gib - device_bytes / GIB
    return FitReport(
        gpu=spec.name,
        memory_gib=spec.memory_gib,
        fits=fits_card(device_bytes, ratio, spec.memory_gib),
        headroom_gib=round(headroom, 3),
        tight=0 <= headroom < TIGHT_HEADROOM * spec.memory_gib,
    )


def _throughput_report(tp: Throughput, spec: GpuSpec, plan: Plan) -> ThroughputReport:
    return ThroughputReport(
        gpu=spec.name,
        gpus=plan.gpus,
        tokens_per_s=round(tp.tokens_per_s, 1),
        tokens_per_s_per_gpu=round(tp.tokens_per_s_per_gpu, 1),
        data_tokens_per_s=round(tp.data_tokens_per_s, 1),
        mfu=round(tp.mfu, 4),
        utilisation_assumed=tp.utilisation_assumed,
        utilisation_source=tp.utilisation_source,
        hardware_flops_per_token=tp.flops_per_token.hardware,
        step_seconds=round(tp.step_seconds, 6),
        seconds_per_step={k: round(v, 6) for k, v in tp.seconds.items()},
    )


class _CardRates(NamedTuple):
    """A card's throughput and its two rates as reported (rounded once per card, not per offer: ``round`` is
    among the dearer calls of pricing an offer)."""

    throughput: Throughput
    tokens_per_s: float
    data_tokens_per_s: float


def _cost(
    offer: Offer, spec: GpuSpec, plan: Plan, rates: _CardRates, total_tokens: float | None, fits: bool
) -> CostReport:
    tp = rates.throughput
    per_hour = offer.on_demand_usd_per_hour * plan.gpus
    spot_per_hour = offer.spot_usd_per_hour * plan.gpus if offer.spot_usd_per_hour is not None else None
    # Per token of the data set: pad tokens cost GPU time but are not what the run is sized by.
    per_million = per_hour / (tp.data_tokens_per_s * 3600.0) * 1e6
    hours = on_demand = spot = None
    if total_tokens is not None:
        cost = run_cost(
            total_tokens, tp.data_tokens_per_s, plan.gpus, offer.on_demand_usd_per_hour, offer.spot_usd_per_hour
        )
        hours, on_demand, spot = round(cost.hours, 3), cost.on_demand_usd, cost.spot_usd
    return CostReport(
        provider=offer.provider,
        gpu=spec.name,
        gpus=plan.gpus,
        fits=fits,
        tokens_per_s=rates.tokens_per_s,
        data_tokens_per_s=rates.data_tokens_per_s,
        on_demand_usd_per_hour=round(per_hour, 4),
        spot_usd_per_hour=None if spot_per_hour is None else round(spot_per_hour, 4),
        usd_per_million_tokens=round(per_million, 4),
        hours=hours,
        on_demand_usd=None if on_demand is None else round(on_demand, 2),
        spot_usd=None if spot is None else round(spot, 2),
    )


def _warnings(plan: Plan, arch: Architecture, recipe: Recipe, mem: MemoryBreakdown, gpu: GpuSpec | None) -> list[str]:
    out: list[str] = list(arch.notes)  # the family's caveats; for an unknown family, each assumption
    if plan.is_training and plan.method != "full" and plan.lora is None:
        out.append("no lora settings given: assumed rank 16 on all linear layers (q,k,v,o,gate,up,down)")
    if arch.max_position_embeddings and plan.seq_len > arch.max_position_embeddings:
        out.append(f"seq_len {plan.seq_len} exceeds the model's max_position_embeddings {arch.max_position_embeddings}")
    out += short_run_warnings(plan, recipe, plan.effective_batch_size)
    if gpu is not None and plan.precision.startswith("bf16") and not gpu.bf16_tflops:
        out.append(f"{gpu.name} has no bf16 tensor cores: use fp16 (throughput assumes the fp16 rate)")
    if gpu is not None and plan.precision == "fp32":
        # throughput.py times fp32 matmuls at the TF32 tensor rate (GpuSpec.dense_tflops); PyTorch runs them in
        # full fp32 on the CUDA cores unless TF32 is allowed (torch.backends.cuda.matmul.allow_tf32 defaults to
        # False since PyTorch 1.12; PyTorch docs, CUDA semantics, "TensorFloat-32 (TF32) on Ampere devices").
        out.append(
            "fp32: throughput assumes TF32 tensor cores (torch.set_float32_matmul_precision('high'), or tf32=True "
            "in TrainingArguments); PyTorch's default runs fp32 matmuls on the CUDA cores, several times slower "
            "on datacenter GPUs"
        )
    if plan.optimizer.startswith("paged"):
        out.append(
            "paged optimizer states live in CUDA unified memory: not counted in allocated/reserved; they page "
            "to host memory when the GPU is full (slower, not an out-of-memory)"
        )
    if plan.cpu_offload:
        out.append("cpu_offload: optimizer states (and sharded parameters) live in host RAM; size the host to match")
    if arch.is_moe:
        out.append("mixture of experts: every expert's weights are resident; activations follow experts_per_token")
    if any(b.kind != "decoder" for b in arch.blocks):
        out.append("encoder-decoder model: seq_len is used for both the encoder and the decoder")
    if arch.vision_params:
        out.append("multimodal model: the vision tower's weights are counted, image activations are not")
    if gpu is not None and plan.quantized == "fp8" and not gpu.fp8_tflops:
        # vLLM serves fp8 checkpoints on GPUs without fp8 tensor cores through its weight-only FP8 Marlin
        # kernel (vLLM docs, "FP8 W8A8": Ampere runs weight-only FP8): the weights stay 1 byte.
        out.append(
            f"{gpu.name} has no fp8 tensor cores: fp8 weights are dequantized to 16-bit for each matmul "
            "(weight-only, as vLLM's FP8 Marlin kernel does); the memory is as shown, the speed is not fp8's"
        )
    awq_bits = groupwise_layout(plan)[0] if plan.quantized == "awq" else 4
    if awq_bits != 4:  # WQLinear_GEMM: "Only 4-bit are supported for now."; vLLM's AWQConfig: weight_bits 4 only
        out.append(f"{awq_bits}-bit AWQ: AutoAWQ and vLLM load only 4-bit AWQ; sized as AutoAWQ would pack it")
    if plan.method == "qlora" and plan.quantization == "int8":
        out.append("int8 base (LLM.int8): bitsandbytes int8 matmuls are much slower than nf4 dequant+bf16")
    return out


# What each served weight format stores per quantized element (services/estimator/memory/quantization.py).
_SERVED_WEIGHTS = {
    "nf4": "NF4 4-bit codes + an fp32 absmax per 64-element block (bitsandbytes; Dettmers et al. 2023)",
    "int8": "int8 + an fp32 scale per output row (LLM.int8(), bitsandbytes)",
    "fp8": "fp8 E4M3, 1 byte + a per-tensor scale (vLLM / TensorRT-LLM fp8 checkpoints)",
    "awq": "{bits}-bit AWQ codes + an fp16 scale and {bits}-bit zero per {group} (AutoAWQ GEMM layout)",
    "gptq": "{bits}-bit GPTQ codes + an fp16 scale and {bits}-bit zero per {group} (auto-gptq layout)",
}


def _served_weights(plan: Plan, quant: str) -> str:
    bits, group = groupwise_layout(plan) if quant in ("awq", "gptq") else (4, -1)
    return _SERVED_WEIGHTS[quant].format(bits=bits, group=f"group of {group} inputs" if group > 0 else "input row")


def serving_assumptions(plan: Plan, recipe: Recipe) -> list[str]:
    """What an inference estimate assumes: the served weights, the KV cache, the forward pass it sizes."""
    kv = plan.kv_cache_dtype or ("fp32" if recipe.compute_bytes == 4 else plan.precision)
    quant = plan.quantized
    weights = (
        f"weights: {plan.precision} ({recipe.weight_bytes} bytes per parameter)"
        if quant is None
        else f"weights: block linears {_served_weights(plan, quant)}"
        + ("" if recipe.quantize_lm_head else "; embeddings, norms and output head")
        + f" in {plan.precision}"
    )
    out = [
        weights,
        f"KV cache: {kv} for {plan.micro_batch_size:,} concurrent sequence{'s' if plan.micro_batch_size != 1 else ''}"
        f" x {plan.seq_len:,} tokens of context each (prompt and generated tokens), allocated in full",
        f"activations: the prefill of the whole context, one layer at a time; attention: {recipe.attention}",
    ]
    if plan.gpus > 1:
        out.append(
            f"{plan.gpus} GPUs: weights "
            + ("sharded across them" if plan.sharding in ("zero3", "fsdp") else "replicated on each")
        )
    return out


def _assumptions(plan: Plan, recipe: Recipe) -> list[str]:
    if not plan.is_training:
        return serving_assumptions(plan, recipe)
    grads = (
        "gradients accumulate across micro-batches (live through the forward pass)"
        if recipe.grads_persist
        else ("no gradient accumulation (gradients freed after each optimizer step)")
    )
    out = [
        f"framework defaults: {framework_note(plan.framework)}",
        f"attention: {recipe.attention}; loss: {recipe.loss}"
        + (" with fp32 logits" if recipe.logits_fp32 else " in the model dtype"),
        f"optimizer implementation: {recipe.optimizer_impl}; {grads}",
    ]
    if plan.gradient_checkpointing:
        out.append(f"activation checkpointing granularity: {recipe.checkpoint_granularity}")
    if plan.method != "full":
        out.append(
            f"LoRA r{recipe.lora_rank} on {','.join(recipe.lora_targets) or 'no layers'}; adapters in "
            f"{'fp32' if recipe.adapter_bytes == 4 else '16-bit'}; lora_dropout {recipe.lora_dropout}"
        )
    if plan.quantized is not None:
        out.append(f"quantized base: {plan.quantized} via {recipe.quant_backend}")
    padding = padding_note(plan, recipe)
    if padding is not None:
        out.append(padding)
    return out


def _generic_estimate(plan: Plan, generic: GenericModel, catalog: tuple[GpuSpec, ...]) -> Estimate:
    """SEEDS.md section 3: parameters x bytes x (1 for inference; +grads +AdamW for training) plus
    activations per sample x batch, plus a 10-30% safety margin. No architecture, so no throughput."""
    dtype_bytes = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "int8": 1.0, "int4": 0.5}[generic.dtype]
    p = generic.parameters
    parts: dict[str, float] = {"weights": p * dtype_bytes}
    trainable = 0
    warnings = [
        "generic model: no architecture, so activations come from activation_bytes_per_sample and "
        "throughput is not estimated"
    ]
    if plan.is_training:
        if plan.method == "full":
            trainable = p
        else:
            trainable = p // 100
            warnings.append("generic model with LoRA: adapters assumed at 1% of the parameters")
        grad_bytes = 4.0 if plan.precision in ("fp32", "bf16-mixed", "fp16-mixed") else 2.0
        parts["gradients"] = trainable * grad_bytes
        states = {
            "adamw": 8.0,
            "paged-adamw": 0.0,
            "adamw-8bit": 2.0,
            "paged-adamw-8bit": 0.0,
            "sgd": 4.0,
            "adafactor": 0.0,
        }[plan.optimizer]
        parts["optimizer_states"] = trainable * states
        if plan.precision.endswith("-mixed") and dtype_bytes == 2.0:
            parts["master_weights"] = trainable * 4.0
        parts["activations"] = float(generic.activation_bytes_per_sample * plan.micro_batch_size)
    allocated = sum(parts.values())
    parts["safety_margin"] = allocated * generic.safety_margin
    device = allocated + parts["safety_margin"]
    interval, intervals, basis = _bands(plan, {"allocated": allocated, "reserved": device, "device": device}, True)
    generic_ratio = headroom_ratio(plan.framework, plan.method, plan.sharding, plan.gpus, plan.mode, True)
    mem = MemoryReport(
        interval_gib=interval,
        intervals_gib=intervals,
        interval_basis=basis,
        peak_allocated_gib=_gib(allocated),
        peak_reserved_gib=_gib(device),
        peak_device_gib=_gib(device),
        peak_moment="whole step (generic)",
        breakdown={k: _gib(v) for k, v in parts.items()},
        moments_gib={},
        activations_per_layer_per_token_bytes={},
        optimizer_states_paged_gib=0.0,
        reclaimable_cache_gib=0.0,
    )
    return Estimate(
        model=plan.model.name or "generic model",
        model_type="generic",
        confidence="low",
        parameters=ParameterReport(total=p, trainable=trainable, active=p, embedding=0, attention=0, mlp=0, lm_head=0),
        mode=plan.mode,
        memory=mem,
        fits=[_fit(spec, device, generic_ratio) for spec in catalog],
        throughput=None,
        costs=[],
        total_tokens=plan.data.total_tokens() if plan.data is not None else None,
        warnings=warnings,
        assumptions=[f"safety margin {generic.safety_margin:.0%} (SEEDS.md section 3: 10-30%)"],
    )


def estimate_dict(plan_data: dict[str, Any], gpu: str | None = None) -> dict[str, Any]:
    """Validate a plan given as JSON data and return the estimate as JSON data."""
    return estimate(Plan.model_validate(plan_data), gpu).model_dump(mode="json")
