"""Accuracy of the estimator against published, measured fine-tuning runs.

Each case in ``cases.jsonl`` (a copy of shared/benchmarks/memory_cases.jsonl; every row keeps its
``source`` and ``locator``) is a plan plus what its source measured. One memory contract
(services/estimator/counters.py): the measured peak is compared with the counter it was read from
(``allocated`` with max_memory_allocated, ``reserved`` with max_memory_reserved, ``device`` with
nvidia-smi; ``unknown``, a source that does not say, with reserved, always), and separately with the fit
bytes, the device peak the fit check and the planner decide on.

The numbers are in-sample: the estimator's mechanisms were written and checked while looking at these
cases, so they overstate the accuracy on runs gpuplan has never seen; ``python -m
benchmarks.accuracy.heldout`` gives the leave-one-source-out figures beside them. Cases marked
``derived`` (figures a source extrapolated, not measured) are reported on their own and kept out of every
other set. The report gives every measured case ("all"), the medium+high confidence subset, the
low-confidence rest, each source on its own, and the same numbers over the cases exactly as published in
shared/benchmarks/memory_cases.jsonl.

Run: ``python -m benchmarks.accuracy.run`` (writes benchmarks/results/accuracy.{md,json}).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from services.catalog.gpus import find_gpu
from services.estimator.counters import UNNAMED_COUNTER, memory_counters
from services.estimator.errors import EstimatorError
from services.estimator.estimate import estimate
from services.estimator.fit import fits_card, headroom_ratio
from services.estimator.memory import GIB
from services.estimator.plan import Plan
from services.estimator.uncertainty import Key, Pool
from services.planner.constraints import Constraints

HERE = Path(__file__).resolve().parent
CASES = HERE / "cases.jsonl"
RESULTS = HERE.parent / "results"
ROOT = HERE.parents[1]


def published_cases_path() -> Path | None:
    """shared/benchmarks/memory_cases.jsonl, the cases as their collector published them (the project
    copy may add plan fields their notes state); GPUPLAN_SHARED_DIR names the shared folder."""
    env = os.environ.get("GPUPLAN_SHARED_DIR")
    candidates = [Path(env)] if env else []
    candidates += [ROOT / "shared", ROOT.parent / "shared", ROOT.parent.parent / "shared"]
    for folder in candidates:
        path = folder / "benchmarks" / "memory_cases.jsonl"
        if path.is_file():
            return path
    return None


@dataclass(frozen=True)
class CaseResult:
    id: str
    source: str
    confidence: str
    gpu: str
    metric: str
    measured_gib: float | None
    predicted_gib: float | None
    error_pct: float | None  # signed, (predicted - measured) / measured
    measured_oom: bool
    card_gib: float | None
    predicted_fits: bool | None
    measured_tokens_per_s: float | None
    predicted_tokens_per_s: float | None
    tokens_error_pct: float | None
    note: str
    refused: bool = False
    scored_counter: str = ""  # the counter predicted_gib is: the measured metric, reserved for unknown
    fit_gib: float | None = None  # the device peak the fit check and the planner decide on
    fit_error_pct: float | None = None  # signed, (fit_gib - measured) / measured
    planner_refuses: bool | None = None  # the planner refuses the card (services.estimator.fit.fits_card)
    headroom_ratio: float | None = None  # what the planner multiplies fit_gib by (bundled residual table)
    low_confidence_estimate: bool = False  # the estimate's own confidence (generic architecture)
    derived: bool = False


# The planner's default extra margin on top of its headroom ratio (services.estimator.fit.fits_card).
PLANNER_SAFETY_MARGIN = Constraints().safety_margin


def planner_refuses(
    plan: Plan, fit_gib: float, card_gib: float, low_confidence: bool, pools: dict[Key, Pool] | None = None
) -> bool:
    """Whether the planner's own fit rule refuses the case's setup on its card (``pools``: a residual table to
    size on instead of the bundled one, for held-out scoring)."""
    ratio = headroom_ratio(plan.framework, plan.method, plan.sharding, plan.gpus, plan.mode, low_confidence, pools)
    return not fits_card(fit_gib * GIB, ratio, card_gib, PLANNER_SAFETY_MARGIN)


def _card(label: str) -> tuple[str | None, float | None]:
    """The catalog GPU behind a case's label and the card's memory (GiB) for the fit check."""
    try:
        spec = find_gpu(label)
        return spec.name, spec.memory_gib
    except EstimatorError:
        match = re.search(r"(\d+)\s*GB", label)
        return None, float(match.group(1)) if match else None


def refused_result(case: dict[str, Any], reason: str) -> CaseResult:
    """A case the estimator refused: it counts as refused and has no errors."""
    measured = case["measured"]
    return CaseResult(
        id=case["id"],
        source=case["source"],
        confidence=case["confidence"],
        gpu=case["gpu"],
        metric=measured["metric"],
        measured_gib=measured["peak_gib"],
        predicted_gib=None,
        error_pct=None,
        measured_oom=bool(measured["oom"]),
        card_gib=_card(case["gpu"])[1],
        predicted_fits=None,
        measured_tokens_per_s=measured.get("tokens_per_s"),
        predicted_tokens_per_s=None,
        tokens_error_pct=None,
        note=f"refused: {reason}",
        refused=True,
        derived=bool(case.get("derived")),
    )


def evaluate_case(case: dict[str, Any]) -> CaseResult:
    measured = case["measured"]
    plan = Plan.model_validate(case["plan"])
    gpu_name, card_gib = _card(case["gpu"])
    try:
        result = estimate(plan, gpu_name)
    except EstimatorError as exc:
        return refused_result(case, str(exc))
    counters = memory_counters(result.memory)
    metric = measured["metric"]
    predicted = counters.counter(metric)
    peak = measured["peak_gib"]
    error = None if peak is None else (predicted - peak) / peak * 100
    fit_error = None if peak is None else (counters.fit_gib - peak) / peak * 100
    low = result.confidence == "low"
    ratio = headroom_ratio(plan.framework, plan.method, plan.sharding, plan.gpus, plan.mode, low)
    # The estimate's own fit on the card (FitReport.fits: the same rule as the planner's, without its margin).
    fits = None if card_gib is None else fits_card(counters.fit_gib * GIB, ratio, card_gib)
    refuses = None if card_gib is None else planner_refuses(plan, counters.fit_gib, card_gib, low)

    tps_measured = measured.get("tokens_per_s")
    scope = measured.get("tokens_per_s_scope")
    tps_pred = tps_err = None
    note = ""
    if tps_measured and result.throughput is not None:
        if scope == "per_gpu" or (scope == "unknown" and plan.gpus == 1):
            tps_pred = result.throughput.tokens_per_s_per_gpu
        elif scope == "total":
            tps_pred = result.throughput.tokens_per_s
        else:
            note = "tokens/s scope unknown on several GPUs: not compared"
        if tps_pred is not None:
            tps_err = (tps_pred - tps_measured) / tps_measured * 100
    elif tps_measured:
        note = f"no specs for GPU {case['gpu']!r}: tokens/s not compared"
    return CaseResult(
        id=case["id"],
        source=case["source"],
        confidence=case["confidence"],
        gpu=case["gpu"],
        metric=metric,
        measured_gib=peak,
        predicted_gib=predicted,
        error_pct=error,
        measured_oom=bool(measured["oom"]),
        card_gib=card_gib,
        predicted_fits=fits,
        measured_tokens_per_s=tps_measured,
        predicted_tokens_per_s=tps_pred,
        tokens_error_pct=tps_err,
        note=note,
        scored_counter=UNNAMED_COUNTER if metric == "unknown" else metric,
        fit_gib=counters.fit_gib,
        fit_error_pct=fit_error,
        planner_refuses=refuses,
        headroom_ratio=round(ratio, 4),
        low_confidence_estimate=low,
        derived=bool(case.get("derived")),
    )


def load_cases(path: Path = CASES) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


@dataclass(frozen=True)
class Summary:
    cases: int
    memory_cases: int
    median_abs_error_pct: float
    p90_abs_error_pct: float
    ooms: int
    ooms_flagged: int
    ran_but_predicted_not_to_fit: list[str]
    tokens_cases: int
    tokens_median_abs_error_pct: float
    refused: int = 0
    # The same peaks against the fit bytes (the device peak the fit check and the planner decide on).
    fit_median_abs_error_pct: float = float("nan")
    fit_p90_abs_error_pct: float = float("nan")


def summarize(results: list[CaseResult]) -> Summary:
    errors = [abs(r.error_pct) for r in results if r.error_pct is not None]
    fit_errors = [abs(r.fit_error_pct) for r in results if r.fit_error_pct is not None]
    tokens = [abs(r.tokens_error_pct) for r in results if r.tokens_error_pct is not None]
    ooms = [r for r in results if r.measured_oom and not r.refused]
    false_ooms = [r.id for r in results if not r.measured_oom and r.predicted_fits is False]
    return Summary(
        cases=len(results),
        memory_cases=len(errors),
        median_abs_error_pct=statistics.median(errors) if errors else float("nan"),
        p90_abs_error_pct=_percentile(errors, 0.9),
        ooms=len(ooms),
        ooms_flagged=sum(1 for r in ooms if r.predicted_fits is False),
        ran_but_predicted_not_to_fit=false_ooms,
        tokens_cases=len(tokens),
        tokens_median_abs_error_pct=statistics.median(tokens) if tokens else float("nan"),
        refused=sum(1 for r in results if r.refused),
        fit_median_abs_error_pct=statistics.median(fit_errors) if fit_errors else float("nan"),
        fit_p90_abs_error_pct=_percentile(fit_errors, 0.9),
    )


def evaluate_all(cases: list[dict[str, Any]] | None = None) -> dict[str, list[CaseResult]]:
    """Results split into the headline set (medium + high confidence), the low-confidence set and the
    derived rows (a source's extrapolation, not a measurement), which no other set includes."""
    results = [evaluate_case(c) for c in (cases if cases is not None else load_cases())]
    measured = [r for r in results if not r.derived]
    return {
        "medium_high": [r for r in measured if r.confidence in ("medium", "high")],
        "low": [r for r in measured if r.confidence == "low"],
        "derived": [r for r in results if r.derived],
    }


def by_source(results: list[CaseResult]) -> dict[str, list[CaseResult]]:
    out: dict[str, list[CaseResult]] = {}
    for r in results:
        out.setdefault(r.source, []).append(r)
    return dict(sorted(out.items()))


def summaries(groups: dict[str, list[CaseResult]], published: list[CaseResult] | None) -> dict[str, Summary]:
    """Headline, low, all cases, and all / medium+high over the cases as published."""
    every = groups["medium_high"] + groups["low"]
    out = {"all": summarize(every), "medium_high": summarize(groups["medium_high"]), "low": summarize(groups["low"])}
    if groups.get("derived"):
        out["derived"] = summarize(groups["derived"])
    if published is not None:
        out["published_all"] = summarize(published)
        out["published_medium_high"] = summarize([r for r in published if r.confidence in ("medium", "high")])
    return out


def _fmt(value: float | None, digits: int = 1) -> str:
    return "" if value is None else f"{value:.{digits}f}"


SET_LABELS = {
    "all": "all cases (every measured peak)",
    "medium_high": "medium + high confidence",
    "low": "low confidence",
    "derived": "derived rows (not measurements; in no other set)",
    "published_all": "all cases, as published (shared)",
    "published_medium_high": "medium + high, as published (shared)",
}


def _summary_row(label: str, s: Summary) -> str:
    return (
        f"| {label} | {s.memory_cases} | {s.median_abs_error_pct:.1f}% | {s.p90_abs_error_pct:.1f}% | "
        f"{s.fit_median_abs_error_pct:.1f}% | {s.fit_p90_abs_error_pct:.1f}% | "
        f"{s.ooms_flagged}/{s.ooms} | {len(s.ran_but_predicted_not_to_fit)} | {s.tokens_cases} | "
        + (f"{s.tokens_median_abs_error_pct:.1f}% |" if s.tokens_cases else "n/a |")
        + f" {s.refused} |"
    )


_HEADER = [
    "| set | memory cases | memory median abs err | memory p90 abs err | fit bytes median abs err "
    "| fit bytes p90 abs err | OOMs flagged | ran but predicted OOM | tokens/s cases | tokens/s median abs err "
    "| refused |",
    "|---|---|---|---|---|---|---|---|---|---|---|",
]


def summary_table(sums: dict[str, Summary]) -> str:
    return "\n".join(_HEADER + [_summary_row(SET_LABELS[name], s) for name, s in sums.items()])


def source_table(results: list[CaseResult]) -> str:
    return "\n".join(_HEADER + [_summary_row(src, summarize(rs)) for src, rs in by_source(results).items()])


IN_SAMPLE_NOTE = (
    "These numbers are in-sample: the estimator's mechanisms were written while looking at these cases, so "
    "expect larger errors on runs unlike them; `python -m benchmarks.accuracy.heldout` gives the "
    "leave-one-source-out figures beside them. Each measured peak is compared with the counter it was read "
    "from (a source that names none: max_memory_reserved). 'memory cases' counts cases with a measured "
    "peak; OOM rows count in the OOM column only. 'As published' evaluates shared/benchmarks/memory_cases.jsonl "
    "unchanged."
)


def report(groups: dict[str, list[CaseResult]], published: list[CaseResult] | None = None) -> str:
    sums = summaries(groups, published)
    out = ["# Estimator accuracy on the public measured cases", "", IN_SAMPLE_NOTE, "", summary_table(sums), ""]
    if published is None:
        out += ["(shared/benchmarks/memory_cases.jsonl not found: the as-published rows are missing)", ""]
    out += ["## Per source (all cases)", "", source_table(groups["medium_high"] + groups["low"]), ""]
    for name, label in (
        ("medium_high", "Medium + high confidence"),
        ("low", "Low confidence"),
        ("derived", "Derived rows (not measurements)"),
    ):
        out += [
            f"## {label}",
            "",
            "| case | gpu | metric | measured GiB | predicted GiB | error | fit bytes GiB | fit bytes error | OOM "
            "| fits | tok/s measured | tok/s predicted | tok/s error | note |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in groups.get(name, []):
            fits = "" if r.predicted_fits is None else r.predicted_fits
            out.append(
                f"| {r.id} | {r.gpu} | {r.metric} | {_fmt(r.measured_gib, 2)} | {_fmt(r.predicted_gib, 2)} | "
                f"{_fmt(r.error_pct)}% | {_fmt(r.fit_gib, 2)} | {_fmt(r.fit_error_pct)}% | "
                f"{'yes' if r.measured_oom else ''} | {fits} | "
                f"{_fmt(r.measured_tokens_per_s, 0)} | {_fmt(r.predicted_tokens_per_s, 0)} | "
                f"{_fmt(r.tokens_error_pct)} | {r.note} |"
            )
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    groups = evaluate_all()
    path = published_cases_path()
    published = [evaluate_case(c) for c in load_cases(path)] if path is not None else None
    RESULTS.mkdir(parents=True, exist_ok=True)
    text = report(groups, published)
    (RESULTS / "accuracy.md").write_text(text + "\n", encoding="utf-8")
    every = groups["medium_high"] + groups["low"]
    data = {
        "in_sample": True,
        "summary": {k: asdict(v) for k, v in summaries(groups, published).items()},
        "by_source": {src: asdict(summarize(rs)) for src, rs in by_source(every).items()},
        "cases": {k: [asdict(r) for r in v] for k, v in groups.items()},
    }
    (RESULTS / "accuracy.json").write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    print(summary_table(summaries(groups, published)) if argv and "--summary" in argv else text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
