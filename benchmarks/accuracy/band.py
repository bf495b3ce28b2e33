"""Residual tables for the estimator's uncertainty band, and the band's coverage.

For every medium- or high-confidence case with a measured peak, the residual ln(measured / predicted)
on the counter the case measured goes into its category (framework x method x sharding x metric). The
table is written to services/estimator/data/residuals.json, which the estimator reads once
(services/estimator/uncertainty.py). Low-confidence cases are left out of the table: their plans are
guesses (their notes say which settings are inferred), so their residuals measure the guess.

Coverage is the share of measured peaks inside the band [p10, p90]. In-sample, the band was built from
the same residuals; leave-one-out rebuilds the table without the case before banding it, which is the
figure to expect on cases gpuplan has not seen. Both are reported, for the medium+high cases and for all;
``python -m benchmarks.accuracy.heldout`` rebuilds it without each case's whole source (leave-one-source-out).
A residual is on the counter the case read (services/estimator/counters.py; a source that names no counter
is read as max_memory_reserved). Cases marked ``derived`` (not measurements) are left out.

Run: ``python -m benchmarks.accuracy.band`` (writes the table and benchmarks/results/band.json).
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.accuracy.run import CaseResult, evaluate_case, load_cases
from services.estimator.uncertainty import Key, band_from_pools, build_pools, category

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "services" / "estimator" / "data" / "residuals.json"
RESULTS = ROOT / "benchmarks" / "results"


@dataclass(frozen=True)
class Banded:
    id: str
    confidence: str
    category: str
    measured_gib: float
    predicted_gib: float
    in_sample: tuple[float, float]
    leave_one_out: tuple[float, float]

    @property
    def inside_in_sample(self) -> bool:
        return self.in_sample[0] <= self.measured_gib <= self.in_sample[1]

    @property
    def inside_leave_one_out(self) -> bool:
        return self.leave_one_out[0] <= self.measured_gib <= self.leave_one_out[1]


def case_category(case: dict[str, Any]) -> Key:
    plan = case["plan"]
    return category(
        plan.get("framework", "hf-trainer"),
        plan.get("method", "full"),
        plan.get("sharding", "none"),
        int(plan.get("gpus", 1)),
        case["measured"]["metric"],
        plan.get("mode", "train"),
    )


def residual(result: CaseResult) -> float | None:
    if result.measured_gib is None or result.predicted_gib is None or result.predicted_gib <= 0:
        return None
    return math.log(result.measured_gib / result.predicted_gib)


def residual_table(pairs: list[tuple[dict[str, Any], CaseResult]]) -> dict[Key, list[float]]:
    table: dict[Key, list[float]] = {}
    for case, result in pairs:
        value = residual(result)
        if value is None or case["confidence"] not in ("medium", "high") or case.get("derived"):
            continue
        table.setdefault(case_category(case), []).append(value)
    return table


def table_json(table: dict[Key, list[float]]) -> dict[str, Any]:
    rows = [
        {
            "framework": key[0],
            "method": key[1],
            "sharding": key[2],
            "metric": key[3],
            "log_residuals": [round(v, 5) for v in sorted(values)],
        }
        for key, values in sorted(table.items())
    ]
    return {
        "schema_version": 1,
        "source": "python -m benchmarks.accuracy.band over benchmarks/accuracy/cases.jsonl "
        "(medium + high confidence cases with a measured peak); residual = ln(measured / predicted)",
        "categories": rows,
    }


def band_cases(pairs: list[tuple[dict[str, Any], CaseResult]]) -> list[Banded]:
    table = residual_table(pairs)
    pools = build_pools(table)
    out = []
    for case, result in pairs:
        value = residual(result)
        if value is None or result.predicted_gib is None or result.measured_gib is None or case.get("derived"):
            continue
        key = case_category(case)
        band = band_from_pools(pools, key)
        without = {k: list(v) for k, v in table.items()}
        if case["confidence"] in ("medium", "high"):
            without[key].remove(value)
            if not without[key]:
                del without[key]
        loo = band_from_pools(build_pools(without), key)
        out.append(
            Banded(
                id=case["id"],
                confidence=case["confidence"],
                category=band.category,
                measured_gib=result.measured_gib,
                predicted_gib=result.predicted_gib,
                in_sample=band.interval(result.predicted_gib),
                leave_one_out=loo.interval(result.predicted_gib),
            )
        )
    return out


def coverage(rows: list[Banded]) -> dict[str, float | int]:
    n = len(rows)
    return {
        "cases": n,
        "in_sample_pct": round(100 * sum(r.inside_in_sample for r in rows) / n, 1) if n else math.nan,
        "leave_one_out_pct": round(100 * sum(r.inside_leave_one_out for r in rows) / n, 1) if n else math.nan,
        "below_p10_leave_one_out": sum(r.measured_gib < r.leave_one_out[0] for r in rows),
        "above_p90_leave_one_out": sum(r.measured_gib > r.leave_one_out[1] for r in rows),
    }


def main(argv: list[str] | None = None) -> int:
    cases = load_cases()
    pairs = [(c, evaluate_case(c)) for c in cases]
    table = residual_table(pairs)
    TABLE.parent.mkdir(parents=True, exist_ok=True)
    TABLE.write_text(json.dumps(table_json(table), indent=1) + "\n", encoding="utf-8")
    rows = band_cases(pairs)
    summary = {
        "medium_high": coverage([r for r in rows if r.confidence in ("medium", "high")]),
        "all": coverage(rows),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "band.json").write_text(
        json.dumps({"coverage": summary, "cases": [asdict(r) for r in rows]}, indent=1) + "\n", encoding="utf-8"
    )
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
