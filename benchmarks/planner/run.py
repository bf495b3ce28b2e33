"""Speed of a plan over the whole bundled catalog (DESIGN.md: under 100 ms).

Plans Llama-3.1-8B with QLoRA, LoRA and full fine-tuning (and a 70B full fine-tune, the heavier search)
over every bundled offer, from scratch each time (architecture, search, rejections and their
suggestions), and reports the median of several rounds.
Run: ``python -m benchmarks.planner.run`` (writes benchmarks/results/planner.json).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from services.catalog.offers import bundled_offers
from services.estimator.plan import Method, Plan
from services.planner import plan_setups

RESULTS = Path(__file__).resolve().parents[1] / "results"
TARGET_MS = 100.0
REPEAT = 20
ROUNDS = 5


def _plan(method: Method, model: str = "meta-llama/Llama-3.1-8B") -> Plan:
    return Plan.model_validate(
        {
            "model": {"name": model},
            "method": method,
            "micro_batch_size": 4,
            "gradient_accumulation_steps": 4,
            "seq_len": 2048,
            "data": {"examples": 10_000, "avg_tokens_per_example": 512, "epochs": 3},
        }
    )


def _round_medians(plan: Plan) -> list[float]:
    medians = []
    for _ in range(ROUNDS):
        samples = []
        for _ in range(REPEAT):
            start = time.perf_counter()
            plan_setups(plan)
            samples.append(time.perf_counter() - start)
        medians.append(statistics.median(samples))
    return medians


def main() -> int:
    cases = {
        "llama-3.1-8b_qlora": _plan("qlora"),
        "llama-3.1-8b_lora": _plan("lora"),
        "llama-3.1-8b_full": _plan("full"),
        # A heavier search: most cards need several nodes, the smallest get rejections with suggestions.
        "llama-3.1-70b_full": _plan("full", "meta-llama/Llama-3.1-70B"),
    }
    rows: dict[str, Any] = {}
    for name, plan in cases.items():
        result = plan_setups(plan)  # warm the bundled data caches (model config, GPU specs, offers)
        medians = _round_medians(plan)
        best = result.recommendations[0] if result.recommendations else None
        rows[name] = {
            "median_ms": round(statistics.median(medians) * 1e3, 3),
            "min_round_median_ms": round(min(medians) * 1e3, 3),
            "max_round_median_ms": round(max(medians) * 1e3, 3),
            "repeat_per_round": REPEAT,
            "rounds": ROUNDS,
            "offers": len(bundled_offers()),
            "candidates_evaluated": result.candidates_evaluated,
            "recommendations": len(result.recommendations),
            "rejections": len(result.rejections),
            "cheapest": None if best is None else f"{best.gpus} x {best.gpu} ({best.provider}) ${best.cost_usd:.2f}",
        }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "planner.json").write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    slowest = 0.0
    for name, row in rows.items():
        slowest = max(slowest, row["median_ms"])
        print(
            f"{name:22} median {row['median_ms']:7.2f} ms (rounds {row['min_round_median_ms']:.2f}-"
            f"{row['max_round_median_ms']:.2f}), {row['candidates_evaluated']} candidates, cheapest {row['cheapest']}"
        )
    print(f"target < {TARGET_MS:g} ms: {'met' if slowest < TARGET_MS else 'MISSED'}")
    return 0 if slowest < TARGET_MS else 1


if __name__ == "__main__":
    sys.exit(main())
