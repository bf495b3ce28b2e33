"""Leave-one-source-out accuracy beside the in-sample figures: memory, tokens/s, band coverage, fit rule.

The estimator was built while looking at benchmarks/accuracy/cases.jsonl, so its in-sample error flatters
it. Here every case is also scored as if its source had never been seen: each quantity that a script
derives from the cases is derived again without the cases of the source being scored, and that source's
cases are scored against it. Today one such quantity feeds an estimate or a fit: the band's residual
table (benchmarks/accuracy/band.py -> services/estimator/data/residuals.json). No constant of the point
estimate is fitted from the cases by a script, so held-out point errors equal in-sample ones (the report
says so); constants set by hand while the benchmark was read cannot be re-derived and stay in both.

One memory contract (services/estimator/counters.py): the counter error compares the measured peak with
the predicted counter it was read from (a source that names none: max_memory_reserved); the fit-bytes
error compares the same measured peak with the device peak the fit check and the planner decide on.

Per set (all measured cases; medium + high confidence) and scoring (in-sample; held out):

- memory: median and p90 absolute % error, of the counter and of the fit bytes;
- tokens/s: median absolute % error where the case measured a comparable rate;
- measured out-of-memory runs the fit check (fit bytes <= the card) does not flag;
- runs that ran (no OOM, card known) the planner would refuse on their card: by the rule it applies today
  (fit bytes above the card less its default 10% margin) and by sizing on the p90 of the device band
  (the rule docs/planner.md describes), whose band is the held-out one when held out;
- band coverage: the share of measured peaks inside the [p10, p90] band of their counter.

Cases marked ``derived`` (extrapolations, not measurements) are left out.

Run: ``python -m benchmarks.accuracy.heldout`` (writes benchmarks/results/heldout.{md,json}).
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.accuracy.band import case_category, residual_table
from benchmarks.accuracy.run import (
    PLANNER_SAFETY_MARGIN,
    CaseResult,
    _percentile,
    evaluate_case,
    load_cases,
    planner_refuses,
)
from services.estimator.fit import FIT_QUANTILE
from services.estimator.plan import Plan
from services.estimator.uncertainty import Key, Pool, band_from_pools, build_pools, category

RESULTS = Path(__file__).resolve().parents[1] / "results"

# Every quantity a script derives from the cases, and what holding a source out does to it.
CASE_DERIVED = (
    (
        "band residual table",
        "services/estimator/data/residuals.json",
        "benchmarks/accuracy/band.py",
        "re-derived without the scored source's cases (band coverage, the planner's headroom ratio, p90-band rule)",
    ),
    (
        "calibration band",
        "services/nodes/data/calibration_band.json",
        "benchmarks/accuracy/calibration_band.py",
        "bounds a node calibration's result only; no estimate or fit without a calibration reads it, "
        "so it does not enter these figures",
    ),
)
POINT_NOTE = (
    "No constant of the point estimate (memory or tokens/s) is fitted from these cases by a script, so the "
    "held-out point errors equal the in-sample ones. Constants chosen by hand while this benchmark was read "
    "(e.g. the utilisation "
    "priors) have no script to re-derive them without a source: the held-out point figures still carry "
    "whatever that tuning gained."
)


@dataclass(frozen=True)
class Scored:
    """One case under one scoring: its errors (from the estimate) and its band (from that scoring's pools)."""

    result: CaseResult
    band: tuple[float, float] | None  # [p10, p90] GiB of the scored counter
    device_p90_gib: float | None  # upper end of the device band at the fit bytes
    planner_refuses: bool | None = None  # the planner's fit rule on the case's card, sized on this scoring's table


@dataclass(frozen=True)
class HeldoutSummary:
    memory_cases: int
    counter_median_pct: float
    counter_p90_pct: float
    fit_median_pct: float
    fit_p90_pct: float
    tokens_cases: int
    tokens_median_pct: float
    ooms: int
    ooms_not_flagged: list[str]
    ran: int  # runs that ran on a known card
    refused_planner_rule: list[str]
    refused_p90_band_rule: list[str]
    ooms_accepted_planner_rule: list[str]  # measured OOMs on a known card the planner would offer
    tight: list[str]  # runs that ran, offered with a 'tight' note (above the p90 band's card, within the rule)
    band_cases: int
    band_coverage_pct: float

    @property
    def refused_planner_rule_pct(self) -> float:
        return 100 * len(self.refused_planner_rule) / self.ran if self.ran else float("nan")

    @property
    def refused_p90_band_rule_pct(self) -> float:
        return 100 * len(self.refused_p90_band_rule) / self.ran if self.ran else float("nan")


def _above_p90(s: Scored) -> bool:
    """The upper end (p90) of the device band is above the card less the default margin."""
    card = s.result.card_gib
    return s.device_p90_gib is not None and card is not None and s.device_p90_gib > card * (1 - PLANNER_SAFETY_MARGIN)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summarize(rows: list[Scored]) -> HeldoutSummary:
    results = [s.result for s in rows]
    counter = [abs(r.error_pct) for r in results if r.error_pct is not None]
    fit = [abs(r.fit_error_pct) for r in results if r.fit_error_pct is not None]
    tokens = [abs(r.tokens_error_pct) for r in results if r.tokens_error_pct is not None]
    ooms = [r for r in results if r.measured_oom and not r.refused]
    ran = [s for s in rows if not s.result.measured_oom and not s.result.refused and s.result.card_gib is not None]
    banded = [s for s in rows if s.band is not None and s.result.measured_gib is not None]
    inside = sum(1 for s in banded if s.band is not None and s.band[0] <= (s.result.measured_gib or 0) <= s.band[1])
    return HeldoutSummary(
        memory_cases=len(counter),
        counter_median_pct=_median(counter),
        counter_p90_pct=_percentile(counter, 0.9),
        fit_median_pct=_median(fit),
        fit_p90_pct=_percentile(fit, 0.9),
        tokens_cases=len(tokens),
        tokens_median_pct=_median(tokens),
        ooms=len(ooms),
        ooms_not_flagged=[r.id for r in ooms if r.predicted_fits is not False],
        ran=len(ran),
        refused_planner_rule=[s.result.id for s in ran if s.planner_refuses],
        refused_p90_band_rule=[s.result.id for s in ran if _above_p90(s)],
        ooms_accepted_planner_rule=[
            s.result.id
            for s in rows
            if s.result.measured_oom and s.result.card_gib is not None and s.planner_refuses is False
        ],
        tight=[s.result.id for s in ran if s.planner_refuses is False and _above_p90(s)],
        band_cases=len(banded),
        band_coverage_pct=100 * inside / len(banded) if banded else float("nan"),
    )


def _device_key(case: dict[str, Any]) -> Key:
    plan = case["plan"]
    return category(
        plan.get("framework", "hf-trainer"),
        plan.get("method", "full"),
        plan.get("sharding", "none"),
        int(plan.get("gpus", 1)),
        "device",
        plan.get("mode", "train"),
    )


def score(case: dict[str, Any], result: CaseResult, pools: dict[Key, Pool]) -> Scored:
    """The case's band of its counter and its device band, from ``pools``."""
    if result.refused or result.predicted_gib is None or result.fit_gib is None:
        return Scored(result, None, None)
    low = result.low_confidence_estimate
    own = band_from_pools(pools, case_category(case), low)
    device = band_from_pools(pools, _device_key(case), low)
    refuses = None
    if result.card_gib is not None:
        refuses = planner_refuses(Plan.model_validate(case["plan"]), result.fit_gib, result.card_gib, low, pools)
    return Scored(
        result,
        own.interval(result.predicted_gib),
        max(result.fit_gib, device.interval(result.fit_gib)[1]),
        refuses,
    )


def scorings(pairs: list[tuple[dict[str, Any], CaseResult]]) -> dict[str, list[Scored]]:
    """Every measured case scored in-sample (pools from all cases) and held out (pools without its source)."""
    pairs = [(c, r) for c, r in pairs if not r.derived]
    everything = build_pools(residual_table(pairs))
    pools_without: dict[str, dict[Key, Pool]] = {}
    for source in sorted({c["source"] for c, _ in pairs}):
        pools_without[source] = build_pools(residual_table([(c, r) for c, r in pairs if c["source"] != source]))
    return {
        "in_sample": [score(c, r, everything) for c, r in pairs],
        "held_out": [score(c, r, pools_without[c["source"]]) for c, r in pairs],
    }


def _sets(rows: list[Scored]) -> dict[str, list[Scored]]:
    return {"all": rows, "medium_high": [s for s in rows if s.result.confidence in ("medium", "high")]}


def summaries(scored: dict[str, list[Scored]]) -> dict[str, dict[str, HeldoutSummary]]:
    """{set: {scoring: summary}} for the sets all and medium_high."""
    out: dict[str, dict[str, HeldoutSummary]] = {}
    for scoring, rows in scored.items():
        for name, subset in _sets(rows).items():
            out.setdefault(name, {})[scoring] = summarize(subset)
    return out


def scored_cases(cases: list[dict[str, Any]] | None = None) -> dict[str, list[Scored]]:
    cases = cases if cases is not None else load_cases()
    return scorings([(c, evaluate_case(c)) for c in cases])


def evaluate(cases: list[dict[str, Any]] | None = None) -> dict[str, dict[str, HeldoutSummary]]:
    """{set: {scoring: summary}} over ``cases`` (default: benchmarks/accuracy/cases.jsonl)."""
    return summaries(scored_cases(cases))


SET_LABELS = {"all": "all measured cases", "medium_high": "medium + high confidence"}
SCORING_LABELS = {"held_out": "leave-one-source-out", "in_sample": "in-sample"}


def table(sums: dict[str, dict[str, HeldoutSummary]]) -> str:
    lines = [
        "| set | scoring | memory cases | counter median | counter p90 | fit bytes median | fit bytes p90 "
        "| tokens/s cases | tokens/s median | measured OOMs not flagged | runs that ran refused (planner rule) "
        "| measured OOMs accepted (planner rule) | offered tight | refused (p90-band rule) | band coverage |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in ("medium_high", "all"):
        for scoring in ("held_out", "in_sample"):
            s = sums[name][scoring]
            lines.append(
                f"| {SET_LABELS[name]} | {SCORING_LABELS[scoring]} | {s.memory_cases} | {s.counter_median_pct:.1f}% "
                f"| {s.counter_p90_pct:.1f}% | {s.fit_median_pct:.1f}% | {s.fit_p90_pct:.1f}% | {s.tokens_cases} "
                f"| {s.tokens_median_pct:.1f}% | {len(s.ooms_not_flagged)} of {s.ooms} "
                f"| {len(s.refused_planner_rule)} of {s.ran} ({s.refused_planner_rule_pct:.1f}%) "
                f"| {len(s.ooms_accepted_planner_rule)} of {s.ooms} | {len(s.tight)} "
                f"| {len(s.refused_p90_band_rule)} of {s.ran} ({s.refused_p90_band_rule_pct:.1f}%) "
                f"| {s.band_coverage_pct:.1f}% of {s.band_cases} |"
            )
    return "\n".join(lines)


def source_table(scored: dict[str, list[Scored]]) -> str:
    """Per source, all its measured cases: the point errors and what holding it out does to its band."""
    lines = [
        "| source | memory cases | counter median | fit bytes median | band coverage in-sample | held out "
        "| runs that ran refused (planner rule) in-sample | held out | refused (p90-band rule) in-sample | held out |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for source in sorted({s.result.source for s in scored["in_sample"]}):
        mine = {k: [s for s in rows if s.result.source == source] for k, rows in scored.items()}
        ins, out = summarize(mine["in_sample"]), summarize(mine["held_out"])
        lines.append(
            f"| {source} | {ins.memory_cases} | {ins.counter_median_pct:.1f}% | {ins.fit_median_pct:.1f}% "
            f"| {ins.band_coverage_pct:.1f}% | {out.band_coverage_pct:.1f}% "
            f"| {len(ins.refused_planner_rule)} of {ins.ran} | {len(out.refused_planner_rule)} "
            f"| {len(ins.refused_p90_band_rule)} | {len(out.refused_p90_band_rule)} |"
        )
    return "\n".join(lines)


def report(sums: dict[str, dict[str, HeldoutSummary]], scored: dict[str, list[Scored]] | None = None) -> str:
    out = [
        "# Estimator accuracy held out by source, beside in-sample",
        "",
        table(sums),
        "",
        "Counter: the measured peak against the predicted counter it was read from (a source that names no "
        "counter: max_memory_reserved). Fit bytes: the same peak against the device peak the fit check and "
        "the planner decide on (no reclaimable cache). Planner rule: the planner's own fit function "
        "(services.estimator.fit.fits_card): refused when the fit bytes times the headroom ratio of the case's "
        f"category (the {FIT_QUANTILE:g} quantile of measured / predicted, from the scoring's residual table) exceed "
        f"the card less the default extra margin ({PLANNER_SAFETY_MARGIN:.0%}); offered tight: accepted by it, with "
        "the upper end of the device band above the card (the planner adds a 'tight' note); p90-band rule: refused "
        "when that upper end is above the card. Band coverage: measured peaks inside [p10, p90] of their counter "
        "(nominal 80%).",
        "",
        POINT_NOTE,
        "",
        "Quantities derived from the cases by a script:",
        "",
        "| quantity | file | script | when a source is held out |",
        "|---|---|---|---|",
        *[f"| {name} | {path} | {script} | {effect} |" for name, path, script, effect in CASE_DERIVED],
        "",
    ]
    held = sums["medium_high"]["held_out"]
    out += [
        "Medium + high, held out: measured OOMs not flagged: " + (", ".join(held.ooms_not_flagged) or "none") + ".",
        "Runs that ran refused by the planner rule: " + (", ".join(held.refused_planner_rule) or "none") + ".",
        "Measured OOMs the planner rule accepts: " + (", ".join(held.ooms_accepted_planner_rule) or "none") + ".",
        "Offered tight: " + (", ".join(held.tight) or "none") + ".",
        "Refused by the p90-band rule: " + (", ".join(held.refused_p90_band_rule) or "none") + ".",
        "",
    ]
    if scored is not None:
        out += ["## Per source (all measured cases)", "", source_table(scored), ""]
    return "\n".join(out)


def as_json(sums: dict[str, dict[str, HeldoutSummary]]) -> dict[str, Any]:
    return {
        "point_estimate_fitted_from_cases": False,
        "note": POINT_NOTE,
        "case_derived": [
            dict(zip(("quantity", "file", "script", "held_out"), row, strict=True)) for row in CASE_DERIVED
        ],
        "summary": {
            name: {
                scoring: {
                    **asdict(s),
                    "refused_planner_rule_pct": s.refused_planner_rule_pct,
                    "refused_p90_band_rule_pct": s.refused_p90_band_rule_pct,
                    "fit_quantile": FIT_QUANTILE,
                }
                for scoring, s in by.items()
            }
            for name, by in sums.items()
        },
    }


def main(argv: list[str] | None = None) -> int:
    scored = scored_cases()
    sums = summaries(scored)
    text = report(sums, scored)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "heldout.md").write_text(text + "\n", encoding="utf-8")
    (RESULTS / "heldout.json").write_text(json.dumps(as_json(sums), indent=1) + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
