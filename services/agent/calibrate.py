"""A calibration run: a short real training of the plan's model (random weights from its config) with the
plan's method, precision, batch and sequence length: N warm-up steps, then M timed ones.

On a GPU it measures tokens/s and the CUDA allocator's peak allocated/reserved memory; on a CPU-only node
(a tiny model in CI) it measures tokens/s only. Needs the trace extra (torch, transformers, peft).
"""

from __future__ import annotations

import time
from typing import Any

from services.estimator.plan import Plan
from services.estimator.recipe import resolve_recipe


def run_calibration(plan: Plan, config: dict[str, Any], warmup_steps: int, timed_steps: int) -> dict[str, Any]:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    notes: list[str] = []
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    recipe = resolve_recipe(plan)
    dtype = (
        torch.float32
        if recipe.weight_bytes == 4
        else (torch.bfloat16 if plan.precision.startswith("bf16") else torch.float16)
    )
    fields = {k: v for k, v in config.items() if k not in ("model_type", "architectures", "torch_dtype", "dtype")}
    hf_config = AutoConfig.for_model(config["model_type"], **fields)
    hf_config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype).to(device)
    if plan.method != "full":
        from peft import LoraConfig, get_peft_model

        if plan.quantized is not None:
            notes.append(f"{plan.quantized} base run as 16-bit LoRA (no bitsandbytes kernels on this node)")
        targets = "all-linear" if plan.lora is None or plan.lora.targets == "all-linear" else None
        model = get_peft_model(
            model,
            LoraConfig(r=recipe.lora_rank, target_modules=targets or "all-linear", lora_dropout=recipe.lora_dropout),
        )
    if plan.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if plan.method != "full":
            model.enable_input_require_grads()
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-5)
    ids = torch.randint(0, hf_config.vocab_size, (plan.micro_batch_size, plan.seq_len), device=device)

    def step() -> None:
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
    result: dict[str, Any] = {
        "tokens_per_s": plan.micro_batch_size * plan.seq_len * timed_steps / seconds,
        "seconds": round(seconds, 3),
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "notes": notes,
    }
    if cuda:
        result["peak_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
        result["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
    else:
        notes.append("CPU node: memory is not measured")
    return result
