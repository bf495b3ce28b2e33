"""Chart geometry for the dashboard's inline SVG (pure: numbers in, coordinates out, no I/O).

Templates only place what these functions compute, so the pictures are tested as data: a segment's
width is its share of the axis, a point sits where its scale puts it, the identity line joins equal
values.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# Characters are about this wide in the charts' 12 px sans-serif labels (for label collision only).
LABEL_PX_PER_CHAR = 7.0


@dataclass(frozen=True)
class Scale:
    """Maps [lo, hi] onto [px_lo, px_hi], linearly or logarithmically (log needs lo > 0)."""

    lo: float
    hi: float
    px_lo: float
    px_hi: float
    log: bool = False

    def __call__(self, value: float) -> float:
        if self.log:
            lo, hi, v = math.log10(self.lo), math.log10(self.hi), math.log10(max(value, self.lo))
        else:
            lo, hi, v = self.lo, self.hi, value
        if hi == lo:
            return (self.px_lo + self.px_hi) / 2
        return self.px_lo + (v - lo) / (hi - lo) * (self.px_hi - self.px_lo)

    def ticks(self, count: int = 5) -> list[float]:
        return log_ticks(self.lo, self.hi) if self.log else nice_ticks(self.lo, self.hi, count)


def _nice_step(span: float, count: int) -> float:
    raw = span / max(count, 1)
    magnitude = 10.0 ** math.floor(math.log10(raw))
    for mult in (1, 2, 2.5, 5, 10):
        if raw <= mult * magnitude:
            return mult * magnitude
    return 10 * magnitude


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values (1, 2, 2.5 or 5 x 10^k apart) covering [lo, hi]."""
    if hi <= lo:
        return [lo]
    step = _nice_step(hi - lo, count)
    first = math.ceil(lo / step - 1e-9) * step
    ticks = []
    value = first
    while value <= hi + step * 1e-9:
        ticks.append(round(value, 10))
        value += step
    return ticks


def log_ticks(lo: float, hi: float) -> list[float]:
    """1, 2, 5 x 10^k ticks within [lo, hi] (powers of ten only when that gives more than eight)."""
    out: list[float] = []
    for exp in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1):
        for mult in (1, 2, 5):
            value = mult * 10.0**exp
            if lo * (1 - 1e-9) <= value <= hi * (1 + 1e-9):
                out.append(value)
    if len(out) > 8:
        out = [v for v in out if math.isclose(10 ** round(math.log10(v)), v)]
    return out


def padded_domain(values: Sequence[float], log: bool) -> tuple[float, float]:
    """[lo, hi] around the values with a little room (a factor in log space, 5% of the span otherwise)."""
    lo, hi = min(values), max(values)
    if log:
        return lo / 1.25, hi * 1.25
    if hi == lo:
        pad = abs(hi) * 0.1 or 1.0
        return lo - pad, hi + pad
    pad = (hi - lo) * 0.05
    return max(0.0, lo - pad) if lo >= 0 else lo - pad, hi + pad


def wants_log(values: Sequence[float], ratio: float = 20.0) -> bool:
    """A log axis when positive values span more than ``ratio`` times."""
    positive = [v for v in values if v > 0]
    return len(positive) == len(values) and bool(positive) and max(positive) / min(positive) > ratio


