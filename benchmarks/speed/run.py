"""Speed of an analytic estimate (DESIGN.md: well under 1 ms).

Measures medians over many repetitions, in several rounds, so a noisy shared machine shows as spread
rather than as a wrong number. Run: ``python -m benchmarks.speed.run`` (writes benchmarks/results/speed.json).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from services.catalog.gpus import find_gpu
from services.catalog.models import find_model
from services.estimator.architecture import architecture_from_config
from services.estimator.estimate import estimate
from services.estimator.memory import model_states, peak_memory
from services.estimator.plan import Plan
from services.estimator.recipe import resolve_recipe
from services.estimator.throughput import estimate_throughput
from services.estimator.uncertainty import memory_band

RESULTS = Path(__file__).resolve().parents[1] / "results"

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
    for _ in range(rounds):
        samples = []
        for _ in range(repeat):
            start = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - start)
        medians.append(statistics.median(samples))
    return medians


def main() -> int:
    gpu = find_gpu("A100 80GB")
    config = find_model("meta-llama/Llama-3.1-8B").config

    def core() -> None:
        # One estimate from scratch: parse the config, resolve defaults, memory, throughput on one GPU.
        arch = architecture_from_config(config)
        recipe = resolve_recipe(PLAN)
        peak_memory(PLAN, arch, recipe)
        estimate_throughput(PLAN, arch, recipe, model_states(PLAN, arch, recipe), gpu)

    def full() -> None:
        # The CLI/API answer: fit on all 16 cards and cost on every offer of the price list.
        estimate(PLAN, "A100 80GB")

    def validate() -> None:
        Plan.model_validate(PLAN.model_dump())

    def band() -> None:
        # The uncertainty band of the three counters (residual pools loaded once per process).
        for metric in ("allocated", "reserved", "device"):
            memory_band(PLAN.framework, PLAN.method, PLAN.sharding, PLAN.gpus, metric)

    rows = {}
    for name, fn, repeat in (
        ("core_estimate", core, 2000),
        ("full_estimate_with_catalog", full, 300),
        ("plan_validation", validate, 2000),
        ("uncertainty_band", band, 2000),
    ):
        fn()
        medians = _time(fn, repeat, rounds=5)
        rows[name] = {
            "median_ms": round(statistics.median(medians) * 1e3, 4),
            "min_round_median_ms": round(min(medians) * 1e3, 4),
            "max_round_median_ms": round(max(medians) * 1e3, 4),
            "repeat_per_round": repeat,
            "rounds": 5,
        }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "speed.json").write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    for name, row in rows.items():
        print(
            f"{name:28} median {row['median_ms']:.3f} ms "
            f"(rounds {row['min_round_median_ms']:.3f}-{row['max_round_median_ms']:.3f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
