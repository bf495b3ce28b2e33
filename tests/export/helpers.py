"""Plans and checks shared by the export tests (no fixtures: plain functions)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from services.estimator.estimate import resolve_architecture
from services.estimator.memory import MemoryBreakdown, peak_memory
from services.estimator.plan import Plan
from services.estimator.recipe import resolve_recipe
from services.export import ExportBundle, export_setup
from services.export.dataset import data_format
from services.export.target import FORMAT_FRAMEWORK

# SEEDS.md section 1's worked example: 10,000 examples x 512 tokens x 3 epochs.
DATA = {"examples": 10_000, "avg_tokens_per_example": 512, "epochs": 3}
LORA = {"rank": 16, "alpha": 32, "targets": "all-linear"}


def llama_plan(fmt: str, method: str, **fields: Any) -> Plan:
    """The Llama-3.1-8B plan of the brief, sized for the framework the format runs."""
    data: dict[str, Any] = {
        "model": {"name": "meta-llama/Llama-3.1-8B"},
        "method": method,
        "framework": FORMAT_FRAMEWORK[fmt],  # type: ignore[index]
        "precision": "bf16",
        "micro_batch_size": 4,
        "seq_len": 512,
        "gradient_checkpointing": True,
        "gradient_accumulation_steps": 4,
        "data": DATA,
    }
    if method != "full":
        data["lora"] = LORA
    data.update(fields)
    return Plan.model_validate(data)


def export(plan: Plan, fmt: str, **kwargs: Any) -> ExportBundle:
    options: dict[str, Any] = {"peak_gib_per_gpu": 41.5, "gpu_memory_gib": 80.0, "gpu": "H100 SXM"}
    options.update(kwargs)
    setup = options.pop("setup", None)
    return export_setup(plan, setup, fmt, **options)


def memory(plan: Plan) -> MemoryBreakdown:
    """The estimator's breakdown with the plan's architecture and framework defaults."""
    _, arch = resolve_architecture(plan)
    return peak_memory(plan, arch, resolve_recipe(plan))


def settings(plan: Plan) -> dict[str, Any]:
    """The memory-relevant settings as the estimator resolves them (None and defaults made explicit)."""
    recipe = resolve_recipe(plan)
    return {
        "method": "full" if plan.method == "full" else "adapter",
        "quantized": plan.quantized,
        "micro_batch_size": plan.micro_batch_size,
        "gradient_accumulation_steps": plan.gradient_accumulation_steps or 1,
        "seq_len": plan.seq_len,
        "precision": plan.precision,
        "optimizer": plan.optimizer,
        "gpus": plan.gpus,
        "sharding": plan.sharding,
        "cpu_offload": plan.cpu_offload,
        "gradient_checkpointing": plan.gradient_checkpointing,
        "lora_rank": recipe.lora_rank,
        # An alpha the plan leaves open is written as 2 x rank (no memory effect).
        "lora_alpha": None if plan.method == "full" else (plan.lora and plan.lora.alpha) or 2 * recipe.lora_rank,
        "lora_dropout": recipe.lora_dropout,
        "lora_targets": set(recipe.lora_targets),
    }


def write_files(files: dict[str, str], where: Path) -> Path:
    """The exported files written into ``where`` (made if missing), as `gpuplan export --out` writes them."""
    where.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (where / name).write_text(text, encoding="utf-8")
    return where


def train_module(kind: str, where: Path, name: str) -> ModuleType:
    """train.py of an hf-trainer LoRA export reading ``kind`` rows, written into ``where`` and imported as ``name``
    (its version check runs)."""
    files = export(llama_plan("hf-trainer", "lora", seq_len=16), "hf-trainer", data=data_format(kind, "test")).files
    write_files(files, where)
    sys.path.insert(0, str(where))
    try:
        spec = importlib.util.spec_from_file_location(name, where / "train.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(where))
        sys.modules.pop("check_versions", None)
    return module
