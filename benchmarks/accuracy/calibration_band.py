"""The limits a calibration result must respect before it may replace a utilisation prior.

Two figures, both from the published runs that measured tokens/s (benchmarks/accuracy/cases.jsonl):

- the tokens/s residuals ln(measured / predicted) of the medium- and high-confidence cases: the
  estimator's own throughput error, from which services/nodes/calibration.py takes the 80% band with
  services/estimator/uncertainty.py's prediction interval; one result never moves an estimate further;
- the GEMM utilisation each of those runs reproduces (services.estimator.estimate.utilisation_reproducing)
  over its GPU class's prior, for every case: the slowest real run bounds what a plausible result can be.

Writes services/nodes/data/calibration_band.json. Run: ``python -m benchmarks.accuracy.calibration_band``.
Re-run it when the priors or the throughput model change (the ratios are to today's priors).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from benchmarks.accuracy.run import evaluate_case, load_cases
from services.catalog.gpus import find_gpu
from services.estimator.errors import EstimatorError
from services.estimator.estimate import utilisation_reproducing
from services.estimator.plan import Plan
from services.estimator.throughput import UTILISATION_PRIOR

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "services" / "nodes" / "data" / "calibration_band.json"


def per_gpu_rate(case: dict[str, Any], plan: Plan) -> float | None:
    """The case's measured tokens/s per GPU, where its scope says which (as the accuracy run compares)."""
    measured = case["measured"]
    rate, scope = measured.get("tokens_per_s"), measured.get("tokens_per_s_scope")
    if not rate:
        return None
    if scope == "per_gpu" or (scope == "unknown" and plan.gpus == 1):
        return float(rate)
    if scope == "total":
        return float(rate) / plan.gpus
    return None


def build(cases: list[dict[str, Any]]) -> dict[str, Any]:
    residuals: list[float] = []
    ratios: list[dict[str, Any]] = []
    for case in cases:
        result = evaluate_case(case)
        if result.confidence in ("medium", "high") and result.measured_tokens_per_s and result.predicted_tokens_per_s:
            residuals.append(math.log(result.measured_tokens_per_s / result.predicted_tokens_per_s))
        try:
            plan = Plan.model_validate(case["plan"])
            spec = find_gpu(case["gpu"])
        except (EstimatorError, ValueError):
            continue
        rate = per_gpu_rate(case, plan)
        reproduced = utilisation_reproducing(plan, spec, rate) if rate else None
        if reproduced is None or not reproduced[1]:
            continue  # no utilisation up to 1 meets it: says nothing about how slow a real run can be
        prior = UTILISATION_PRIOR[spec.gpu_class]
        ratios.append(
            {"id": case["id"], "gpu_class": spec.gpu_class, "ratio_to_prior": round(reproduced[0] / prior, 4)}
        )
    ratios.sort(key=lambda r: float(r["ratio_to_prior"]))
    return {
        "schema_version": 1,
        "source": "python -m benchmarks.accuracy.calibration_band over benchmarks/accuracy/cases.jsonl",
        "tokens_per_s_log_residuals": [round(r, 5) for r in sorted(residuals)],
        "utilisation_ratios": ratios,
    }


def main() -> None:
    table = build(load_cases())
    TABLE.parent.mkdir(parents=True, exist_ok=True)
    TABLE.write_text(json.dumps(table, indent=1) + "\n", encoding="utf-8")
    lowest = table["utilisation_ratios"][0]
    print(
        f"{len(table['tokens_per_s_log_residuals'])} tokens/s residuals; {len(table['utilisation_ratios'])} runs, "
        f"the slowest at {lowest['ratio_to_prior']} x its prior ({lowest['id']}); wrote {TABLE.relative_to(ROOT)}"
    )


if __name__ == "__main__":
    main()
