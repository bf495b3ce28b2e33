"""Speed of an analytic estimate (DESIGN.md: well under 1 ms), beside llm-analysis's ``training()``.

Measures the CPU time of each call (``time.process_time``: another process on the shared machine does not
count), medians over many repetitions in several rounds, so noise shows as spread rather than as a wrong
number. llm-analysis (cli99/llm-analysis, the estimator of STYLE.md) runs in the same process when it is
importable: it is no dependency of gpuplan; install it apart, e.g. ``pip install --target /tmp/llma
llm-analysis==0.2.2``, and name the folder in GPUPLAN_LLM_ANALYSIS_PATH (default /tmp/llma); without it
the row says it was skipped. Run: ``python -m benchmarks.speed.run`` (writes benchmarks/results/speed.json).
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from services.catalog.gpus import find_gpu
from services.catalog.models import find_model
from services.estimator.architecture import architecture_from_config
from services.estimator.estimate import estimate
from services.estimator.memory import peak_memory
from services.estimator.plan import Plan
from services.estimator.recipe import resolve_recipe
from services.estimator.resolved import resolve_plan
from services.estimator.throughput import estimate_throughput
from services.estimator.uncertainty import memory_band

RESULTS = Path(__file__).resolve().parents[1] / "results"
LLM_ANALYSIS_PATH = os.environ.get("GPUPLAN_LLM_ANALYSIS_PATH", "/tmp/llma")

PLAN = Plan.model_validate(
    {
        "model": {"name": "meta-llama/Llama-3.1-8B"},
        "method": "qlora",
        "lora": {"rank": 16, "targets": "all-linear"},
        "micro_batch_size": 4,
        "seq_len": 2048,
        "gradient_checkpointing": True,
        "data": {"tokens": 50_000_000, "epochs": 3},
    }
)


def _time(fn: Callable[[], object], repeat: int, rounds: int) -> list[float]:
    medians = []
    clock = time.process_time
    for _ in range(rounds):
        samples = []
        for _ in range(repeat):
            start = clock()
            fn()
            samples.append(clock() - start)
        medians.append(statistics.median(samples))
    return medians


def llm_analysis_training() -> tuple[Callable[[], object] | None, str]:
    """llm-analysis 0.2.2's ``training()`` on the same model, batch and sequence (its configs built once, as
    the resolved plan is), or None and why it is skipped. llm-analysis models full training only (no LoRA,
    no quantization): it runs Llama-3.1-8B's shape with ZeRO-3 on 8 GPUs, full activation checkpointing."""
    if LLM_ANALYSIS_PATH not in sys.path:
        sys.path.append(LLM_ANALYSIS_PATH)  # last: gpuplan's own packages win over llm-analysis's pins
    try:
        from llm_analysis.analysis import ActivationRecomputation, DSZeRO, LLMAnalysis  # type: ignore[import-not-found]
        from llm_analysis.config import DtypeConfig, ModelConfig, ParallelismConfig, get_gpu_config_by_name  # type: ignore[import-not-found]
        from llm_analysis.logger import logger  # type: ignore[import-not-found]
    except ImportError as missing:
        return None, f"skipped: llm-analysis is not importable ({missing}); see this module's docstring"
    logger.setLevel(logging.ERROR)  # it logs every step at INFO
    c = find_model("meta-llama/Llama-3.1-8B").config
    model = ModelConfig(
        name="llama-3.1-8b",
        num_layers=c["num_hidden_layers"],
        n_head=c["num_attention_heads"],
        hidden_dim=c["hidden_size"],
        vocab_size=c["vocab_size"],
        max_seq_len=c["max_position_embeddings"],
        num_key_value_heads=c["num_key_value_heads"],
        ffn_embed_dim=c["intermediate_size"],
        # Given with ffn_embed_dim: llm-analysis asserts the FFN width divides by the hidden size otherwise.
        expansion_ratio=c["intermediate_size"] / c["hidden_size"],
        model_type="llama",
    )
    gpu = get_gpu_config_by_name("a100-sxm-80gb")
    dtype, parallel = DtypeConfig(), ParallelismConfig(dp_size=8)

    def run() -> object:
        analysis = LLMAnalysis(model, gpu, dtype, parallel, flops_efficiency=0.5, hbm_memory_efficiency=0.9)
        return analysis.training(
            batch_size_per_gpu=PLAN.micro_batch_size,
            seq_len=PLAN.seq_len,
            gradient_accumulation_steps=1,
            total_num_tokens=50_000_000,
            activation_recomputation=ActivationRecomputation.FULL,
            ds_zero=DSZeRO.STAGE_3,
            mlp_gated_linear_units=True,
        )

    import llm_analysis  # type: ignore[import-not-found]

    return run, f"llm-analysis {getattr(llm_analysis, '__version__', '0.2.2')} from {LLM_ANALYSIS_PATH}"


