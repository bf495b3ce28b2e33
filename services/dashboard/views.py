"""View models: stored plans, quotes, nodes and benchmark results turned into what the pages show
(pure: plain data in, frozen dataclasses out; no database, no web framework)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from services.core.money import usd_written
from services.dashboard.charts import MemoryChart, Point, ScatterChart, memory_chart, scatter
from services.estimator.padding import padding_shows
from services.quotes.document import gib as card_gib
from services.quotes.document import to_decimals

LIVE_STATUSES = ("queued", "running")
# Charts are also drawn this wide for phones (the page shows one or the other by screen width), so
# their 12 px labels stay about 12 px on a 375 px screen instead of shrinking with a wide drawing.
NARROW_CHART_PX = 360.0
COST_TIME_AXES = ("hours (wall-clock)", "whole job, on demand (USD)")


# --- formatting ----------------------------------------------------------------------------------


def usd(value: float | None, most_decimals: int = 2) -> str:
    """Money as every page shows it: "$1,234.50" ("$250,000" from $100,000; to the decimals it has, up to
    ``most_decimals``, when more than 2). An amount that is not zero never reads "$0.00" (free, or no budget):
    under the last decimal shown it is "< $0.01" ("> -$0.01" below zero)."""
    if value is None:
        return "—"
    size = abs(value)
    if most_decimals > 2:
        digits = to_decimals(size, most_decimals)
    else:
        digits = f"{size:,.2f}" if size < 100_000 else f"{size:,.0f}"
    return usd_written(value, digits, most_decimals)


def usd_per_hour(value: float) -> str:
    """A price per hour to the decimals it has (at least 2, at most 4, as a quote's unit prices): "$0.01/h" for a
    node rented at $0.005/h was twice its price."""
    return usd(value, 4)


def round_half_away(value: float, decimals: int = 0) -> float:
    """``value`` rounded as people round it, halves away from zero (12.5 -> 13), to the decimal digits it is
    written with: round() and "%.0f" round halves to even (12.5 -> 12) and 1.45, a hair under in binary, down."""
    step = Decimal(1).scaleb(-decimals)
    return float(Decimal(repr(value)).quantize(step, rounding=ROUND_HALF_UP))


def percent(value: float | None, decimals: int = 0) -> str:
    """A percentage such as a GPU's utilisation: "13%" for 12.5."""
    return "—" if value is None else f"{round_half_away(value, decimals):.{decimals}f}%"


# An input echoed in a message is cut to this many characters (a name or id thousands long stays readable),
# and a whole message to MESSAGE_CHARS; the form's inputs keep what was typed.
ECHO_CHARS = 80
MESSAGE_CHARS = 600
# A quoted input in a message (as services quote them: repr), an apostrophe inside a word not being a quote.
_QUOTED = re.compile(r"""(?<!\w)(['"])(.*?)\1(?!\w)""", re.DOTALL)
_LONG_RUN = re.compile(rf"\S{{{ECHO_CHARS + 1},}}")


# Bidi controls (LRM/RLM, ALM, embeddings and overrides, isolates) and C0/C1 control characters: a name from a
# pasted config.json holding U+202E showed itself, and the rest of its line ("qlora", "· gpuplan"), reversed.
_UNSHOWN = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def display_name(text: str) -> str:
    """A name someone else typed (a config's _name_or_path) as a page shows it: without the characters that
    reorder or hide the text around it."""
    return _UNSHOWN.sub("", text)


def shorten(text: str, limit: int = ECHO_CHARS) -> str:
    """``text``, or its first ``limit`` - 1 characters and an ellipsis."""
    return text if len(text) <= limit else f"{text[: limit - 1]}…"


def echo(value: str) -> str:
    """A submitted value quoted in a message: "'abc'", cut short when long."""
    return repr(shorten(value))


def readable(message: str) -> str:
    """A message as a page shows it (the services' messages quote what was sent, whole): each quoted input and
    each run of characters without a space longer than ECHO_CHARS cut short, the whole to MESSAGE_CHARS."""

    def cut_quoted(found: re.Match[str]) -> str:
        quote, inner = found.group(1), found.group(2)
        return f"{quote}{shorten(inner)}{quote}" if len(inner) > ECHO_CHARS else found.group(0)

    message = _QUOTED.sub(cut_quoted, message)
    message = _LONG_RUN.sub(lambda found: shorten(found.group(0)), message)
    return shorten(message, MESSAGE_CHARS)


def duration(hours: float | None) -> str:
    if hours is None:
        return "—"
    if hours < 1:
        return f"{hours * 60:.0f} min"
    if hours < 48:
        return f"{hours:.1f} h"
    return f"{hours / 24:.1f} days"


def gib(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f} GiB"


def when(value: datetime | None) -> str:
    if value is None:
        return "—"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def ago(value: datetime | None, now: datetime) -> str:
    if value is None:
        return "never"
    seconds = (now - value).total_seconds()
    if seconds < 90:
        return f"{max(seconds, 0):.0f} s ago"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min ago"
    if seconds < 172_800:
        return f"{seconds / 3600:.0f} h ago"
    return f"{seconds / 86400:.0f} days ago"


def setup_label(rec: Mapping[str, Any], with_pricing: bool = True) -> str:
    """'4 x A100 80GB' (with nodes when there are several, and 'on spot' for a spot entry unless the page marks
    it another way)."""
    label = f"{rec['gpus']} x {rec['gpu']}"
    nodes = rec.get("nodes") or 1
    label = f"{label} ({nodes} nodes)" if nodes > 1 else label
    return f"{label} on spot" if with_pricing and rec.get("pricing") == "spot" else label


def amount(value: float) -> str:
    """A submitted quantity as the API returns it (4,194,304 and 512.5, never 4.1943e+06)."""
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,}"


