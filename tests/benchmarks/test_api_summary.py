"""benchmarks/api/run.py's verdict lines: the target read from the median round, and a run whose load came from the
Python-threads fallback said so, since its figures are not comparable with wrk's."""

from __future__ import annotations

from typing import Any

from benchmarks.api.run import ESTIMATE_TARGET_PER_S, _median_round, summary


def _run(tool: str, rate: float, errors: int = 0) -> dict[str, Any]:
    return {
        "tool": tool,
        "requests": int(rate * 10),
        "requests_per_s": rate,
        "p50_ms": 8.0,
        "p90_ms": 12.0,
        "p99_ms": 19.5,
        "errors": errors,
    }


def _result(tool: str, estimate_rates: list[float], errors: int = 0) -> dict[str, Any]:
    rounds = [
        {"healthz": _run(tool, 1800.0 + i), "estimate": _run(tool, rate, errors)}
        for i, rate in enumerate(estimate_rates)
    ]
    estimate = _median_round([r["estimate"] for r in rounds])
    healthz = _median_round([r["healthz"] for r in rounds])
    return {
        "clients": 8,
        "rounds": rounds,
        "estimate": estimate,
        "healthz": healthz,
        "estimate_to_healthz": round(estimate["requests_per_s"] / healthz["requests_per_s"], 3),
        "target_estimate_requests_per_s": ESTIMATE_TARGET_PER_S,
    }


def test_a_wrk_run_over_the_target_reads_met_from_its_median_round() -> None:
    lines = summary(_result("wrk", [857.0, 958.0, 896.0]))
    assert lines[0] == (
        "POST /v1/estimate: 896 requests/s in the median round (rounds 857-958, p99 19.5 ms, 0 errors; target 800: met)"
    )
    assert lines[1] == "GET /healthz: 1,801 requests/s; estimate / healthz 0.498"
    assert lines[2] == "load client: wrk (8 connections)"


def test_a_median_round_under_the_target_or_with_errors_is_missed() -> None:
    assert summary(_result("wrk", [700.0, 990.0, 790.0]))[0].endswith("target 800: MISSED)")
    assert summary(_result("wrk", [900.0, 910.0, 920.0], errors=3))[0].endswith("3 errors; target 800: MISSED)")


def test_the_python_threads_fallback_is_named_as_not_comparable() -> None:
    lines = summary(_result("python-threads", [595.0]))
    assert "NOT wrk" in lines[2] and "apt-get install -y wrk" in lines[2]
    assert "lower bounds" in lines[2]
