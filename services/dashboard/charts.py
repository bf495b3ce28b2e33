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
    "kv_cache": "KV cache",
    "logits_and_loss": "logits and loss",
    "logits": "logits",
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


# A component this small still gets this many pixels, so a thin segment stays visible and hoverable.
MIN_SEGMENT_PX = 4.0
# Without a recommended card, the axis ends this far past the peak.
PEAK_AXIS_MARGIN = 1.15


def segment_widths(values: Sequence[float], length_px: float, min_px: float = MIN_SEGMENT_PX) -> list[float]:
    """Widths proportional to ``values`` that sum to ``length_px``, where none is under ``min_px``: the
    small ones get the minimum and the rest share what is left in proportion."""
    total = sum(values)
    if not values or total <= 0:
        return [0.0 for _ in values]
    if length_px <= min_px * len(values):
        return [length_px / len(values) for _ in values]
    small: set[int] = set()
    while True:
        rest = length_px - min_px * len(small)
        big_total = sum(v for i, v in enumerate(values) if i not in small)
        newly = {i for i, v in enumerate(values) if i not in small and v / big_total * rest < min_px}
        if not newly:
            return [min_px if i in small else v / big_total * rest for i, v in enumerate(values)]
        small |= newly


def memory_chart(breakdown: dict[str, float], cards: Sequence[tuple[str, float]], width: float = 720.0) -> MemoryChart:
    """One segment per memory component above zero (in the estimate's order), against an axis that
    ends at the largest card given (the recommended card; cards of equal memory share one marker), or
    at the peak plus 15% without one or when the peak is larger (the plan as submitted may need more
    than the recommended setup), so a small job fills the bar instead of being a sliver. Every
    segment is at least MIN_SEGMENT_PX wide; the legend gives each one's GiB."""
    left, right = 8.0, 16.0
    parts = [(k, v) for k, v in breakdown.items() if v > 0]
    total = sum(v for _, v in parts)
    by_gib: dict[float, list[str]] = {}
    for name, gib in cards:
        names = by_gib.setdefault(round(gib, 1), [])
        if name not in names:
            names.append(name)
    labels = {gib: f"{', '.join(names)}: {gib:g} GiB" for gib, names in by_gib.items()}
    on_card = bool(by_gib) and max(by_gib) >= total
    top = (max(by_gib) if on_card else total * PEAK_AXIS_MARGIN) or 1.0
    ticks_raw = nice_ticks(0.0, top, 6)
    hi = top if on_card else max(ticks_raw[-1], top)
    # Every card label ends at its line, so the left margin grows until each fits: the line of a card
    # of g GiB sits at left + g / hi x (plot width - left), which must be at least the label's width.
    usable = width - right
    left = max([left] + [(_label_width(labels[g]) - g / hi * usable) / (1 - g / hi) for g in labels if g < hi])
    scale = Scale(0.0, hi, left, width - right)
    widths = segment_widths([gib for _, gib in parts], scale(total) - scale(0.0))
    segments = []
    x = scale(0.0)
    for index, ((key, gib), w) in enumerate(zip(parts, widths, strict=True)):
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
        height=bar_y + bar_height + 44,
        bar_y=bar_y,
        bar_height=bar_height,
        total_gib=round(total, 3),
        segments=tuple(segments),
        markers=tuple(markers),
        ticks=tuple(Tick(t, round(scale(t), 2), tick_label(t)) for t in ticks_raw if t <= scale.hi * (1 + 1e-9)),
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
    count: int = 1  # identical setups drawn as this one point


@dataclass(frozen=True)
class PlacedPoint:
    point: Point
    cx: float
    cy: float
    style: int = -1  # the series' colour and shape slot (CSS class style-N), -1: drawn by its series name
    path: str = ""  # the marker's outline as SVG path data, when it is drawn by shape


@dataclass(frozen=True)
class MarkLabel:
    text: str
    x: float
    y: float  # text baseline
    anchor: str  # SVG text-anchor


@dataclass(frozen=True)
class LegendEntry:
    series: str
    style: int
    path: str  # the shape at (8, 8) in a 16 x 16 swatch
    count: int  # points of this series


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
    mark_labels: tuple[MarkLabel, ...] = ()
    legend: tuple[LegendEntry, ...] = ()


# Colour slots (CSS style-N) and shapes: series i gets colour i mod 8 and shape i mod 5, so up to 40
# series look different even to someone who cannot tell the colours apart.
STYLE_COLOURS = 8
SHAPES = ("circle", "square", "triangle", "diamond", "triangle-down")
POINT_RADIUS_PX = 5.0
MARK_RADIUS_PX = 11.0
LABEL_HEIGHT_PX = 14.0