# --- the plans list ------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlanListItem:
    id: str
    status: str
    model: str
    method: str
    created: str
    cheapest: str | None
    cheapest_cost: str | None


def plan_list_item(summary: Any) -> PlanListItem:
    """From the API's PlanSummary (services.plans.service.to_summary)."""
    cheapest = summary.cheapest
    return PlanListItem(
        id=summary.id,
        status=summary.status,
        model=display_name(str(summary.model)),
        method=summary.method,
        created=when(summary.created_at),
        cheapest=f"{setup_label(cheapest)} · {cheapest['provider']}" if cheapest else None,
        cheapest_cost=usd(cheapest.get("expected_cost_usd", cheapest.get("cost_usd"))) if cheapest else None,
    )


# --- one plan ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RecommendationRow:
    index: int
    setup: str
    provider: str
    region: str
    config: str
    peak_gib: float
    card_gib: float
    card: str  # the card's memory as the quote shows it: 22.5, 79.6, 24 (never rounded to whole GiB)
    headroom_gib: float
    fill_pct: float  # peak / card memory, for the small fit bar
    fits: bool
    hours: str
    cost: str
    spot_cost: str
    tokens_per_s: str
    pricing: str = "on demand"  # how the planner ranked this entry: on demand, or on spot with rework
    notes: tuple[str, ...] = ()  # the planner's notes on the setup, word for word (as the quote and CLI show them)


@dataclass(frozen=True)
class RejectionRow:
    gpu: str
    provider: str
    kind: str
    reason: str
    suggestion: str | None  # the change that would make it fit, when the reason does not already say it


# Rejection kinds by the heading they are listed under: the card cannot hold the job, or setups fit
# but break the budget or the deadline, or the plan's region/provider constraints left the offer out.
FIT_KINDS = ("memory", "precision", "gpu_count", "unknown_gpu")
BUDGET_KINDS = ("budget", "deadline", "budget_and_deadline")


def rejection_row(r: Mapping[str, Any]) -> RejectionRow:
    """A stored rejection as shown; the fix (``fix``, or the older ``suggestion``) once, not a second
    time when the reason already ends with it."""
    reason = str(r["reason"])
    fix = r.get("fix") or r.get("suggestion")
    return RejectionRow(
        gpu=r["gpu"],
        provider=r.get("provider") or "every provider",
        kind=str(r["kind"]).replace("_", " "),
        reason=reason,
        suggestion=None if not fix or str(fix) in reason else str(fix),
    )