def tick_label(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1000:
        return f"{value / 1000:g}k"
    if abs(value) >= 1:
        return f"{value:g}"
    return f"{value:.2g}"


# --- the memory breakdown: one stacked bar against the cards' memory -----------------------------


@dataclass(frozen=True)
class Segment:
    key: str
    label: str
    gib: float
    share_pct: float
    x: float
    width: float
    index: int  # colour slot (CSS class seg-N)


@dataclass(frozen=True)
class Marker:
    label: str
    gib: float
    x: float
    label_row: int  # 0, 1, 2...: labels of close markers are stacked so they do not overlap


@dataclass(frozen=True)
class Tick:
    value: float
    pos: float
    label: str


@dataclass(frozen=True)
class MemoryChart:
    width: float
    height: float
    bar_y: float
    bar_height: float
    total_gib: float
    segments: tuple[Segment, ...]
    markers: tuple[Marker, ...]
    ticks: tuple[Tick, ...]
    marker_top: float


COMPONENT_LABELS = {
    "weights": "weights",
    "adapters": "LoRA adapters",
    "gradients": "gradients",
    "optimizer_states": "optimizer states",
    "master_weights": "fp32 master weights",
    "activations": "activations",
    "logits_and_loss": "logits and loss",
    "allocator_reserve": "allocator reserve",
    "cuda_context": "CUDA context",
}


def component_label(key: str) -> str:
    return COMPONENT_LABELS.get(key, key.replace("_", " "))


def _label_width(label: str) -> float:
    return len(label) * LABEL_PX_PER_CHAR + 4


def _place_markers(items: Sequence[tuple[str, float, float]]) -> list[Marker]:
    """Stack card labels in rows so that no two labels overlap and no card's line crosses a label.

    Each label ends at its card's line, and each line runs from its own label's row down to the bar,
    passing behind every label in a lower row. Placing from the rightmost card leftwards, a card goes
    in the first row below every label its line would cross, where its label clears the others.
    """
    placed: list[tuple[float, float, int]] = []  # label span start, end, row
    out: list[Marker] = []
    for label, gib, x in sorted(items, key=lambda item: -item[2]):
        start, end = x - _label_width(label), x
        row = 1 + max((r for s, e, r in placed if s <= x <= e), default=-1)
        while any(r == row and start < e + 6 and s < end + 6 for s, e, r in placed):
            row += 1
        placed.append((start, end, row))
        out.append(Marker(label=label, gib=gib, x=round(x, 2), label_row=row))
    return sorted(out, key=lambda m: m.x)


def memory_chart(breakdown: dict[str, float], cards: Sequence[tuple[str, float]], width: float = 720.0) -> MemoryChart:
    """One segment per memory component above zero (in the estimate's order), and a marker at the
    memory of each card (cards of equal memory share one marker)."""
    left, right = 8.0, 16.0
    parts = [(k, v) for k, v in breakdown.items() if v > 0]
    total = sum(v for _, v in parts)
    by_gib: dict[float, list[str]] = {}
    for name, gib in cards:
        names = by_gib.setdefault(round(gib, 1), [])
        if name not in names:
            names.append(name)
    labels = {gib: f"{', '.join(names)}: {gib:g} GiB" for gib, names in by_gib.items()}
    top = max([total, *by_gib.keys()], default=1.0) or 1.0
    ticks_raw = nice_ticks(0.0, top * 1.05, 6)
    hi = max(ticks_raw[-1], top)
    # Every card label ends at its line, so the left margin grows until each fits: the line of a card
    # of g GiB sits at left + g / hi x (plot width - left), which must be at least the label's width.
    usable = width - right
    left = max([left] + [(_label_width(labels[g]) - g / hi * usable) / (1 - g / hi) for g in labels if g < hi])
    scale = Scale(0.0, hi, left, width - right)
    segments = []
    x = scale(0.0)
    for index, (key, gib) in enumerate(parts):
        w = scale(gib) - scale(0.0)
        segments.append(
            Segment(
                key=key,
                label=component_label(key),
                gib=gib,
                share_pct=100.0 * gib / total if total else 0.0,
                x=round(x, 2),
                width=round(w, 2),
                index=index % 9,
            )
        )
        x += w
    markers = _place_markers([(labels[gib], gib, scale(gib)) for gib in sorted(by_gib)])
    row_count = max((m.label_row + 1 for m in markers), default=1)
    marker_top = 4.0
    bar_y = marker_top + 16.0 * row_count + 6
    bar_height = 40.0
    return MemoryChart(
        width=width,
        height=bar_y + bar_height + 28,
        bar_y=bar_y,
        bar_height=bar_height,
        total_gib=round(total, 3),
        segments=tuple(segments),
        markers=tuple(markers),
        ticks=tuple(Tick(t, round(scale(t), 2), tick_label(t)) for t in ticks_raw if t <= scale.hi),
        marker_top=marker_top,
    )


# --- scatter charts: cost versus time, predicted versus measured ---------------------------------


@dataclass(frozen=True)
class Point:
    x_value: float
    y_value: float
    label: str
    series: str = ""
    marks: tuple[str, ...] = ()  # e.g. ("cheapest",), ("fastest",)


@dataclass(frozen=True)
class PlacedPoint:
    point: Point
    cx: float
    cy: float


@dataclass(frozen=True)
class ScatterChart:
    width: float
    height: float
    plot_left: float
    plot_top: float
    plot_right: float
    plot_bottom: float
    x_title: str
    y_title: str
    x_log: bool
    y_log: bool
    x_ticks: tuple[Tick, ...]
    y_ticks: tuple[Tick, ...]
    points: tuple[PlacedPoint, ...]
    identity: tuple[float, float, float, float] | None  # x1, y1, x2, y2 of the y = x line


def scatter(
    points: Sequence[Point],
    x_title: str,
    y_title: str,
    *,
    identity: bool = False,
    width: float = 640.0,
    height: float = 380.0,
) -> ScatterChart:
    """Place points on two axes (log where the values span more than 20x). With ``identity``, both axes
    share one domain so the y = x line is the diagonal of equal predicted and measured values."""
    left, top, right, bottom = 64.0, 12.0, width - 16.0, height - 48.0
    xs = [p.x_value for p in points] or [1.0]
    ys = [p.y_value for p in points] or [1.0]
    if identity:
        both = xs + ys
        log = wants_log(both)
        x_lo, x_hi = padded_domain(both, log)
        if not log:
            x_lo = 0.0
        y_lo, y_hi, x_log, y_log = x_lo, x_hi, log, log
    else:
        x_log, y_log = wants_log(xs), wants_log(ys)
        x_lo, x_hi = padded_domain(xs, x_log)
        y_lo, y_hi = padded_domain(ys, y_log)
    sx = Scale(x_lo, x_hi, left, right, x_log)
    sy = Scale(y_lo, y_hi, bottom, top, y_log)
    placed = tuple(PlacedPoint(p, round(sx(p.x_value), 2), round(sy(p.y_value), 2)) for p in points)
    line = None
    if identity:
        line = (round(sx(x_lo), 2), round(sy(x_lo), 2), round(sx(x_hi), 2), round(sy(x_hi), 2))
    return ScatterChart(
        width=width,
        height=height,
        plot_left=left,
        plot_top=top,
        plot_right=right,
        plot_bottom=bottom,
        x_title=x_title,
        y_title=y_title,
        x_log=x_log,
        y_log=y_log,
        x_ticks=tuple(Tick(t, round(sx(t), 2), tick_label(t)) for t in sx.ticks()),
        y_ticks=tuple(Tick(t, round(sy(t), 2), tick_label(t)) for t in sy.ticks()),
        points=placed,
        identity=line,
    )
