"""Pure parts of the dashboard: session cookie and CSRF, chart geometry, view models, the plan form."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from benchmarks.dashboard.accuracy_data import REPORT, TARGET, render
from services.dashboard import charts, forms, session, views
from services.dashboard.loaders import public_accuracy

SECRET = "s" * 16 + "0123456789abcdefghij"


# --- session and CSRF ----------------------------------------------------------------------------


def test_session_round_trip_and_rejections() -> None:
    data = session.new_session(1000.0, session_id="ab" * 32)
    value = session.encode(data, SECRET)
    assert session.decode(value, SECRET, 1500.0, 3600) == data
    assert session.decode(value, SECRET, 1000.0 + 3601, 3600) is None  # expired
    assert session.decode(value, SECRET, 900.0, 3600) is None  # from the future
    assert session.decode(value, "another secret of enough length 12345", 1500.0, 3600) is None
    payload, mac = value.split(".")
    forged = json.loads(session._unb64(payload))
    forged["s"] = "cd" * 32
    forged_payload = session._b64(json.dumps(forged).encode())
    assert session.decode(f"{forged_payload}.{mac}", SECRET, 1500.0, 3600) is None
    for junk in (None, "", "abc", "a.b.c", "!!.??", "x" * 5000):
        assert session.decode(junk, SECRET, 1500.0, 3600) is None


def test_new_sessions_rotate_the_csrf_token_and_hold_no_key() -> None:
    a, b = session.new_session(0.0), session.new_session(0.0, session_id="h")
    assert a.csrf_token != b.csrf_token
    assert not a.signed_in and b.signed_in
    assert "gp_" not in session.encode(b, SECRET)


def test_csrf_check() -> None:
    data = session.new_session(0.0)
    assert session.csrf_ok(data, data.csrf_token)
    assert not session.csrf_ok(data, data.csrf_token + "x")
    assert not session.csrf_ok(data, "")
    assert not session.csrf_ok(data, None)
    assert not session.csrf_ok(None, data.csrf_token)


def test_cookie_flags() -> None:
    assert session.cookie_flags(https=False) == {"httponly": True, "samesite": "lax", "secure": False}
    assert session.cookie_flags(https=True)["secure"] is True


def test_settings_refuse_a_weak_session_secret() -> None:
    from pydantic import ValidationError

    from services.core.settings import Settings

    assert len(Settings().session_secret.get_secret_value()) >= 32
    assert Settings().session_secret != Settings().session_secret  # random when unset
    with pytest.raises(ValidationError, match="session_secret"):
        Settings(session_secret="changeme")
    with pytest.raises(ValidationError, match="session_secret"):
        Settings(session_secret="a" * 40)


# --- chart geometry ------------------------------------------------------------------------------


def test_nice_and_log_ticks() -> None:
    assert charts.nice_ticks(0, 100, 5) == [0, 20, 40, 60, 80, 100]
    assert charts.nice_ticks(0, 11.2, 6) == [0, 2, 4, 6, 8, 10]
    assert charts.log_ticks(0.1, 12) == [0.1, 0.2, 0.5, 1, 2, 5, 10]
    assert charts.log_ticks(1, 1e6) == [1, 10, 100, 1000, 10000, 100000, 1000000]


def test_scales() -> None:
    lin = charts.Scale(0, 10, 100, 200)
    assert lin(0) == 100 and lin(5) == 150 and lin(10) == 200
    log = charts.Scale(1, 100, 0, 200, log=True)
    assert log(10) == pytest.approx(100)
    flipped = charts.Scale(0, 10, 300, 0)  # SVG's y grows downwards
    assert flipped(10) == 0


def test_memory_chart_segments_are_proportional_and_contiguous() -> None:
    breakdown = {"weights": 5.0, "gradients": 0.0, "activations": 2.5, "cuda_context": 0.5}
    chart = charts.memory_chart(breakdown, [("A40", 45.0), ("L40S", 45.0), ("RTX 4090", 24.0)])
    assert [s.key for s in chart.segments] == ["weights", "activations", "cuda_context"]  # zero left out
    assert chart.total_gib == 8.0
    widths = [s.width for s in chart.segments]
    assert widths[0] / widths[1] == pytest.approx(2.0, rel=1e-3)
    for left, right in zip(chart.segments, chart.segments[1:], strict=False):
        assert right.x == pytest.approx(left.x + left.width, abs=0.02)
    assert sum(s.share_pct for s in chart.segments) == pytest.approx(100)
    # Cards of equal memory share a marker; markers sit where the axis puts their memory.
    assert [m.label for m in chart.markers] == ["RTX 4090: 24 GiB", "A40, L40S: 45 GiB"]
    per_gib = chart.segments[0].width / 5.0
    assert chart.markers[1].x - chart.segments[0].x == pytest.approx(45 * per_gib, rel=1e-3)
    assert chart.ticks[0].label == "0"


def test_memory_chart_labels_neither_overlap_nor_get_crossed_nor_leave_the_picture() -> None:
    cards = [("RTX 4090 24GB", 10.0), ("B", 11.0), ("C", 12.0), ("A40, L40S", 45.0), ("Long card name", 80.0)]
    chart = charts.memory_chart({"weights": 10.0}, cards)
    spans = [(m.x - len(m.label) * charts.LABEL_PX_PER_CHAR - 4, m.x, m.label_row) for m in chart.markers]
    assert all(start >= 0 for start, _, _ in spans)  # the left margin grows to fit the labels
    for i, (start, end, row) in enumerate(spans):
        for j, (other_start, other_end, other_row) in enumerate(spans):
            if i == j:
                continue
            if row == other_row:
                assert end + 6 <= other_start or other_end + 6 <= start  # no overlap in a row
            line_x, line_row = chart.markers[j].x, other_row
            if start <= line_x <= end:
                assert line_row > row  # the line starts below this label
    assert chart.bar_y > chart.marker_top + 16 * max(row for _, _, row in spans)
    assert chart.segments[0].x >= 8


def test_scatter_identity_line_is_the_diagonal_and_points_land_on_it() -> None:
    points = [charts.Point(10, 10, "a"), charts.Point(20, 30, "b"), charts.Point(40, 35, "c")]
    chart = charts.scatter(points, "measured", "predicted", identity=True)
    assert chart.identity is not None
    x1, y1, x2, y2 = chart.identity
    on_line = chart.points[0]
    # A point with predicted == measured is on the identity line.
    t = (on_line.cx - x1) / (x2 - x1)
    assert on_line.cy == pytest.approx(y1 + t * (y2 - y1), abs=0.05)
    assert not chart.x_log
    wide = charts.scatter([charts.Point(1, 2, "a"), charts.Point(1000, 900, "b")], "m", "p", identity=True)
    assert wide.x_log and wide.y_log


def test_scatter_without_identity_uses_separate_axes() -> None:
    chart = charts.scatter([charts.Point(0.1, 100, "a"), charts.Point(12, 130, "b")], "hours", "usd")
    assert chart.x_log and not chart.y_log
    a, b = chart.points
    assert a.cx < b.cx and a.cy > b.cy  # more hours to the right, more dollars higher up
    assert chart.plot_left <= a.cx <= chart.plot_right


# --- view models ---------------------------------------------------------------------------------


def _rec(gpu: str, gpus: int, hours: float, cost: float, memory: float = 80.0) -> dict[str, object]:
    return {
        "provider": "p",
        "gpu": gpu,
        "gpus": gpus,
        "nodes": 1,
        "region": "r",
        "hours": hours,
        "cost_usd": cost,
        "spot_cost_usd": None,
        "gpu_memory_gib": memory,
        "peak_gib_per_gpu": 30.0,
        "headroom_gib": memory - 30.0,
        "tokens_per_s": 1234.0,
        "micro_batch_size": 4,
        "gradient_accumulation_steps": 2,
        "sharding": "fsdp",
        "gradient_checkpointing": True,
    }


def test_cost_time_points_mark_the_cheapest_and_the_fastest() -> None:
    points = views.cost_time_points([_rec("A", 1, 10, 5), _rec("B", 8, 1, 9), _rec("C", 2, 6, 7)])
    assert [p.marks for p in points] == [("cheapest",), ("fastest",), ()]
    same = views.cost_time_points([_rec("A", 1, 1, 1)])
    assert same[0].marks == ("cheapest", "fastest")
    assert views.cost_time_points([]) == []


def test_plan_page_view_model() -> None:
    out = SimpleNamespace(
        id="p1",
        status="done",
        request={"model": {"name": "m"}, "method": "lora", "lora": {"rank": 8}, "epochs": 2, "gpus": 1},
        estimate={
            "memory": {
                "breakdown": {"weights": 10.0, "activations": 5.0},
                "peak_allocated_gib": 14.0,
                "peak_reserved_gib": 14.5,
                "peak_device_gib": 15.0,
                "peak_moment": "end_of_forward",
            }
        },
        recommendations=[_rec("A100 80GB", 1, 3.0, 6.0)],
        rejections=[{"gpu": "T4", "provider": None, "kind": "memory", "reason": "needs 15 GiB", "suggestion": "x"}],
        warnings=["w"],
        error=None,
    )
    candidates = [_rec("A100 80GB", 1, 3.0, 6.0), _rec("A100 80GB", 4, 1.0, 8.0)]
    page = views.plan_page(out, candidates, [("q1", "$8.00")])
    assert page.memory is not None and len(page.memory.segments) == 2
    assert page.recommendations[0].setup == "1 x A100 80GB"
    assert page.recommendations[0].fill_pct == pytest.approx(37.5)
    assert page.rejections[0].provider == "every provider"
    assert page.default_quote == "A100 80GB|4|p"  # a multi-GPU setup is offered first
    assert page.cost_time is not None and len(page.cost_time.points) == 2
    assert not page.live
    assert views.parse_quote_value(page.default_quote) == ("A100 80GB", 4, "p")
    for bad in ("", "a|b|c", "a|1", "|1|p"):
        assert views.parse_quote_value(bad) is None


def test_formatting() -> None:
    assert views.usd(1234.5) == "$1,234.50"
    assert views.usd(None) == "—"
    assert views.duration(0.5) == "30 min"
    assert views.duration(3.25) == "3.2 h"
    assert views.duration(72) == "3.0 days"
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert views.ago(now - timedelta(seconds=30), now) == "30 s ago"
    assert views.ago(now - timedelta(hours=3), now) == "3 h ago"
    assert views.ago(None, now) == "never"


def test_node_row_with_empty_lifecycle() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    node = SimpleNamespace(
        id="n",
        name="box",
        gpu="H100 SXM",
        gpu_count=2,
        gpus=[{"index": 0, "utilisation_pct": 90.0, "memory_used_gib": 70, "memory_total_gib": 80}],
        last_heartbeat_at=now - timedelta(minutes=10),
        job_running=False,
        provider="",
        usd_per_hour=None,
    )
    row = views.node_row(node, views.NodeLifecycle(), now)
    assert row.stale and row.mean_utilisation_pct == 90.0 and row.price == "—"
    assert row.lifecycle.current_run is None and row.lifecycle.decisions == ()


def test_benchmark_points_use_measured_x_and_predicted_y() -> None:
    calibration = SimpleNamespace(
        model_name="m",
        method="lora",
        gpu="A10G",
        peak_allocated_gib=10.0,
        predicted_peak_allocated_gib=11.0,
        tokens_per_s=1000.0,
        predicted_tokens_per_s=None,
    )
    case = {"id": "c", "gpu": "g", "metric": "reserved", "measured_gib": 20.0, "predicted_gib": 18.0}
    memory, tokens = views.benchmark_points([calibration], [case])
    assert [(p.x_value, p.y_value, p.series) for p in memory] == [(10.0, 11.0, "calibration"), (20.0, 18.0, "public")]
    assert tokens == []


# --- the plan form -------------------------------------------------------------------------------


def test_the_default_form_is_a_valid_plan() -> None:
    form, request = forms.parse_plan_form(forms.DEFAULTS)
    assert form.errors == {}
    assert request is not None
    assert request.method == "qlora" and request.lora is not None and request.lora.rank == 16
    assert request.dataset is not None and request.dataset.examples == 10_000
    assert request.gradient_checkpointing


def test_form_messages_name_the_input() -> None:
    raw = {**forms.DEFAULTS, "micro_batch_size": "0", "seq_len": "1.5", "epochs": "", "budget_usd": "-3"}
    form, request = forms.parse_plan_form(raw)
    assert request is None
    assert set(form.errors) == {"micro_batch_size", "seq_len", "epochs", "budget_usd"}
    assert form.errors["micro_batch_size"] == "micro-batch size: from 1 to 65,536 (got 0)"
    assert form.values["seq_len"] == "1.5"


def test_form_config_json_and_tokens() -> None:
    config = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "vocab_size": 1000}  # fmt: skip
    raw = {**forms.DEFAULTS, "model_source": "config", "config_json": json.dumps(config), "tokens": "5,000,000"}
    form, request = forms.parse_plan_form(raw)
    assert form.errors == {}
    assert request is not None and request.model.config == config
    assert request.dataset is not None and request.dataset.tokens == 5_000_000
    form, request = forms.parse_plan_form({**raw, "config_json": "{bad"})
    assert request is None and "not valid JSON" in form.errors["config_json"]


def test_schema_problems_land_on_their_input() -> None:
    assert forms.input_for("dataset.avg_tokens", {}) == "avg_tokens"
    assert forms.input_for("constraints.budget_usd", {}) == "budget_usd"
    assert forms.input_for("model.name", {"model_source": "config"}) == "config_json"
    assert forms.input_for("lora.rank", {}) == "lora_rank"
    assert forms.input_for("something.else", {}) == "form"
    assert forms.input_for(None, {}) == "form"


# --- the public accuracy cases shipped with the package ------------------------------------------


def test_shipped_accuracy_cases_match_the_accuracy_report() -> None:
    """After `python -m benchmarks.accuracy.run` changes the report, run
    `python -m benchmarks.dashboard.accuracy_data` to refresh the dashboard's copy."""
    expected = render(json.loads(REPORT.read_text(encoding="utf-8")))
    assert TARGET.read_text(encoding="utf-8") == expected, "run: python -m benchmarks.dashboard.accuracy_data"
    data = public_accuracy()
    assert len(data["cases"]) > 100
    assert all(math.isfinite(c["measured_gib"]) for c in data["cases"] if c["measured_gib"] is not None)


def test_plan_page_while_estimating_and_after_failing() -> None:
    out = SimpleNamespace(
        id="p2",
        status="queued",
        request={"model": {"config": {"model_type": "llama"}}, "method": "full"},
        estimate=None,
        recommendations=[],
        rejections=[],
        warnings=[],
        error=None,
    )
    page = views.plan_page(out, [])
    assert page.live and page.memory is None and page.cost_time is None and page.default_quote is None
    assert page.model == "custom llama (config.json)"
    failed = views.plan_page(SimpleNamespace(**{**vars(out), "status": "failed", "error": "boom"}), [])
    assert not failed.live and failed.error == "boom"