@dataclass(frozen=True)
class QuoteOption:
    value: str  # "gpu|gpus|provider|region|nodes", parsed back by the quote form
    label: str
    multi_gpu: bool
    spot: bool  # the offer has a spot price, so a spot quote can be asked for
    on_spot: bool = False  # the price in the label is the spot price: the form checks "Spot pricing" for it


@dataclass(frozen=True)
class Fact:
    label: str
    value: str


@dataclass(frozen=True)
class PlanPage:
    id: str
    status: str
    live: bool
    model: str
    method: str
    facts: tuple[Fact, ...]
    error: str | None
    warnings: tuple[str, ...]
    peak: tuple[Fact, ...]
    memory: MemoryChart | None
    memory_narrow: MemoryChart | None  # the same at phone width, so its text stays readable
    memory_caption: str
    recommendations: tuple[RecommendationRow, ...]
    rejections: tuple[RejectionRow, ...]  # the cards that cannot hold the job
    budget_rejections: tuple[RejectionRow, ...]  # setups that fit but break the budget or the deadline
    constraint_rejections: tuple[RejectionRow, ...]  # offers left out by the region or provider constraints
    cost_time: ScatterChart | None
    cost_time_narrow: ScatterChart | None
    candidates: int
    candidate_setups: int  # setups behind the points (identical ones share a point)
    quote_options: tuple[QuoteOption, ...]
    default_quote: str | None
    any_spot: bool
    default_spot: bool = False  # the pre-selected setup is the plan's first, priced on spot
    quotes: tuple[tuple[str, str], ...] = field(default=())  # (id, label) of quotes issued for this plan


def _config(rec: Mapping[str, Any]) -> str:
    parts = [f"micro-batch {rec['micro_batch_size']} x {rec['gradient_accumulation_steps']}"]
    if rec.get("sharding") and rec["sharding"] != "none":
        parts.append(rec["sharding"])
    if rec.get("gradient_checkpointing"):
        parts.append("checkpointing")
    return ", ".join(parts)


def recommendation_row(index: int, rec: Mapping[str, Any]) -> RecommendationRow:
    card = float(rec["gpu_memory_gib"])
    peak = float(rec["peak_gib_per_gpu"])
    return RecommendationRow(
        index=index,
        # The row's pricing is its own badge.
        setup=setup_label(rec, with_pricing=False),
        provider=rec["provider"],
        region=rec.get("region") or "",
        config=_config(rec),
        peak_gib=peak,
        card_gib=card,
        card=card_gib(card),
        headroom_gib=float(rec["headroom_gib"]),
        fill_pct=round(min(100.0, 100.0 * peak / card), 1) if card else 100.0,
        fits=bool(rec.get("fits", True)),
        # The hours of the row's pricing (a spot run's preemptions and waits included), as its quote says.
        hours=duration(rec.get("expected_hours", rec.get("hours"))),
        cost=usd(rec.get("cost_usd")),
        spot_cost=usd(rec.get("spot_cost_usd")),
        tokens_per_s=_tokens_per_s(rec),
        pricing=str(rec.get("pricing", "on_demand")).replace("_", " "),
        notes=setup_notes(rec),
    )


def setup_notes(rec: Mapping[str, Any]) -> tuple[str, ...]:
    """The planner's notes on a setup (services.planner.planner: offload and host RAM, effective batch, stale
    prices, unverified fields, spot risk), as stored: every page shows the same words."""
    return tuple(str(n) for n in rec.get("notes") or ())


def _tokens_per_s(rec: Mapping[str, Any]) -> str:
    """The data set's tokens per second, and beside it the processed rate where padding makes them differ
    (a recommendation stored before padding was counted has only the processed rate)."""
    processed = float(rec["tokens_per_s"])
    data = float(rec.get("data_tokens_per_s") or processed)
    if not padding_shows(processed, data):
        return f"{data:,.0f}"
    return f"{data:,.0f} ({processed:,.0f} with padding)"


def quote_value(rec: Mapping[str, Any]) -> str:
    value = f"{rec['gpu']}|{rec['gpus']}|{rec['provider']}|{rec.get('region') or ''}|{rec.get('nodes') or 1}"
    # The offer's node size names the offer where a provider sells the card in several (plans stored before it
    # was recorded have none).
    return value + (f"|{rec['offer_gpus_per_node']}" if rec.get("offer_gpus_per_node") else "")


