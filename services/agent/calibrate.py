"""A calibration run: a short real training of the plan's model (random weights from its config) with the
plan's method, precision, LoRA targets, batch and sequence length: N warm-up steps, then M timed ones.

It measures what it calibrates: LoRA adapts the modules the plan's ``lora.targets`` name (the same
mapping as the trace, services/trace/tracer.py), and a QLoRA plan runs on a 4-bit NF4 base through
bitsandbytes (QLoRA paper, Dettmers et al. 2023: NF4 storage, 16-bit compute, optional double
quantization). Where bitsandbytes or CUDA is missing it says so and the result is marked *not
comparable*: it still runs, as 16-bit LoRA, but the server keeps it out of the calibrated utilisation.
The run uses one GPU; the server compares it with the prediction for the same plan on one GPU.

On a GPU it measures tokens/s and the CUDA allocator's peak allocated/reserved memory; on a CPU-only node
(a tiny model in CI) it measures tokens/s only. Needs the trace extra (torch, transformers, peft) and, for
QLoRA, bitsandbytes.
"""

from __future__ import annotations

import importlib.util
import time
from typing import Any

from services.estimator.estimate import resolve_architecture
from services.estimator.plan import Plan
from services.estimator.recipe import resolve_recipe


def nf4_unavailable(cuda: bool) -> str | None:
    """Why this node cannot run a 4-bit NF4 base (None: it can)."""
    if importlib.util.find_spec("bitsandbytes") is None:
        return "bitsandbytes is not installed on this node (pip install bitsandbytes)"
    if not cuda:
        return "no CUDA device: bitsandbytes' 4-bit kernels need one"
    return None


def quantize_nf4(model: Any, compute_dtype: Any, double_quant: bool, device: Any) -> int:
    """Replace every linear layer but the output head by a bitsandbytes NF4 ``Linear4bit`` holding the same
    weights (quantized when moved to the GPU), as ``load_in_4bit`` does at load time; returns how many."""
    import bitsandbytes as bnb  # type: ignore[import-not-found]
    import torch

    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if not isinstance(child, torch.nn.Linear) or name == "lm_head":
                continue
            layer = bnb.nn.Linear4bit(
                child.in_features,
                child.out_features,
                bias=child.bias is not None,
                compute_dtype=compute_dtype,
                compress_statistics=double_quant,
                quant_type="nf4",
            )
            layer.weight = bnb.nn.Params4bit(
                child.weight.data.to("cpu"), requires_grad=False, compress_statistics=double_quant, quant_type="nf4"
            )
            if child.bias is not None:
                layer.bias = torch.nn.Parameter(child.bias.data, requires_grad=False)
            setattr(parent, name, layer.to(device))
            replaced += 1
    return replaced


def run_calibration(plan: Plan, config: dict[str, Any], warmup_steps: int, timed_steps: int) -> dict[str, Any]:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from services.trace.tracer import lora_target_modules

    notes: list[str] = []
    comparable = True
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    recipe = resolve_recipe(plan)
    _name, arch = resolve_architecture(plan)
    dtype = (
        torch.float32
        if recipe.weight_bytes == 4
        else (torch.bfloat16 if plan.precision.startswith("bf16") else torch.float16)
    )
    fields = {k: v for k, v in config.items() if k not in ("model_type", "architectures", "torch_dtype", "dtype")}
    hf_config = AutoConfig.for_model(config["model_type"], **fields)
    hf_config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    nf4 = plan.quantized == "nf4"
    # Built where it trains (random init of an 8B model takes minutes on a CPU), except an NF4 base, whose
    # 16-bit weights are quantized as each layer moves to the GPU (quantize_nf4).
    with torch.device("cpu" if nf4 else device):
        model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype)
    if plan.quantized is not None and not nf4:
        comparable = False
        notes.append(f"{plan.quantized} base is not calibrated here: ran as 16-bit LoRA (not comparable)")
    if nf4:
        missing = nf4_unavailable(cuda)
        if missing is None:
            replaced = quantize_nf4(model, dtype, double_quant=recipe.nf4_double_quant, device=device)
            notes.append(f"QLoRA: {replaced} linear layers on a 4-bit NF4 base (bitsandbytes)")
        else:
            comparable = False
            notes.append(f"QLoRA not calibrated as QLoRA: {missing}; ran as 16-bit LoRA (not comparable)")
    model = model.to(device)
    if plan.method != "full":
        from peft import LoraConfig, get_peft_model

        if nf4 and comparable:
            from peft import prepare_model_for_kbit_training

            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=plan.gradient_checkpointing)
        targets = lora_target_modules(plan, arch)
        lora = plan.lora
        model = get_peft_model(
            model,
            LoraConfig(
                r=recipe.lora_rank,
                lora_alpha=(lora.alpha if lora and lora.alpha else 2 * recipe.lora_rank),
                target_modules=targets,
                lora_dropout=recipe.lora_dropout,
            ),
            autocast_adapter_dtype=recipe.adapter_bytes == 4,
        )
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        shown = targets if isinstance(targets, str) else ", ".join(targets)
        notes.append(f"LoRA r={recipe.lora_rank} on {shown}: {trainable} trainable parameters")
    if plan.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if plan.method != "full":
            model.enable_input_require_grads()
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-5)
    ids = torch.randint(0, hf_config.vocab_size, (plan.micro_batch_size, plan.seq_len), device=device)
    # The forward under the plan's autocast (recipe.autocast: the -mixed precisions, and the Trainer's 16-bit
    # recipe, which accelerate runs under autocast too), in its compute dtype, as the estimate it calibrates.
    compute = torch.bfloat16 if plan.precision.startswith("bf16") else torch.float16

    def step() -> None:
        with torch.autocast(device.type, dtype=compute, enabled=recipe.autocast):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(warmup_steps):
        step()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(timed_steps):
        step()
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    if plan.gpus > 1:
        notes.append(f"measured on 1 GPU; the plan uses {plan.gpus}: compared with the 1-GPU prediction")
    result: dict[str, Any] = {
        "tokens_per_s": plan.micro_batch_size * plan.seq_len * timed_steps / seconds,
        "seconds": round(seconds, 3),
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "gpus": 1,
        "comparable": comparable,
        "notes": notes,
    }
    if cuda:
        result["peak_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
        result["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
    else:
        notes.append("CPU node: memory is not measured")
    return result
