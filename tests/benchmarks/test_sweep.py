"""The trace-vs-analytic sweep (benchmarks/sweep): its generator, its report, and one or two real traces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.sweep.configs import sweep_configs
from benchmarks.sweep.report import THRESHOLD_PCT, mechanism, render, write_report
from tests.conftest import require_trace_extra

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def test_generator_gives_at_least_200_distinct_configs_the_same_on_every_call() -> None:
    first, second = sweep_configs(), sweep_configs()
    assert len(first) >= 200
    assert first == second
    assert len({c.id for c in first}) == len(first)
    assert {c.plan["method"] for c in first} == {"full", "lora", "qlora"}
    assert {c.plan["gradient_checkpointing"] for c in first} == {True, False}
    assert all(256 <= c.plan["seq_len"] <= 4096 and 1 <= c.plan["micro_batch_size"] <= 4 for c in first)


def test_every_config_makes_a_valid_plan() -> None:
    from benchmarks.sweep.run import plan_of

    for config in sweep_configs()[::25]:
        plan = plan_of(config)
        assert plan.seq_len == config.plan["seq_len"]


def _sample() -> dict:
    """A few stored rows: one per mechanism group of the committed results, and every failure."""
    data = json.loads((RESULTS / "sweep.json").read_text(encoding="utf-8"))
    rows, seen = [], set()
    for row in data["rows"]:
        if row["status"] != "ok":
            rows.append(row)
            continue
        key = mechanism(row) if abs(row["diff_pct"]) > THRESHOLD_PCT else "agree"
        if key not in seen:
            seen.add(key)
            rows.append(row)
    return {"configs": len(rows), "seconds": 1, "rows": rows}


def test_report_renders_groups_from_stored_rows(tmp_path: Path) -> None:
    sample = _sample()
    text = render(sample)
    assert f"configs: {len(sample['rows'])}" in text
    assert "### Full fine-tuning of tied models" in text
    assert "## Failed or skipped" in text
    write_report(sample, tmp_path / "sweep.md")
    assert (tmp_path / "sweep.md").read_text(encoding="utf-8") == text


def test_committed_report_is_the_render_of_the_committed_rows() -> None:
    data = json.loads((RESULTS / "sweep.json").read_text(encoding="utf-8"))
    assert len(data["rows"]) >= 200
    assert (RESULTS / "sweep.md").read_text(encoding="utf-8") == render(data)


@pytest.mark.slow
def test_tiny_configs_trace_and_replay() -> None:
    require_trace_extra()
    from benchmarks.sweep.run import run_config

    tiny = [c for c in sweep_configs() if c.model == "HuggingFaceTB/SmolLM2-135M" and c.plan["seq_len"] <= 512][:2]
    assert tiny
    for config in tiny:
        row = run_config(config, limit_s=120)
        assert row["status"] == "ok", row
        assert row["trace_gib"] > 0 and row["analytic_gib"] > 0
        # The replay sees the same storages as the tracker.
        assert abs(row["replay_diff_pct"] - row["diff_pct"]) < 2.0, row