def main() -> int:
    gpu = find_gpu("A100 80GB")
    config = find_model("meta-llama/Llama-3.1-8B").config

    def core() -> None:
        # One estimate from scratch: parse the config, resolve defaults, memory, throughput on one GPU.
        arch = architecture_from_config(config)
        recipe = resolve_recipe(PLAN)
        states = peak_memory(PLAN, arch, recipe).states
        estimate_throughput(PLAN, arch, recipe, states, gpu)

    resolved = resolve_plan(PLAN)

    def core_resolved() -> None:
        # The same from the plan resolved once (architecture and recipe), as the API, the planner and the
        # tasks hand it down; what llm-analysis's training() does on its configs.
        plan, arch, recipe = resolved.plan, resolved.architecture, resolved.recipe
        states = peak_memory(plan, arch, recipe).states
        estimate_throughput(plan, arch, recipe, states, gpu)

    def full() -> None:
        # The CLI/API answer: fit on all 16 cards and cost on every offer of the price list.
        estimate(PLAN, "A100 80GB")

    def validate() -> None:
        Plan.model_validate(PLAN.model_dump())

    def band() -> None:
        # The uncertainty band of the three counters (residual pools loaded once per process).
        for metric in ("allocated", "reserved", "device"):
            memory_band(PLAN.framework, PLAN.method, PLAN.sharding, PLAN.gpus, metric)

    reference, reference_note = llm_analysis_training()
    cases: list[tuple[str, Callable[[], object], int]] = [
        ("core_estimate", core, 2000),
        ("core_estimate_resolved", core_resolved, 2000),
        ("full_estimate_with_catalog", full, 300),
        ("plan_validation", validate, 2000),
        ("uncertainty_band", band, 2000),
    ]
    if reference is not None:
        cases.insert(2, ("llm_analysis_training", reference, 2000))
    rows: dict[str, Any] = {}
    for name, fn, repeat in cases:
        fn()
        medians = _time(fn, repeat, rounds=5)
        rows[name] = {
            "median_ms": round(statistics.median(medians) * 1e3, 4),
            "min_round_median_ms": round(min(medians) * 1e3, 4),
            "max_round_median_ms": round(max(medians) * 1e3, 4),
            "repeat_per_round": repeat,
            "rounds": 5,
        }
    rows["clock"] = "time.process_time per call (CPU time of this process)"
    rows["llm_analysis"] = reference_note
    if reference is not None:
        theirs = rows["llm_analysis_training"]["median_ms"]
        rows["llm_analysis_over_core_estimate"] = round(theirs / rows["core_estimate"]["median_ms"], 2)
        rows["llm_analysis_over_core_estimate_resolved"] = round(
            theirs / rows["core_estimate_resolved"]["median_ms"], 2
        )
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "speed.json").write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    for name, row in rows.items():
        if not isinstance(row, dict):
            print(f"{name:28} {row}")
            continue
        print(
            f"{name:28} median {row['median_ms']:.3f} ms "
            f"(rounds {row['min_round_median_ms']:.3f}-{row['max_round_median_ms']:.3f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