@dataclass(frozen=True)
class QuoteChoice:
    """A setup picked in the quote form."""

    gpu: str
    gpus: int
    provider: str
    region: str | None
    nodes: int
    offer_gpus_per_node: int | None = None


def _count(text: str) -> bool:
    """Whether ``text`` is a count a setup can have: ASCII digits (str.isdigit takes "²", which int() refuses: a 500),
    at most six of them (int() refuses past 4,300), not zero."""
    return text.isascii() and text.isdigit() and len(text) <= 6 and int(text) >= 1


def parse_quote_value(value: str) -> QuoteChoice | None:
    """The setup of a quote option's value ("gpu|gpus|provider|region|nodes", then "|offer node size" where known),
    or None when it is malformed."""
    parts = value.split("|")
    if len(parts) not in (5, 6) or not parts[0] or not parts[2] or not _count(parts[1]) or not _count(parts[4]):
        return None
    node = parts[5] if len(parts) == 6 else None
    if node is not None and not _count(node):
        return None
    return QuoteChoice(
        parts[0], int(parts[1]), parts[2], parts[3] or None, int(parts[4]), int(node) if node is not None else None
    )


_SETUP_KEYS = ("provider", "region", "gpu", "gpus", "nodes", "sharding", "micro_batch_size", "gradient_checkpointing")


