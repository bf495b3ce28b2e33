"""The precise trace: one real training step of the real model code, under fake tensors, on the CPU.

The model is built from its config.json with transformers (no weights, no download), LoRA is applied
with PEFT when the plan says so, and one step (forward, loss, backward, optimizer step) runs with the
plan's batch, sequence length, precision and checkpointing under ``FakeTensorMode``: shapes and dtypes
are real, storage is not. PyTorch's ``MemTracker`` (torch.distributed._tools.mem_tracker) counts the
live bytes by category at the peak, which compares with ``torch.cuda.max_memory_allocated``.

What a CPU trace cannot do: bitsandbytes 4/8-bit layers and 8-bit optimizers need CUDA kernels, so
such plans are traced with their 16-bit equivalent and the analytic difference is added (said in
``notes``); the CUDA allocator's reserve and context are not traced (the analytic model adds them).
Needs the ``trace`` extra (torch, transformers, peft).
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from services.estimator.architecture import Architecture
from services.estimator.estimate import resolve_architecture
from services.estimator.memory import GIB, peak_memory
from services.estimator.plan import Plan
from services.estimator.recipe import resolve_recipe
from services.estimator.resolved import ResolvedPlan
from services.trace import INSTALL_HINT

# The HF module names of each LoRA role, per model family (the projections' attribute names).
_HF_MODULES: dict[str, dict[str, list[str]]] = {
    "default": {
        "q": ["q_proj"],
        "k": ["k_proj"],
        "v": ["v_proj"],
        "o": ["o_proj"],
        "gate": ["gate_proj"],
        "up": ["up_proj"],
        "down": ["down_proj"],
    },
    "phi3": {
        "q": ["qkv_proj"],
        "k": ["qkv_proj"],
        "v": ["qkv_proj"],
        "o": ["o_proj"],
        "gate": ["gate_up_proj"],
        "up": ["gate_up_proj"],
        "down": ["down_proj"],
    },
    "phi": {"q": ["q_proj"], "k": ["k_proj"], "v": ["v_proj"], "o": ["dense"], "up": ["fc1"], "down": ["fc2"]},
    "gpt2": {"q": ["c_attn"], "k": ["c_attn"], "v": ["c_attn"], "o": ["c_proj"], "up": ["c_fc"], "down": ["c_proj"]},
    "gpt_neox": {
        "q": ["query_key_value"],
        "k": ["query_key_value"],
        "v": ["query_key_value"],
        "o": ["dense"],
        "up": ["dense_h_to_4h"],
        "down": ["dense_4h_to_h"],
    },
    "falcon": {
        "q": ["query_key_value"],
        "k": ["query_key_value"],
        "v": ["query_key_value"],
        "o": ["dense"],
        "up": ["dense_h_to_4h"],
        "down": ["dense_4h_to_h"],
    },
}


# The breakdown entry for the analytic difference between a plan and its traced 16-bit stand-in.
ANALYTIC_DIFFERENCE = "analytic_difference"


class TraceUnavailable(RuntimeError):
    """The trace extra is not installed, or the plan cannot be traced on the CPU."""


@dataclass(frozen=True)
class TraceResult:
    peak_allocated_gib: float
    # GiB by tracker category at the peak (param, grad, act, temp, opt, ...), plus analytic_difference
    # when part of the plan was traced as a stand-in; the entries add up to peak_allocated_gib.
    breakdown: dict[str, float]
    analytic_peak_allocated_gib: float
    disagreement_pct: float  # (trace - analytic) / analytic
    seconds: float
    traced_as: dict[str, Any]  # the plan fields actually traced (16-bit stand-ins for quantized plans)
    notes: list[str] = field(default_factory=list)


def _hf_config(config: dict[str, Any], attention: str = "sdpa") -> Any:
    from transformers import AutoConfig

    fields = {k: v for k, v in config.items() if k not in ("model_type", "architectures", "torch_dtype", "dtype")}
    hf = AutoConfig.for_model(config["model_type"], **fields)
    hf._attn_implementation = attention
    return hf


def _build_model(config: dict[str, Any], attention: str, dtype: Any) -> Any:
    """The model on ``meta``, with the plan's attention: eager when asked, else SDPA (the CPU has no flash
    kernel; SDPA's CPU kernel keeps what flash keeps, the output and the log-sum-exp). A class that refuses
    SDPA (Gemma2: ``_supports_sdpa = False``, its logit soft-capping) gets eager, as from_pretrained's
    default would give it."""
    import torch
    from transformers import AutoModelForCausalLM

    implementation = "eager" if attention == "eager" else "sdpa"
    with torch.device("meta"):
        try:
            return AutoModelForCausalLM.from_config(_hf_config(config, implementation), dtype=dtype)
        except ValueError as exc:
            if "scaled_dot_product_attention" not in str(exc):
                raise
            return AutoModelForCausalLM.from_config(_hf_config(config, "eager"), dtype=dtype)


def _traceable(plan: Plan) -> tuple[Plan, list[str]]:
    """The plan to run on the CPU: quantized bases and 8-bit optimizers become their 16-bit forms."""
    notes: list[str] = []
    changes: dict[str, Any] = {}
    if plan.quantized is not None:
        changes.update(method="lora", quantization=None, nf4_quantization=None)
        notes.append(
            f"{plan.quantized} base traced as 16-bit (bitsandbytes needs CUDA); the analytic weight "
            "difference is applied"
        )
    if plan.optimizer in ("adamw-8bit", "paged-adamw-8bit", "paged-adamw"):
        changes["optimizer"] = "adamw"
        notes.append(
            f"{plan.optimizer} traced as 32-bit AdamW states (bitsandbytes needs CUDA); the analytic "
            "optimizer difference is applied"
        )
    if plan.compile or plan.activation_offloading:
        changes.update(compile=None, activation_offloading=None)
        notes.append(
            "traced eagerly and without activation offloading (fake tensors run neither inductor nor host "
            "copies); the analytic difference is applied"
        )
    if plan.gpus > 1 or plan.sharding != "none":
        changes.update(gpus=1, sharding="none", cpu_offload=False)
        notes.append("traced on one GPU without sharding; the analytic per-GPU sharding difference is applied")
    return (plan.model_copy(update=changes) if changes else plan), notes


def trace_plan(plan: Plan | ResolvedPlan, *, threads: int = 2, recorder: Any = None) -> TraceResult:
    """Run one training step of ``plan`` under fake tensors and compare with the analytic estimate (``plan``
    may come resolved, services.estimator.resolved: its architecture and recipe are reused).

    ``recorder``: a TorchDispatchMode with a ``track(tensor)`` method (benchmarks/mechanisms/allocator.py's),
    given the tensors alive when the step starts and entered around the step, so the step's storages can be
    replayed through a model of the caching allocator; every layer is then traced (no extension)."""
    # One trace at a time per process: the in-process task runner and the API run several at once in threads, and
    # transformers' lazy imports, torch's thread count and its module-hierarchy tracking are process-wide (two of
    # three concurrent traces failed, with an ImportError of AutoModelForCausalLM: an input probe of stop 53).
    with _ONE_TRACE:
        return _trace(plan, threads, recorder)


def _trace(plan: Plan | ResolvedPlan, threads: int, recorder: Any) -> TraceResult:
    resolved = plan if isinstance(plan, ResolvedPlan) else None
    plan = plan.plan if isinstance(plan, ResolvedPlan) else plan
    try:
        import torch
        from torch._subclasses.fake_tensor import FakeTensorMode
    except ImportError as exc:
        raise TraceUnavailable(f"the trace needs the trace extra: {INSTALL_HINT}") from exc
    if not plan.is_training:
        raise TraceUnavailable("mode: only training plans are traced")
    if plan.model.generic is not None:
        raise TraceUnavailable("model.generic: a trace needs the model's config.json")
    if resolved is not None:
        name, arch, recipe = resolved.name, resolved.architecture, resolved.recipe
    else:
        name, arch = resolve_architecture(plan)
        recipe = resolve_recipe(plan)
    if plan.method != "full" and not recipe.lora_targets:
        raise TraceUnavailable("lora.targets: no layer is adapted, so there is nothing to train")
    config = _config_of(plan)
    traced, notes = _traceable(plan)
    start = time.perf_counter()
    torch.set_num_threads(threads)
    layers = arch.num_layers
    extended = None
    if recorder is None and layers > 8 and len(arch.blocks) == 1 and layer_key(config) is not None:
        extended = _extend_over_layers(traced, arch, config, layers, torch, FakeTensorMode)
    if extended is not None:
        peak, categories = extended
        notes.append(f"traced with 4, 6 and 8 of the {layers} identical layers and extended linearly")
    else:
        peak, categories = _run_step(traced, arch, config, torch, FakeTensorMode, recorder)
    seconds = time.perf_counter() - start

    # Put back what the CPU could not run, from the analytic model: the difference between the plan
    # and its traced stand-in.
    analytic = peak_memory(plan, arch, recipe).peak_allocated
    stand_in = peak_memory(traced, arch, resolve_recipe(traced)).peak_allocated
    difference = analytic - stand_in if traced is not plan else 0.0
    adjusted = peak + difference
    if difference:
        # The breakdown adds up to the peak: what the CPU could not run is its own (signed) entry.
        categories = {**categories, ANALYTIC_DIFFERENCE: difference}
    return TraceResult(
        peak_allocated_gib=round(adjusted / GIB, 3),
        breakdown={k: round(v / GIB, 3) for k, v in categories.items()},
        analytic_peak_allocated_gib=round(analytic / GIB, 3),
        disagreement_pct=round((adjusted - analytic) / analytic * 100, 1),
        seconds=round(seconds, 1),
        traced_as=traced.model_dump(mode="json", include={"method", "quantization", "optimizer", "gpus", "sharding"}),
        notes=[f"model {name}", *notes],
    )


_ONE_TRACE = threading.Lock()
_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers")
# How straight the three points must be (share of the peak) to extend them to every layer.
LINEARITY_TOLERANCE = 0.01


def _extend_over_layers(
    plan: Plan, arch: Architecture, config: dict[str, Any], layers: int, torch: Any, fake_mode: Any
) -> tuple[float, dict[str, float]] | None:
    """Identical blocks add identical bytes: trace 4, 6 and 8 layers and extend the line to all of them.

    Exact while the peak falls at the same moment of the step; when the three points are not on a line
    (the peak moved, e.g. from the logits to the optimizer step) return None and trace every layer.
    """
    points = {n: _run_step(plan, arch, with_layers(config, n), torch, fake_mode) for n in (4, 6, 8)}
    (p4, _), (p6, c6), (p8, c8) = points[4], points[6], points[8]
    if abs((p8 - p6) - (p6 - p4)) > LINEARITY_TOLERANCE * p8:
        return None
    scale = (layers - 8) / 2
    categories = {k: c8.get(k, 0.0) + (c8.get(k, 0.0) - c6.get(k, 0.0)) * scale for k in {*c6, *c8}}
    return p8 + (p8 - p6) * scale, categories


def layer_key(config: dict[str, Any]) -> str | None:
    """The config field holding the layer count (None for nested or encoder-decoder configs)."""
    if config.get("is_encoder_decoder") or "text_config" in config:
        return None
    return next((k for k in _LAYER_KEYS if isinstance(config.get(k), int)), None)


def with_layers(config: dict[str, Any], layers: int) -> dict[str, Any]:
    key = layer_key(config)
    if key is None:
        raise TraceUnavailable("model.config: no layer count field to vary (nested or encoder-decoder config)")
    out = {**config, key: layers}
    for per_layer in ("layer_types", "mlp_only_layers"):  # per-layer lists must match the count
        if isinstance(out.get(per_layer), list):
            out[per_layer] = out[per_layer][:layers]
    return out


def _config_of(plan: Plan) -> dict[str, Any]:
    if plan.model.config is not None:
        return dict(plan.model.config)
    from services.catalog.models import find_model

    if plan.model.name is None:
        raise TraceUnavailable("model: give model.name or model.config")
    return dict(find_model(plan.model.name).config)


def _lora_targets(plan: Plan, arch: Architecture) -> list[str] | str:
    recipe = resolve_recipe(plan)
    if plan.lora is None or plan.lora.targets == "all-linear":
        return "all-linear"
    names = _HF_MODULES.get(arch.model_type, _HF_MODULES["default"])
    modules = sorted({m for role in recipe.lora_targets if role != "lm_head" for m in names.get(role, [])})
    if "lm_head" in recipe.lora_targets:
        modules.append("lm_head")
    return modules


def _run_step(
    plan: Plan, arch: Architecture, config: dict[str, Any], torch: Any, fake_mode: Any, recorder: Any = None
) -> tuple[float, dict[str, float]]:
    from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType

    class FrozenAwareTracker(MemTracker):
        """MemTracker hooks every parameter's gradient; frozen ones (LoRA's base) cannot take a hook."""

        def _track_module_params_and_buffers(self, module: Any, install_grad_hooks: bool = True) -> Any:
            totals = super()._track_module_params_and_buffers(module, install_grad_hooks=False)
            if install_grad_hooks:
                for param in module.parameters():
                    if param.requires_grad and self._param_to_grad_hook_handles.get(param) is None:
                        self._param_to_grad_hook_handles[param] = (
                            param.register_hook(self._record_grad),
                            param.register_post_accumulate_grad_hook(lambda p: self._record_grad(p.grad)),
                        )
            return totals

        def _record_grad(self, grad: Any) -> None:
            self._update_and_maybe_create_winfos(grad, _MemRefType.GRAD)

    recipe = resolve_recipe(plan)
    dtype = {2: torch.bfloat16 if plan.precision.startswith("bf16") else torch.float16, 4: torch.float32}[
        recipe.weight_bytes
    ]
    model = _build_model(config, recipe.attention, dtype)
    if plan.method != "full":
        from peft import LoraConfig, get_peft_model

        lora = plan.lora
        model = get_peft_model(
            model,
            LoraConfig(
                r=recipe.lora_rank,
                lora_alpha=(lora.alpha if lora and lora.alpha else 2 * recipe.lora_rank),
                lora_dropout=recipe.lora_dropout,
                target_modules=_lora_targets(plan, arch),
            ),
            autocast_adapter_dtype=recipe.adapter_bytes == 4,
        )
    if plan.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if plan.method != "full":
            model.enable_input_require_grads()
    with fake_mode(allow_non_fake_inputs=True):
        model = _to_empty_keeping_ties(model)
        for module in model.modules():  # rotary tables are computed, not loaded: rebuild them
            if hasattr(module, "inv_freq") and hasattr(module, "rope_init_fn"):
                module.inv_freq, _ = module.rope_init_fn(module.config, "cpu")
        model.train()
        trainable = [p for p in model.parameters() if p.requires_grad]
        optimizer = _optimizer(plan, recipe, trainable, torch)
        # Create the optimizer states first (AdamW makes them at its first step), so the traced step is a
        # steady-state one.
        for p in trainable:
            p.grad = torch.zeros_like(p)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        ids = torch.randint(0, int(config.get("vocab_size") or arch.vocab_size), (plan.micro_batch_size, plan.seq_len))
        tracker = FrozenAwareTracker()
        tracker.track_external(model, optimizer)
        # The plan's autocast, not only the -mixed precisions': the Trainer's bf16 recipe runs a 16-bit model
        # under autocast too, so PEFT's fp32 adapters get autocast's 16-bit copy of their input, not the fp32
        # one of peft/tuners/tuners_utils.py ``_cast_input_dtype`` (frameworks.py, FrameworkDefaults.autocast).
        autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=recipe.autocast)
        if recorder is not None:
            states = [t for state in optimizer.state.values() for t in state.values() if torch.is_tensor(t)]
            for tensor in [*model.parameters(), *model.buffers(), *states, ids]:
                recorder.track(tensor)
        with tracker, recorder if recorder is not None else contextlib.nullcontext():
            with autocast:
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        snapshot = tracker.get_tracker_snapshot("peak")
    per_device = next(iter(snapshot.values()))
    categories = {str(k).split(".")[-1].lower(): float(v) for k, v in per_device.items() if str(k) != "Total"}
    return float(per_device["Total"]), categories


def _to_empty_keeping_ties(model: Any) -> Any:
    """``Module.to_empty`` makes a new parameter per owning module, so a tied embedding and head (one
    Parameter in two modules, transformers' tie_weights) would come back as two: point every owner back at
    one."""
    owners: dict[int, list[tuple[Any, str]]] = {}
    for module in model.modules():
        for name, param in module._parameters.items():
            if param is not None:
                owners.setdefault(id(param), []).append((module, name))
    model = model.to_empty(device="cpu")
    for shared in owners.values():
        first, first_name = shared[0]
        for module, name in shared[1:]:
            module._parameters[name] = first._parameters[first_name]
    return model


def _optimizer(plan: Plan, recipe: Any, params: list[Any], torch: Any) -> Any:
    if plan.optimizer == "sgd":
        return torch.optim.SGD(params, lr=1e-4, momentum=0.9, foreach=recipe.optimizer_impl == "foreach")
    if plan.optimizer == "adafactor":
        return torch.optim.Adafactor(params, lr=1e-2)
    fused = recipe.optimizer_impl == "fused"
    return torch.optim.AdamW(params, lr=1e-4, foreach=not fused and recipe.optimizer_impl == "foreach", fused=False)


# The HF module names a plan's LoRA targets adapt; the calibration run (services/agent/calibrate.py)
# adapts the same modules as the trace.
lora_target_modules = _lora_targets
