"""A deterministic sweep of training plans the trace can run: small bundled models cut to a few layers.

The trace (services/trace/tracer.py) runs the real transformers/PEFT code, so it is a prediction that
needs no published case. Each config takes a bundled catalog model (services/catalog/data/models) cut to
2 or 4 of its layers (every other width as published: the per-layer mechanisms are the same at any depth,
and fake tensors cost per op, not per byte) and one combination of method, precision, framework,
sequence length, micro-batch, checkpointing and LoRA shape, drawn with a fixed seed.

What the trace cannot express, so the sweep leaves it out: bitsandbytes 4-bit bases and 8-bit optimizers
(CUDA kernels; QLoRA is traced as LoRA on a 16-bit base plus the analytic quantization difference, so a
QLoRA config checks only the 16-bit part), sharding and several GPUs (one process, no collectives),
flash-attention kernels (SDPA's CPU kernel is traced), fp16 (CPU autocast is bf16), torch.compile and
activation offloading.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

# Small bundled models, by family (model_type), that the CPU trace builds with AutoModelForCausalLM.
MODELS: tuple[str, ...] = (
    "meta-llama/Llama-3.2-1B",
    "meta-llama/Llama-3.2-3B",
    "meta-llama/Llama-3.1-8B",
    "TinyLlama/TinyLlama-1.1B-Chat-v1.0",
    "HuggingFaceTB/SmolLM2-135M",
    "HuggingFaceTB/SmolLM2-1.7B",
    "Qwen/Qwen2.5-0.5B",
    "Qwen/Qwen2.5-1.5B-Instruct",
    "Qwen/Qwen2.5-7B",
    "Qwen/Qwen3-0.6B",
    "Qwen/Qwen3-1.7B",
    "Qwen/Qwen3-8B",
    "mistralai/Mistral-7B-v0.1",
    "google/gemma-2b",
    "google/gemma-2-2b",
    "microsoft/Phi-3-mini-4k-instruct",
    "microsoft/Phi-4-mini-instruct",
    "allenai/OLMoE-1B-7B-0924",
)
METHODS = ("full", "lora", "qlora")
PRECISIONS = ("bf16", "bf16-mixed", "fp32")
FRAMEWORKS = ("hf-trainer", "pytorch")
SEQ_LENS = (256, 512, 1024, 2048, 4096)
MICRO_BATCHES = (1, 2, 3, 4)
LAYERS = (2, 4)
LORA_RANKS = (8, 16, 64)
LORA_TARGETS: tuple[list[str] | str, ...] = ("all-linear", ["q", "v"], ["q", "k", "v", "o"])
PER_MODEL = 12
SEED = 26_7


@dataclass(frozen=True)
class SweepConfig:
    id: str
    model: str
    layers: int
    plan: dict[str, Any]  # Plan fields, the model given by name; the runner puts in the cut config


def _draw(rng: random.Random, model: str, index: int) -> SweepConfig:
    method = rng.choice(METHODS)
    precision = "bf16" if method == "qlora" else rng.choice(PRECISIONS)
    plan: dict[str, Any] = {
        "method": method,
        "framework": rng.choice(FRAMEWORKS),
        "precision": precision,
        "seq_len": rng.choice(SEQ_LENS),
        "micro_batch_size": rng.choice(MICRO_BATCHES),
        "gradient_checkpointing": rng.random() < 0.5,
    }
    if method != "full":
        plan["lora"] = {"rank": rng.choice(LORA_RANKS), "targets": rng.choice(LORA_TARGETS)}
    layers = rng.choice(LAYERS)
    short = model.split("/")[-1].lower()
    return SweepConfig(f"{short}-{index:02d}", model, layers, plan)


def sweep_configs(models: tuple[str, ...] = MODELS, per_model: int = PER_MODEL, seed: int = SEED) -> list[SweepConfig]:
    """``per_model`` configs for each model, the same ones on every call (one seeded generator per model)."""
    out: list[SweepConfig] = []
    for model in models:
        rng = random.Random(f"{seed}:{model}")
        out.extend(_draw(rng, model, i) for i in range(per_model))
    return out