def shape_path(shape: str, cx: float, cy: float, r: float = POINT_RADIUS_PX) -> str:
    """SVG path data of a marker of about the same area for each shape, centred on (cx, cy)."""

    def pts(*xy: tuple[float, float]) -> str:
        return "M" + " L".join(f"{cx + dx:.2f},{cy + dy:.2f}" for dx, dy in xy) + " Z"

    if shape == "square":
        s = r * 0.89
        return pts((-s, -s), (s, -s), (s, s), (-s, s))
    if shape == "triangle":
        return pts((0, -1.2 * r), (1.1 * r, 0.8 * r), (-1.1 * r, 0.8 * r))
    if shape == "triangle-down":
        return pts((0, 1.2 * r), (1.1 * r, -0.8 * r), (-1.1 * r, -0.8 * r))
    if shape == "diamond":
        d = r * 1.25
        return pts((0, -d), (d, 0), (0, d), (-d, 0))
    return f"M{cx - r:.2f},{cy:.2f} a{r:g},{r:g} 0 1,0 {2 * r:g},0 a{r:g},{r:g} 0 1,0 {-2 * r:g},0 Z"


def _overlap(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> float:
    """Area shared by two boxes (x0, y0, x1, y1)."""
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    return w * h if w > 0 and h > 0 else 0.0


def place_mark_labels(
    placed: Sequence[PlacedPoint], bounds: tuple[float, float, float, float]
) -> tuple[MarkLabel, ...]:
    """A label beside each marked point, at the candidate position that covers the fewest points and
    earlier labels and stays inside ``bounds`` (x0, y0, x1, y1)."""
    r = POINT_RADIUS_PX * 1.3  # the largest shape's reach (triangles and diamonds poke out of the circle)
    boxes = [(p.cx - r, p.cy - r, p.cx + r, p.cy + r) for p in placed]
    taken: list[tuple[float, float, float, float]] = []
    out = []
    gap = MARK_RADIUS_PX + 3
    for p in placed:
        if not p.point.marks:
            continue
        text = " and ".join(p.point.marks)
        w, h = _label_width(text), LABEL_HEIGHT_PX
        # (x of the anchor, baseline y, anchor, box left); right, left, above, below, then the diagonals.
        options = [
            (p.cx + gap, p.cy + 4, "start", p.cx + gap),
            (p.cx - gap, p.cy + 4, "end", p.cx - gap - w),
            (p.cx, p.cy - gap - 2, "middle", p.cx - w / 2),
            (p.cx, p.cy + gap + h - 2, "middle", p.cx - w / 2),
            (p.cx + gap, p.cy - gap, "start", p.cx + gap),
            (p.cx - gap, p.cy - gap, "end", p.cx - gap - w),
            (p.cx + gap, p.cy + gap + h - 4, "start", p.cx + gap),
            (p.cx - gap, p.cy + gap + h - 4, "end", p.cx - gap - w),
        ]
        scored = []
        for order, (x, y, anchor, x0) in enumerate(options):
            box = (x0, y - h + 3, x0 + w, y + 3)
            outside = max(0.0, bounds[0] - box[0]) + max(0.0, box[2] - bounds[2])
            outside += max(0.0, bounds[1] - box[1]) + max(0.0, box[3] - bounds[3])
            cost = sum(_overlap(box, b) for b in boxes) + 4 * sum(_overlap(box, b) for b in taken)
            scored.append((cost + 100 * outside + order * 0.01, MarkLabel(text, round(x, 2), round(y, 2), anchor), box))
        _, label, box = min(scored, key=lambda item: item[0])
        out.append(label)
        taken.append(box)
    return tuple(out)


def scatter(
    points: Sequence[Point],
    x_title: str,
    y_title: str,
    *,
    identity: bool = False,
    styled_series: bool = False,
    width: float = 640.0,
    height: float = 380.0,
) -> ScatterChart:
    """Place points on two axes (log where the values span more than 20x). With ``identity``, both axes
    share one domain so the y = x line is the diagonal of equal predicted and measured values. With
    ``styled_series``, each series gets its own colour and shape and a legend entry, in order of first
    appearance."""
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
    styles: dict[str, int] = {}
    if styled_series:
        for p in points:
            styles.setdefault(p.series, len(styles))
    placed = []
    for p in points:
        cx, cy = round(sx(p.x_value), 2), round(sy(p.y_value), 2)
        style = styles.get(p.series, -1)
        path = shape_path(SHAPES[style % len(SHAPES)], cx, cy) if style >= 0 else ""
        placed.append(PlacedPoint(p, cx, cy, style, path))
    line = None
    if identity:
        line = (round(sx(x_lo), 2), round(sy(x_lo), 2), round(sx(x_hi), 2), round(sy(x_hi), 2))
    counts: dict[str, int] = {}
    for p in points:
        counts[p.series] = counts.get(p.series, 0) + 1
    legend = tuple(
        LegendEntry(series, style, shape_path(SHAPES[style % len(SHAPES)], 8, 8), counts[series])
        for series, style in styles.items()
    )
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
        points=tuple(placed),
        identity=line,
        # Labels may run into the right margin, never off the drawing or onto the axes' numbers.
        mark_labels=place_mark_labels(placed, (left, 0.0, width, bottom)),
        legend=legend,
    )