def _on_demand(candidates: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """One entry per setup: where the planner lists a setup twice (priced on demand and on spot), the
    on-demand entry; a setup listed only on spot stays (its ``cost_usd`` is still the on-demand cost)."""
    with_on_demand = {
        tuple(c.get(k) for k in _SETUP_KEYS) for c in candidates if c.get("pricing", "on_demand") == "on_demand"
    }
    out = []
    for c in candidates:
        key = tuple(c.get(k) for k in _SETUP_KEYS)
        if c.get("pricing", "on_demand") == "on_demand" or key not in with_on_demand:
            out.append(c)
    return out


def cost_time_points(candidates: Sequence[Mapping[str, Any]]) -> list[Point]:
    """Every candidate setup at (hours, on-demand cost), one point per card and position: setups of the
    same card that land on the same spot (another provider or layout at the same price and time) are
    merged and counted. The cheapest and the fastest are marked."""
    setups = _on_demand(candidates)
    if not setups:
        return []
    groups: dict[tuple[str, float, float], list[Mapping[str, Any]]] = {}
    for rec in setups:
        key = (str(rec["gpu"]), round(float(rec["hours"]), 3), round(float(rec["cost_usd"]), 2))
        groups.setdefault(key, []).append(rec)
    merged = list(groups.values())
    cheapest = min(range(len(merged)), key=lambda i: (merged[i][0]["cost_usd"], merged[i][0]["hours"]))
    fastest = min(range(len(merged)), key=lambda i: (merged[i][0]["hours"], merged[i][0]["cost_usd"]))
    points = []
    for i, group in enumerate(merged):
        rec = group[0]
        marks = tuple(m for m, hit in (("cheapest", i == cheapest), ("fastest", i == fastest)) if hit)
        where = f"{duration(rec['hours'])}, {usd(rec['cost_usd'])}"
        names = sorted({f"{setup_label(r)} · {r['provider']}" for r in group})
        label = f"{names[0]}: {where}" if len(group) == 1 else f"{len(group)} setups ({'; '.join(names)}): {where}"
        points.append(
            Point(
                x_value=float(rec["hours"]),
                y_value=float(rec["cost_usd"]),
                label=label,
                series=str(rec["gpu"]),
                marks=marks,
                count=len(group),
            )
        )
    return points


def _expected_cost(c: Mapping[str, Any]) -> float:
    return float(c.get("expected_cost_usd", c["cost_usd"]))


def quote_options(
    candidates: Sequence[Mapping[str, Any]], recommendations: Sequence[Mapping[str, Any]] = ()
) -> tuple[QuoteOption, ...]:
    """One option per setup (card, GPU count, offer, nodes): first the plan's recommendations in the table's
    order, priced as the table prices them, then today's other candidates cheapest first; each labelled
    with the pricing it is cheapest under, the price its quote comes to."""
    every = [*recommendations, *candidates]
    spot = {quote_value(c) for c in every if c.get("spot_price_usd_per_hour") or c.get("spot_cost_usd")}
    seen: set[str] = set()
    options = []
    for c in [*recommendations, *sorted(candidates, key=_expected_cost)]:
        value = quote_value(c)
        if value in seen:
            continue
        seen.add(value)
        on_spot = c.get("pricing") == "spot"
        hours = float(c.get("expected_hours", c["hours"]))
        label = f"{setup_label(c)} · {c['provider']} · {duration(hours)}, {usd(_expected_cost(c))}"
        if value in spot:
            label += " · spot available"
        options.append(
            QuoteOption(value=value, label=label, multi_gpu=c["gpus"] > 1, spot=value in spot, on_spot=on_spot)
        )
    return tuple(options)


def _facts(request: Mapping[str, Any]) -> tuple[Fact, ...]:
    facts = [Fact("precision", str(request.get("precision", "bf16")))]
    lora = request.get("lora") or {}
    if lora.get("rank"):
        facts.append(Fact("LoRA rank", str(lora["rank"])))
    facts.append(
        Fact("micro-batch x sequence", f"{request.get('micro_batch_size', 1):,} x {request.get('seq_len', 2048):,}")
    )
    facts.append(Fact("GPUs as submitted", str(request.get("gpus", 1))))
    if request.get("gradient_checkpointing"):
        facts.append(Fact("gradient checkpointing", "on"))
    dataset = request.get("dataset") or {}
    if dataset.get("tokens"):
        facts.append(Fact("data set", f"{dataset['tokens']:,} tokens"))
    elif dataset.get("examples"):
        facts.append(Fact("data set", f"{dataset['examples']:,} examples x {amount(dataset['avg_tokens'])} tokens"))
    if request.get("epochs"):
        facts.append(Fact("epochs", amount(request["epochs"])))
    constraints = request.get("constraints") or {}
    if constraints.get("budget_usd"):
        facts.append(Fact("budget", usd(constraints["budget_usd"])))
    if constraints.get("deadline_hours"):
        facts.append(Fact("deadline", duration(constraints["deadline_hours"])))
    return tuple(facts)


def plan_page(
    out: Any,
    candidates: Sequence[Mapping[str, Any]],
    quotes: Sequence[tuple[str, str]] = (),
) -> PlanPage:
    """From the API's PlanOut (services.plans.service.to_out) and the candidate setups the planner
    finds for it now (every fitting setup, cheapest first)."""
    request = out.request
    recs = list(out.recommendations)
    estimate = out.estimate or {}
    memory = memory_narrow = None
    peak: tuple[Fact, ...] = ()
    caption = ""
    if estimate:
        mem = estimate["memory"]
        # The axis ends at the recommended (cheapest) card; smaller recommended cards are marked too.
        top_card = float(recs[0]["gpu_memory_gib"]) if recs else 0.0
        cards = [(r["gpu"], float(r["gpu_memory_gib"])) for r in recs if float(r["gpu_memory_gib"]) <= top_card]
        memory = memory_chart(mem["breakdown"], cards)
        memory_narrow = memory_chart(mem["breakdown"], cards, width=NARROW_CHART_PX)
        peak = (
            Fact("peak allocated", gib(mem["peak_allocated_gib"])),
            Fact("peak reserved", gib(mem["peak_reserved_gib"])),
            Fact("peak on the device", gib(mem["peak_device_gib"])),
            Fact("peak moment", str(mem["peak_moment"]).replace("_", " ")),
        )
        caption = (
            f"Per GPU as submitted (micro-batch {request.get('micro_batch_size', 1)}, "
            f"{request.get('gpus', 1)} GPU{'s' if request.get('gpus', 1) != 1 else ''}): "
            f"{mem['peak_device_gib']:.1f} GiB at the {str(mem['peak_moment']).replace('_', ' ')}; "
            + (
                "the axis ends at the memory of the recommended card, and the lines mark the recommended cards. "
                if recs
                else "no card is recommended, so the axis ends 15% past the peak. "
            )
            + "Each recommended setup's own peak is in the table."
        )
    points = cost_time_points(candidates)
    options = quote_options(candidates, recs)
    rejections = [rejection_row(r) for r in out.rejections]
    kinds = [str(r["kind"]) for r in out.rejections]
    return PlanPage(
        id=out.id,
        status=out.status,
        live=out.status in LIVE_STATUSES,
        model=str(_model_name(request)),
        method=str(request.get("method", "full")),
        facts=_facts(request),
        error=out.error,
        warnings=tuple(out.warnings),
        peak=peak,
        memory=memory,
        memory_narrow=memory_narrow,
        memory_caption=caption,
        recommendations=tuple(recommendation_row(i, r) for i, r in enumerate(recs)),
        rejections=tuple(r for r, k in zip(rejections, kinds, strict=True) if k in FIT_KINDS),
        budget_rejections=tuple(r for r, k in zip(rejections, kinds, strict=True) if k in BUDGET_KINDS),
        constraint_rejections=tuple(
            r for r, k in zip(rejections, kinds, strict=True) if k not in BUDGET_KINDS and k not in FIT_KINDS
        ),
        cost_time=scatter(points, *COST_TIME_AXES, styled_series=True) if points else None,
        cost_time_narrow=(
            scatter(points, *COST_TIME_AXES, styled_series=True, width=NARROW_CHART_PX, height=300) if points else None
        ),
        candidates=len(points),
        candidate_setups=sum(p.count for p in points),
        quote_options=options,
        # The table's first row, with its pricing.
        default_quote=options[0].value if options else None,
        any_spot=any(o.spot for o in options),
        default_spot=bool(options) and options[0].on_spot,
        quotes=tuple(quotes),
    )


def _model_name(request: Mapping[str, Any]) -> str:
    model = request.get("model") or {}
    if model.get("name"):
        return display_name(str(model["name"]))
    config = model.get("config") or {}
    return display_name(str(config.get("_name_or_path") or f"custom {config.get('model_type', 'model')} (config.json)"))


# --- inference memory ----------------------------------------------------------------------------


@dataclass(frozen=True)
class FitRow:
    gpu: str
    memory_gib: float
    fits: bool
    headroom_gib: float


@dataclass(frozen=True)
class InferencePage:
    model: str
    facts: tuple[Fact, ...]
    peak: tuple[Fact, ...]
    memory: MemoryChart
    memory_narrow: MemoryChart
    caption: str
    fits: tuple[FitRow, ...]
    warnings: tuple[str, ...]
    assumptions: tuple[str, ...]


# How the page names each served weight format (the plan's ``quantization``).
SERVED_WEIGHTS = {
    "fp8": "fp8",
    "int8": "int8 (LLM.int8)",
    "awq": "int4 AWQ",
    "gptq": "int4 GPTQ",
    "nf4": "int4 NF4",
}


def inference_page(request: Mapping[str, Any], report: Mapping[str, Any]) -> InferencePage:
    """From a plan request with ``mode: inference`` and its estimate (Estimate as JSON)."""
    mem = report["memory"]
    fits = tuple(
        FitRow(
            gpu=f["gpu"], memory_gib=float(f["memory_gib"]), fits=bool(f["fits"]), headroom_gib=float(f["headroom_gib"])
        )
        for f in report.get("fits", [])
    )
    # The axis ends at the smallest card that holds the model, so the bar reads against a real choice.
    smallest = min((f for f in fits if f.fits), key=lambda f: f.memory_gib, default=None)
    cards = [(smallest.gpu, smallest.memory_gib)] if smallest else []
    precision = str(request.get("precision", "bf16"))
    quantization = request.get("quantization")
    sequences = int(request.get("micro_batch_size", 1))
    facts = [
        Fact("serving precision", precision),
        Fact("weights", SERVED_WEIGHTS.get(str(quantization), str(quantization)) if quantization else precision),
        Fact("KV cache", str(request.get("kv_cache_dtype") or ("fp32" if precision == "fp32" else precision))),
        Fact(
            "concurrent sequences x context",
            f"{sequences:,} x {int(request.get('seq_len', 2048)):,} tokens",
        ),
    ]
    return InferencePage(
        model=_model_name(request),
        facts=tuple(facts),
        peak=(
            Fact("peak allocated", gib(mem["peak_allocated_gib"])),
            Fact("peak reserved", gib(mem["peak_reserved_gib"])),
            Fact("peak on the device", gib(mem["peak_device_gib"])),
        ),
        memory=memory_chart(mem["breakdown"], cards),
        memory_narrow=memory_chart(mem["breakdown"], cards, width=NARROW_CHART_PX),
        caption=(
            f"Per GPU for the prefill of every sequence's context, with the KV cache: {mem['peak_device_gib']:.1f} "
            "GiB on the device"
            + (f"; the axis ends at the smallest card that holds it ({smallest.gpu})." if smallest else ".")
        ),
        fits=fits,
        warnings=tuple(report.get("warnings", [])),
        assumptions=tuple(report.get("assumptions", [])),
    )


# --- nodes ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeLifecycle:
    """What the run lifecycle knows of a node: its current run, last durable checkpoint, idle timer and
    latest shutdown decisions (loaders.node_lifecycle)."""

    current_run: str | None = None
    last_durable_checkpoint: str | None = None
    idle_for: str | None = None
    decisions: tuple[tuple[str, str], ...] = ()  # (when, what was decided and why)


@dataclass(frozen=True)
class GpuUse:
    index: int
    utilisation_pct: float | None  # None: the agent could not read this GPU (NVML)
    memory: str


@dataclass(frozen=True)
class NodeRowView:
    id: str
    name: str
    gpu: str
    gpu_count: int
    gpus: tuple[GpuUse, ...]
    mean_utilisation_pct: float | None
    last_heartbeat: str
    stale: bool
    job_running: bool
    provider: str
    price: str
    lifecycle: NodeLifecycle
    status: str = "active"
    status_warn: bool = False  # lost, or a stop that was given up: someone should look
    stop: str | None = None  # the stop in progress or its outcome, with the provider's answer
    sync: str | None = None  # the checkpoint sync's state: failing, bytes not durable, since when
    sync_warn: bool = False  # the node's sync alert is raised


# A node that has not sent a heartbeat for this long is shown as silent.
STALE_HEARTBEAT_S = 300.0

_STATUS_LABELS = {
    "active": "active",
    "stopping": "stopping (waiting for the provider)",
    "stopped": "stopped",
    "stop_failed": "stop failed",
    "lost": "lost",
    "replaced": "replaced",
}


def node_stop(node: Any, now: datetime) -> str | None:
    """The stop state in one line: attempts, when the next is due, and what the provider answered."""
    answer = node.last_stop_answer or "no answer recorded"
    attempts = node.stop_attempts
    if node.status == "stop_failed":
        retry = (
            f"; retried after {node.next_stop_at:%Y-%m-%d %H:%M:%S} UTC if it still reports idle"
            if node.next_stop_at is not None
            else ""
        )
        return f"given up after {attempts} attempt(s); last answer: {answer}{retry}"
    if node.status == "stopping":
        return f"attempt {attempts} sent {ago(node.last_stop_at, now)}"
    if node.status == "stopped":
        return f"stopped {ago(node.stopped_at, now)} (attempt {attempts}): {answer}"
    if attempts and node.next_stop_at is not None:
        return f"attempt {attempts} failed: {answer}; next attempt after {node.next_stop_at:%Y-%m-%d %H:%M:%S} UTC"
    return None


def node_sync(node: Any, now: datetime) -> str | None:
    """The sync state in one line: the alert if raised, else a failing pass or what is not durable yet."""
    if node.sync_alert:
        return str(node.sync_alert)
    pending = f"{node.sync_pending_bytes / 2**30:.2f} GiB not durable" if node.sync_pending_bytes else None
    if node.sync_error:
        return f"failing since {ago(node.sync_failing_since, now)}: {node.sync_error}" + (
            f"; {pending}" if pending else ""
        )
    if pending:
        return f"{pending}, pending since {ago(node.unsynced_since, now)}"
    return None


def node_row(node: Any, lifecycle: NodeLifecycle, now: datetime) -> NodeRowView:
    """From the API's NodeOut."""
    gpus = tuple(
        GpuUse(index=int(g.get("index", i)), utilisation_pct=None, memory="state unreadable (NVML)")
        if g.get("utilisation_pct", 0.0) is None
        else GpuUse(
            index=int(g.get("index", i)),
            utilisation_pct=float(g.get("utilisation_pct", 0.0)),
            memory=f"{g.get('memory_used_gib') or 0:.1f} / {card_gib(g.get('memory_total_gib') or 0)} GiB",
        )
        for i, g in enumerate(node.gpus)
    )
    read = [g.utilisation_pct for g in gpus if g.utilisation_pct is not None]
    beat = node.last_heartbeat_at
    return NodeRowView(
        id=node.id,
        name=node.name,
        gpu=node.gpu,
        gpu_count=node.gpu_count,
        gpus=gpus,
        mean_utilisation_pct=round_half_away(sum(read) / len(read), 1) if read else None,
        last_heartbeat=ago(beat, now),
        # Only a node meant to be running is "silent" when it stops reporting.
        stale=node.status in ("active", "stopping")
        and (beat is None or (now - beat).total_seconds() > STALE_HEARTBEAT_S),
        job_running=node.job_running,
        provider=node.provider or "—",
        price=f"{usd_per_hour(node.usd_per_hour)}/h" if node.usd_per_hour is not None else "—",
        lifecycle=lifecycle,
        status=_STATUS_LABELS.get(node.status, node.status),
        status_warn=node.status in ("stop_failed", "lost"),
        stop=node_stop(node, now),
        sync=node_sync(node, now),
        sync_warn=bool(node.sync_alert),
    )


# --- benchmarks ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchmarkPage:
    memory: ScatterChart | None
    tokens: ScatterChart | None
    calibration_count: int
    public_count: int
    public_caption: str
    series: tuple[str, ...]


def benchmark_points(
    calibrations: Sequence[Any], public_cases: Sequence[Mapping[str, Any]]
) -> tuple[list[Point], list[Point]]:
    """(memory points, tokens/s points) at (measured, predicted): the organization's calibration results
    (BenchmarkOut) and the public accuracy cases."""
    memory: list[Point] = []
    tokens: list[Point] = []
    for b in calibrations:
        name = f"{b.model_name} {b.method} on {b.gpu}"
        if b.peak_allocated_gib and b.predicted_peak_allocated_gib:
            memory.append(
                Point(
                    b.peak_allocated_gib,
                    b.predicted_peak_allocated_gib,
                    f"{name}: measured {b.peak_allocated_gib:.1f} GiB, predicted {b.predicted_peak_allocated_gib:.1f}",
                    "calibration",
                )
            )
        if b.tokens_per_s and b.predicted_tokens_per_s:
            tokens.append(
                Point(
                    b.tokens_per_s,
                    b.predicted_tokens_per_s,
                    f"{name}: measured {b.tokens_per_s:,.0f} tokens/s, predicted {b.predicted_tokens_per_s:,.0f}",
                    "calibration",
                )
            )
    for c in public_cases:
        if c.get("measured_gib") and c.get("predicted_gib"):
            memory.append(
                Point(
                    c["measured_gib"],
                    c["predicted_gib"],
                    f"{c['id']} ({c['gpu']}, {c['metric']}): measured {c['measured_gib']:.1f} GiB, "
                    f"predicted {c['predicted_gib']:.1f}",
                    "public",
                )
            )
        if c.get("measured_tokens_per_s") and c.get("predicted_tokens_per_s"):
            tokens.append(
                Point(
                    c["measured_tokens_per_s"],
                    c["predicted_tokens_per_s"],
                    f"{c['id']} ({c['gpu']}): measured {c['measured_tokens_per_s']:,.0f} tokens/s, "
                    f"predicted {c['predicted_tokens_per_s']:,.0f}",
                    "public",
                )
            )
    return memory, tokens


def benchmark_page(
    calibrations: Sequence[Any], public_cases: Sequence[Mapping[str, Any]], public_caption: str
) -> BenchmarkPage:
    memory, tokens = benchmark_points(calibrations, public_cases)
    return BenchmarkPage(
        memory=scatter(memory, "measured peak (GiB)", "predicted peak (GiB)", identity=True) if memory else None,
        tokens=scatter(tokens, "measured tokens/s", "predicted tokens/s", identity=True) if tokens else None,
        calibration_count=len(calibrations),
        public_count=len(public_cases),
        public_caption=public_caption,
        series=tuple(sorted({p.series for p in (*memory, *tokens)})),
    )
