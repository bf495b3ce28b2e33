"""Pure parts of the dashboard: session cookie and CSRF, chart geometry, view models, the plan form."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

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


def test_identical_setups_share_one_point_with_their_count() -> None:
    other_provider = {**_rec("A", 2, 3, 4), "provider": "q"}
    fsdp_and_ddp = [_rec("A", 2, 3, 4), {**_rec("A", 2, 3, 4), "sharding": "none"}, other_provider]
    spot_entry = {**_rec("A", 2, 3, 4), "pricing": "spot", "cost_usd": 2.0}  # the planner's spot listing
    points = views.cost_time_points([*fsdp_and_ddp, _rec("B", 2, 3, 4), _rec("A", 1, 6, 4), spot_entry])
    assert [(p.series, p.count) for p in points] == [("A", 3), ("B", 1), ("A", 1)]  # same spot, other card: apart
    assert points[0].label.startswith("3 setups (2 x A · p; 2 x A · q)")
    chart = charts.scatter(points, "h", "usd", styled_series=True)
    assert [e.series for e in chart.legend] == ["A", "B"] and [e.count for e in chart.legend] == [2, 1]
    assert chart.points[0].style == chart.points[2].style != chart.points[1].style
    assert chart.points[0].path != chart.points[1].path.replace(" ", "")


def test_every_card_gets_its_own_colour_and_shape() -> None:
    points = [charts.Point(float(i + 1), float(i + 1), f"p{i}", series=f"gpu{i}") for i in range(16)]
    chart = charts.scatter(points, "h", "usd", styled_series=True)
    looks = {(p.style % charts.STYLE_COLOURS, p.style % len(charts.SHAPES)) for p in chart.points}
    assert len(looks) == 16
    assert {p.path[0] for p in chart.points} == {"M"}
    plain = charts.scatter(points[:2], "h", "usd")  # the benchmarks' charts keep their series circles
    assert [p.style for p in plain.points] == [-1, -1] and plain.legend == ()


def test_mark_labels_stay_off_the_points_and_inside_the_plot() -> None:
    # A crowded corner: the cheapest sits among others on its right, where a label would go by default.
    points = [charts.Point(10.0, 1.0, "cheap", series="A", marks=("cheapest",))]
    points += [charts.Point(10.0 + 0.3 * i, 1.0 + 0.01 * i, f"n{i}", series="B") for i in range(1, 8)]
    points += [charts.Point(0.5, 9.0, "fast", series="C", marks=("fastest",))]
    chart = charts.scatter(points, "h", "usd", styled_series=True)
    assert [label.text for label in chart.mark_labels] == ["cheapest", "fastest"]
    for label in chart.mark_labels:
        width = charts._label_width(label.text)
        x0 = {"start": label.x, "end": label.x - width, "middle": label.x - width / 2}[label.anchor]
        box = (x0, label.y - charts.LABEL_HEIGHT_PX + 3, x0 + width, label.y + 3)
        assert chart.plot_left <= box[0] and box[2] <= chart.width
        assert box[1] >= 0 and box[3] <= chart.plot_bottom
        for p in chart.points:
            r = charts.POINT_RADIUS_PX * 1.3
            assert charts._overlap(box, (p.cx - r, p.cy - r, p.cx + r, p.cy + r)) == 0, (label, p.point.label)


def test_small_segments_keep_a_visible_width() -> None:
    widths = charts.segment_widths([100.0, 0.01, 0.5, 50.0], 300.0)
    assert sum(widths) == pytest.approx(300.0)
    assert min(widths) == pytest.approx(charts.MIN_SEGMENT_PX)
    assert widths[0] / widths[3] == pytest.approx(2.0)  # the large ones stay proportional
    assert charts.segment_widths([1.0, 1.0], 6.0) == [3.0, 3.0]
    chart = charts.memory_chart({"weights": 9.0, "adapters": 0.004, "cuda_context": 0.6}, [("A40", 45.0)])
    assert min(s.width for s in chart.segments) >= charts.MIN_SEGMENT_PX


def test_memory_axis_ends_at_the_recommended_card_or_past_the_peak() -> None:
    breakdown = {"weights": 6.0, "activations": 3.0, "cuda_context": 1.0}
    on_card = charts.memory_chart(breakdown, [("RTX 4090", 24.0)])
    bar_end = on_card.segments[-1].x + on_card.segments[-1].width
    card_x = on_card.markers[0].x
    assert card_x == pytest.approx(on_card.width - 16)  # the card is the end of the axis
    assert (bar_end - on_card.segments[0].x) / (card_x - on_card.segments[0].x) == pytest.approx(10 / 24, rel=1e-3)
    alone = charts.memory_chart(breakdown, [])
    end = alone.segments[-1].x + alone.segments[-1].width
    plot = alone.width - 16 - alone.segments[0].x
    assert 0.6 < (end - alone.segments[0].x) / plot <= 1 / 1.15 + 1e-3  # the axis ends 15% or more past the peak
    # The plan as submitted needs more than the recommended card: the card is marked inside the axis.
    over = charts.memory_chart(breakdown, [("T4", 8.0)])
    over_end = over.segments[-1].x + over.segments[-1].width
    assert over.markers[0].x < over_end < over.width - 16


def _plan_out(recs: list[dict[str, object]], rejections: list[dict[str, object]]) -> SimpleNamespace:
    return SimpleNamespace(
        id="p2",
        status="done",
        request={"model": {"name": "m"}, "method": "full"},
        estimate={
            "memory": {
                "breakdown": {"weights": 10.0},
                "peak_allocated_gib": 9.0,
                "peak_reserved_gib": 9.5,
                "peak_device_gib": 10.0,
                "peak_moment": "optimizer_step",
            }
        },
        recommendations=recs,
        rejections=rejections,
        warnings=[],
        error=None,
    )


def test_the_memory_chart_marks_only_cards_up_to_the_recommended_one() -> None:
    recs = [_rec("A40", 1, 3, 2, memory=45.0), _rec("RTX 4090", 1, 3, 3, memory=24.0), _rec("B200", 1, 1, 9, 179.0)]
    page = views.plan_page(_plan_out(recs, []), recs)
    assert page.memory is not None
    assert [m.label for m in page.memory.markers] == ["RTX 4090: 24 GiB", "A40: 45 GiB"]
    assert "axis ends at the memory of the recommended card" in page.memory_caption


def test_rejections_are_grouped_and_say_their_fix_once() -> None:
    fix = "fits with micro-batch 1 and gradient checkpointing"
    rejections = [
        {"gpu": "T4", "provider": None, "kind": "memory", "reason": f"needs 150 GiB; {fix}", "suggestion": fix},
        {"gpu": "L4", "provider": None, "kind": "memory", "reason": "needs 150 GiB", "fix": "use 8 x H100"},
        {"gpu": "H100", "provider": "p", "kind": "budget", "reason": "costs $900, over the $100 budget"},
        {"gpu": "A100", "provider": "p", "kind": "budget_and_deadline", "reason": "no setup meets both"},
        {"gpu": "B200", "provider": "p", "kind": "region", "reason": "only in us-east"},
    ]
    page = views.plan_page(_plan_out([], rejections), [])
    assert [r.gpu for r in page.rejections] == ["T4", "L4"]
    assert [r.gpu for r in page.budget_rejections] == ["H100", "A100"]
    assert [r.gpu for r in page.constraint_rejections] == ["B200"]
    assert page.rejections[0].suggestion is None  # already the end of its reason
    assert page.rejections[1].suggestion == "use 8 x H100"
    assert page.memory is not None and "no card is recommended" in page.memory_caption


def test_setups_the_planner_lists_on_demand_and_on_spot_are_drawn_once() -> None:
    on_demand = {**_rec("A", 1, 3, 4), "pricing": "on_demand", "spot_cost_usd": 2.0}
    on_spot = {**on_demand, "pricing": "spot"}
    spot_only = {**_rec("B", 2, 1, 9), "pricing": "spot", "spot_cost_usd": 5.0}
    points = views.cost_time_points([on_spot, on_demand, spot_only])
    assert [(p.series, p.count) for p in points] == [("A", 1), ("B", 1)]
    row = views.recommendation_row(0, on_spot)
    assert row.pricing == "spot" and row.cost == "$4.00" and row.spot_cost == "$2.00"


def test_quote_options_are_one_per_setup_and_know_their_spot_price() -> None:
    spot = {**_rec("A", 1, 3, 4), "spot_price_usd_per_hour": 0.5, "spot_cost_usd": 2.5}
    spot_entry = {**spot, "pricing": "spot"}
    options = views.quote_options([spot, spot_entry, _rec("B", 2, 2, 5)])
    assert [(o.value, o.spot) for o in options] == [("A|1|p|r|1", True), ("B|2|p|r|1", False)]
    assert options[0].label.endswith("spot available") and "spot" not in options[1].label


def test_the_quote_form_starts_on_the_tables_first_row_with_its_pricing() -> None:
    # Issue 22 item 3: the plan's first setup is spot-priced; the form pre-selects it with "Spot pricing"
    # checked, and its label carries the table's number, not today's candidate's.
    first = {**_rec("A", 8, 1, 9), "pricing": "spot", "spot_cost_usd": 3.0, "expected_cost_usd": 3.0}
    first["spot_price_usd_per_hour"] = 2.0
    notes = ["spot: 0.50 preemptions expected", "sold as whole nodes of 8 GPUs"]
    first["notes"] = notes
    other = {**_rec("B", 1, 2, 4), "expected_cost_usd": 4.0}
    today = {**first, "expected_cost_usd": 2.5, "spot_cost_usd": 2.5}  # re-planned candidates come after
    out = SimpleNamespace(
        id="p1",
        status="done",
        request={},
        estimate=None,
        recommendations=[first, other],
        rejections=[],
        warnings=[],
        error=None,
    )
    page = views.plan_page(out, [today, other])
    assert page.default_quote == "A|8|p|r|1" and page.default_spot
    assert page.quote_options[0].on_spot and "$3.00" in page.quote_options[0].label
    assert not page.quote_options[1].on_spot
    assert page.recommendations[0].notes == tuple(notes)


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
    assert page.default_quote == "A100 80GB|1|p|r|1"  # the table's first row
    assert not page.default_spot
    assert page.cost_time is not None and len(page.cost_time.points) == 2
    assert not page.live
    assert views.parse_quote_value(page.default_quote) == views.QuoteChoice("A100 80GB", 1, "p", "r", 1)
    for bad in ("", "a|b|c", "a|1", "|1|p", "a|1|p|r", "a|0|p|r|1", "a|1|p|r|x"):
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


def test_money_under_a_cent_is_never_shown_as_zero() -> None:
    # A budget of 1e-300 USD read "$0.00": free, or no budget at all.
    for tiny in (1e-300, 0.001, 0.0049):
        assert views.usd(tiny) == "< $0.01", tiny
    assert views.usd(-0.0049) == "> -$0.01"
    assert views.usd(0.0) == "$0.00" and views.usd(-0.0) == "$0.00"
    assert views.usd(0.01) == "$0.01" and views.usd(-2.5) == "-$2.50" and views.usd(250_000) == "$250,000"
    # Prices per hour, to four decimals, the same way.
    assert views.usd_per_hour(0.0045) == "$0.0045" and views.usd_per_hour(2.5) == "$2.50"
    assert views.usd_per_hour(1e-9) == "< $0.0001"
    out = SimpleNamespace(
        id="p",
        status="done",
        request={"constraints": {"budget_usd": 1e-300}},
        estimate=None,
        recommendations=[],
        rejections=[],
        warnings=[],
        error=None,
    )
    assert views.Fact("budget", "< $0.01") in views.plan_page(out, []).facts


def _node(**fields: Any) -> SimpleNamespace:
    """A node row as the nodes page reads it: an active 2 x H100 SXM with no lifecycle history, and ``fields``."""
    base: dict[str, Any] = {
        "id": "n",
        "name": "box",
        "gpu": "H100 SXM",
        "gpu_count": 2,
        "job_running": False,
        "provider": "",
        "usd_per_hour": None,
        "status": "active",
        "stop_attempts": 0,
        "next_stop_at": None,
        "last_stop_at": None,
        "last_stop_answer": None,
        "sync_alert": None,
        "sync_error": None,
        "sync_failing_since": None,
        "sync_pending_bytes": 0,
        "unsynced_since": None,
    }
    return SimpleNamespace(**{**base, **fields})


def test_percentages_round_halves_away_from_zero() -> None:
    # As people read them (and not Python's round() or "%.0f", which gave 12.5 -> 12 and 13.5 -> 14).
    shown = [views.percent(v) for v in (12.5, 13.5, 0.5, 99.5, 87.4, 100.0)]
    assert shown == ["13%", "14%", "1%", "100%", "87%", "100%"]
    assert views.percent(None) == "—"
    assert views.round_half_away(2.675, 2) == 2.68 and views.round_half_away(-12.5) == -13.0
    now = datetime(2026, 1, 1, tzinfo=UTC)
    node = _node(
        gpus=[
            {"index": 0, "utilisation_pct": 1.4, "memory_used_gib": 1, "memory_total_gib": 80},
            {"index": 1, "utilisation_pct": 1.5, "memory_used_gib": 1, "memory_total_gib": 80},
        ],
        last_heartbeat_at=now,
    )
    # The mean of 1.4 and 1.5 is 1.45 (a float a hair under it, which round() takes down to 1.4).
    assert views.node_row(node, views.NodeLifecycle(), now).mean_utilisation_pct == 1.5


def test_echoed_inputs_are_cut_to_a_readable_length() -> None:
    long = "x" * 3000
    shown = views.echo(long)
    assert shown.startswith("'xxx") and shown.endswith("…'") and len(shown) <= views.ECHO_CHARS + 3
    assert views.echo("abc") == "'abc'"
    # Messages of the services that quote what was sent (NotFound "no plan '…'"), and bare runs (a path).
    for message in (
        f"no plan {long!r}",
        f"no dashboard page at /dashboard/{long}",
        f"model: {'word ' * 600!r} is unknown",
    ):
        cut = views.readable(message)
        assert len(cut) < 200 and "…" in cut, cut[:300]
    assert views.readable("model: 'm' is not in the bundled catalog.") == "model: 'm' is not in the bundled catalog."
    form, request = forms.parse_plan_form({**forms.DEFAULTS, "model": long, "method": long, "budget_usd": long})
    assert request is None
    for name in ("model", "method", "budget_usd"):
        assert "x" * 30 in form.errors[name] and len(form.errors[name]) < 400, form.errors[name]
        assert "…" in form.errors[name]
    assert form.values["model"] == long  # the input keeps what was typed


def test_node_row_with_empty_lifecycle() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    node = _node(
        gpus=[{"index": 0, "utilisation_pct": 90.0, "memory_used_gib": 70, "memory_total_gib": 80}],
        last_heartbeat_at=now - timedelta(minutes=10),
    )
    row = views.node_row(node, views.NodeLifecycle(), now)
    assert row.stale and row.mean_utilisation_pct == 90.0 and row.price == "—"
    assert row.lifecycle.current_run is None and row.lifecycle.decisions == ()
    assert row.sync is None and not row.sync_warn
    failing = SimpleNamespace(
        **{
            **vars(node),
            "sync_error": "EndpointConnectionError: cannot reach",
            "sync_pending_bytes": 3 * 2**29,
            "sync_failing_since": now - timedelta(minutes=4),
        }
    )
    assert views.node_row(failing, views.NodeLifecycle(), now).sync == (
        "failing since 4 min ago: EndpointConnectionError: cannot reach; 1.50 GiB not durable"
    )


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


def test_the_mean_example_length_is_bounded_as_the_api_bounds_it() -> None:
    form, request = forms.parse_plan_form({**forms.DEFAULTS, "avg_tokens": "5000000"})
    assert request is None
    assert form.errors["avg_tokens"] == "average tokens per example: above 0 and at most 4,194,304 (got 5,000,000)"
    form, request = forms.parse_plan_form({**forms.DEFAULTS, "avg_tokens": "0.5"})
    assert request is None and form.errors["avg_tokens"].startswith("dataset.avg_tokens: input should be greater")


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


def test_the_recommendation_row_shows_the_data_rate_and_the_padded_one_beside_it() -> None:
    assert views._tokens_per_s(_rec("A", 1, 1, 1)) == "1,234"  # stored before padding was counted
    assert views._tokens_per_s({**_rec("A", 1, 1, 1), "data_tokens_per_s": 1234.0}) == "1,234"
    padded = {**_rec("A", 1, 1, 1), "data_tokens_per_s": 617.0}
    assert views._tokens_per_s(padded) == "617 (1,234 with padding)"


def test_the_data_sets_list_says_which_tokenizer_counted() -> None:
    from services.dashboard.lists import dataset_rows

    now = datetime(2026, 12, 2, tzinfo=UTC)
    tokens = {"p50_tokens": 20, "p90_tokens": 31, "method": "tokenizer_json"}

    def row(report: dict[str, Any] | None) -> SimpleNamespace:
        return SimpleNamespace(id="d1", name="tr.jsonl", status="done", size_bytes=2048, report=report, created_at=now)

    hub = {"tokens": tokens, "tokenizer": {"source": "hub:acme/tiny-bpe", "revision": "abc"}}
    older = {"tokens": {**tokens, "method": "approx_4_chars_per_token"}}
    views_ = dataset_rows([row(hub), row(older), row(None)], now)
    assert [v.tokenizer for v in views_] == ["hub:acme/tiny-bpe", "estimate: characters/4", ""]
