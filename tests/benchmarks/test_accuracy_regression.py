"""Keeps the estimator's accuracy on the public measured cases from regressing.

The full report (per case, both confidence sets, tokens/s) is ``python -m benchmarks.accuracy.run``;
this test holds the headline numbers to the bars the project promises.
"""

from __future__ import annotations

from benchmarks.accuracy.run import evaluate_all, summarize


def test_public_cases_meet_the_memory_bars() -> None:
    groups = evaluate_all()
    headline = summarize(groups["medium_high"])
    assert headline.memory_cases >= 60
    assert headline.median_abs_error_pct <= 15.0, headline
    # DESIGN.md's bar: the 90th percentile of the absolute memory error within 25%.
    assert headline.p90_abs_error_pct <= 25.0, headline
    # Every measured out-of-memory is predicted not to fit, and nothing that ran is predicted to OOM.
    assert headline.ooms_flagged == headline.ooms
    assert headline.ran_but_predicted_not_to_fit == []
