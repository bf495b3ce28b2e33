"""Bounds the estimator's held-out accuracy on the public measured cases.

The figures bounded are leave-one-source-out (``python -m benchmarks.accuracy.heldout``): every quantity a
script derives from the cases is derived again without the source being scored, so a change that learns
one source's cases cannot buy its way past these bars. Memory is scored on the counter each source read
(a source that names none: max_memory_reserved) and on the fit bytes the planner decides on. The bars
are the held-out figures when they were set, with a one-point margin; the README and docs/accuracy.md
publish the same numbers. A change that lowers the in-sample figures but raises these is not taken.
"""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.accuracy import heldout
from benchmarks.accuracy.run import evaluate_case, load_cases, published_cases_path

MARGIN_PCT = 1.0
# Medium + high confidence cases, held out by source.
HELD_OUT = {
    # The allocator's gap measured by replay (ALLOCATOR_GAP) replaced two hand-tuned constants: p90 17.3 -> 20.6,
    # inside issue 26's 22% bar (the tuned values had been kept where this benchmark scored best).
    "project copy": {
        "counter_median": 6.7,
        "counter_p90": 20.9,
        "fit_median": 9.0,
        "fit_p90": 31.0,
        "tokens_median": 9.0,
        "refused_planner_rule_pct": 0.0,
        "band_coverage_pct": 88.3,
    },
    "as published in shared/": {
        "counter_median": 5.9,
        "counter_p90": 21.0,
        "fit_median": 8.4,
        "fit_p90": 25.2,
        "tokens_median": 6.3,
        "refused_planner_rule_pct": 0.0,
        "band_coverage_pct": 74.6,
    },
}


def _cases(which: str) -> list[dict[str, Any]]:
    if which == "project copy":
        return load_cases()
    path = published_cases_path()
    if path is None:
        pytest.skip("shared/benchmarks/memory_cases.jsonl is not next to this checkout")
    return load_cases(path)


@pytest.mark.parametrize("which", sorted(HELD_OUT))
def test_held_out_medium_and_high_confidence_figures_stay_within_their_bars(which: str) -> None:
    held = heldout.evaluate(_cases(which))["medium_high"]["held_out"]
    bars = HELD_OUT[which]
    assert held.memory_cases >= 60
    assert held.counter_median_pct <= bars["counter_median"] + MARGIN_PCT, held
    assert held.counter_p90_pct <= bars["counter_p90"] + MARGIN_PCT, held
    assert held.fit_median_pct <= bars["fit_median"] + MARGIN_PCT, held
    assert held.fit_p90_pct <= bars["fit_p90"] + MARGIN_PCT, held
    assert held.tokens_cases >= 20
    assert held.tokens_median_pct <= bars["tokens_median"] + MARGIN_PCT, held
    assert held.refused_planner_rule_pct <= bars["refused_planner_rule_pct"] + MARGIN_PCT, held
    # Issue 26 item 8: the planner refuses at most 2% of the runs that ran and accepts no measured OOM.
    assert held.refused_planner_rule_pct <= 2.0 and held.ooms_accepted_planner_rule == [], held
    # The band is an 80% interval: held out, it may not cover much less than it did when the bar was set.
    assert held.band_coverage_pct >= bars["band_coverage_pct"] - 5 * MARGIN_PCT, held
    # Every measured out-of-memory run the estimator estimates is predicted not to fit.
    assert held.ooms_not_flagged == []


def test_held_out_scoring_rederives_the_band_without_the_source() -> None:
    """Held out, a source's cases are banded by pools that lack them; in-sample, by pools that hold them."""
    cases = load_cases()
    scored = heldout.scorings([(c, evaluate_case(c)) for c in cases])
    held = {s.result.id: s.band for s in scored["held_out"]}
    same = {s.result.id: s.band for s in scored["in_sample"]}
    assert held.keys() == same.keys()
    assert sum(1 for k in held if held[k] != same[k]) > len(held) // 2
    # Point predictions do not depend on the scoring: no point constant is fitted from the cases.
    assert [s.result for s in scored["held_out"]] == [s.result for s in scored["in_sample"]]


def test_derived_rows_are_in_no_scored_set() -> None:
    cases = load_cases()
    derived = {c["id"] for c in cases if c.get("derived")}
    assert derived, "the Unsloth context-length cells are marked derived"
    scored = heldout.scorings([(c, evaluate_case(c)) for c in cases])
    assert not derived & {s.result.id for s in scored["held_out"]}
