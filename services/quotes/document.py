"""The quote as a document a provider can send: one content model, rendered as HTML and as PDF (fpdf2).

Both renderings come from :func:`quote_document`, so the page, the HTML file and the PDF say the same
thing: who it is for, what job on which model, the setup and its notes (the planner's words), the cost
lines adding up to the plan's number, what it assumes, and where the price comes from.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jinja2

from services.core.money import usd as dollars
from services.quotes.schemas import PriceList, QuoteOut


@dataclass(frozen=True)
class Fact:
    label: str
    value: str


@dataclass(frozen=True)
class Line:
    description: str
    quantity: str
    unit: str
    unit_price: str
    amount: str


@dataclass(frozen=True)
class QuoteDocument:
    id: str
    plan_id: str
    number: str
    issued: str
    valid_until: str
    expired: bool  # valid_until passed when the document was rendered: it says so, not only the date
    customer: tuple[str, ...]  # name, email: the lines of the address block
    issuer: str
    job: tuple[Fact, ...]  # model, method, job
    setup: tuple[Fact, ...]
    notes: tuple[str, ...]
    lines: tuple[Line, ...]
    job_cost: str
    total: str
    currency: str
    assumptions: tuple[str, ...]
    plan_assumptions: tuple[str, ...]
    price_source: str

    @property
    def expiry_words(self) -> str:
        """What follows "Expired:" at the head of an expired quote's document, in the HTML and the PDF alike."""
        return f"this quote was valid until {self.valid_until} and is no longer an offer; ask for a new quote."


def usd(value: float | None) -> str:
    return "-" if value is None else dollars(value)


def gib(value: float) -> str:
    """A card's memory as the setup has it (22.5, 79.6; 24 for 24.0): rounded to whole GiB, "13.7 GiB of 22 GiB"
    beside "8.8 GiB headroom" did not add up."""
    return f"{value:,.1f}".removesuffix(".0")


def to_decimals(value: float, most: int) -> str:
    """``value`` to the decimals it has, at least 2 and at most ``most`` (1,234.5 -> "1,234.50", 0.0045 -> "0.0045")."""
    whole, _, decimals = f"{value:,.{most}f}".partition(".")
    return f"{whole}.{decimals.rstrip('0').ljust(2, '0')}"


def quantity(value: float) -> str:
    """A line's quantity to the decimals it has (at most 6: services.quotes.service.line_quantity), so quantity times
    unit price is the amount shown."""
    return to_decimals(value, 6)


def _when(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def _hours(value: Any) -> str:
    if value is None:
        return "-"
    h = float(value)
    return f"{h * 60:.0f} min" if h < 1 else f"{h:,.1f} h"


def pricing_words(pricing: Any) -> str:
    """The setup's pricing as a reader says it: the API's on_demand (and the on-demand of quotes issued before it)
    is "on demand"."""
    if pricing in (None, "on_demand", "on-demand"):
        return "on demand"
    return str(pricing)


def setup_facts(s: dict[str, Any]) -> tuple[Fact, ...]:
    """What the setup is, in the order a reader checks it."""
    nodes = int(s.get("nodes") or 1)
    where = f"{s.get('provider', '')} ({s['region']})" if s.get("region") else str(s.get("provider", ""))
    facts = [
        Fact("setup", f"{s.get('gpus')} x {s.get('gpu')}" + (f" on {nodes} nodes" if nodes > 1 else "")),
        Fact("provider", where),
        Fact("pricing", pricing_words(s.get("pricing"))),
        Fact("expected duration", _hours(s.get("expected_hours", s.get("hours")))),
        Fact(
            "per GPU",
            f"{float(s.get('peak_gib_per_gpu') or 0):.1f} GiB of {gib(float(s.get('gpu_memory_gib') or 0))} GiB",
        ),
    ]
    if s.get("cpu_offload"):
        ram = s.get("host_ram_gib_per_node")
        facts.append(
            Fact("CPU offload", f"yes: about {float(ram):,.0f} GiB of host RAM per node" if ram is not None else "yes")
        )
    config = [f"micro-batch {s.get('micro_batch_size')} x {s.get('gradient_accumulation_steps')} accumulation"]
    if s.get("effective_batch_size"):
        config.append(f"effective batch {s['effective_batch_size']}")
    if s.get("sharding") and s["sharding"] != "none":
        config.append(str(s["sharding"]))
    if s.get("gradient_checkpointing"):
        config.append("gradient checkpointing")
    facts.append(Fact("configuration", ", ".join(config)))
    rate = s.get("data_tokens_per_s") or s.get("tokens_per_s") or 0
    facts.append(Fact("throughput", f"{float(rate):,.0f} tokens/s"))
    return tuple(facts)


def price_source(price: PriceList | None) -> str:
    """Where the price comes from, in a line: the provider's list (and region, where it has one), its source and
    date, and its age when quoted."""
    if price is None:
        return "the provider catalog at quote time"
    where = f"{price.provider} price list" + (f" ({price.region})" if price.region else "")
    age = f" ({price.age_hours / 24:,.1f} days old when quoted)" if price.age_hours is not None else ""
    return f"{where}: {price.source + ', ' if price.source else ''}prices of {price.fetched_at}{age}"


def quote_document(out: QuoteOut) -> QuoteDocument:
    """The document of an issued quote (services.quotes.service.to_out)."""
    customer = tuple(v for v in (out.customer.name, out.customer.email) if v)
    job = [Fact("model", out.model), Fact("method", out.method), Fact("job", out.job)]
    source = price_source(out.price_list)
    return QuoteDocument(
        id=out.id,
        plan_id=out.plan_id,
        number=out.number,
        issued=_when(out.created_at),
        # To the minute, as the JSON and the dashboard's list have it: a quote issued at 13:26 expires at 13:26, and
        # "Valid until 2026-12-21" read as the whole of that day.
        valid_until=_when(out.valid_until),
        expired=out.expired,
        customer=customer or ("(no customer given)",),
        issuer=out.issuer,
        job=tuple(f for f in job if f.value),
        setup=setup_facts(out.setup),
        notes=tuple(out.notes),
        lines=tuple(
            Line(
                description=i.description,
                quantity=quantity(i.quantity),
                unit=i.unit,
                unit_price=f"${i.unit_price_usd:,.4f}",
                amount=usd(i.amount_usd),
            )
            for i in out.line_items
        ),
        job_cost=usd(out.job_cost_usd),
        total=usd(out.total_usd),
        currency=out.currency,
        assumptions=tuple(out.assumptions),
        plan_assumptions=tuple(out.plan_assumptions),
        price_source=source,
    )


_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("services.quotes", "templates"), autoescape=True, undefined=jinja2.StrictUndefined
)


def render_html(doc: QuoteDocument) -> str:
    """A standalone HTML file of the quote (styles inline: it is sent, not served)."""
    return _ENV.get_template("quote_document.html").render(doc=doc)


# DejaVu Sans, embedded (services/quotes/fonts, with its licence): the core PDF fonts cover Latin-1 alone, so a
# customer "Łódź Sp. z o.o." printed as "?ód? Sp. z o.o." and a euro sign as "?". fpdf2 embeds only the glyphs used.
_FONTS = Path(__file__).with_name("fonts")
_FAMILY = "DejaVu"
_STYLES = {"": "DejaVuSans.ttf", "B": "DejaVuSans-Bold.ttf"}


@functools.cache
def _covered() -> frozenset[int]:
    """The code points both faces draw (fontTools, which fpdf2 reads fonts with)."""
    from fontTools.ttLib import TTFont

    covered: frozenset[int] | None = None
    for name in _STYLES.values():
        with TTFont(_FONTS / name) as font:
            points = frozenset(font.getBestCmap())
        covered = points if covered is None else covered & points
    assert covered is not None
    return covered


def _pdf_text(text: str) -> str:
    """``text`` as the PDF can draw it: a character the font has no glyph for (Chinese, for one) is written as its
    code point, [U+674E], rather than dropped or drawn as "?"; the HTML rendering shows it as written."""
    covered = _covered()
    return "".join(c if c == "\n" or ord(c) in covered else f"[U+{ord(c):04X}]" for c in text)


def render_pdf(doc: QuoteDocument) -> bytes:
    """The quote as PDF (fpdf2, A4, DejaVu Sans embedded)."""
    from fpdf import FPDF
    from fpdf.enums import XPos, YPos

    pdf = FPDF(format="A4")
    for style, name in _STYLES.items():
        pdf.add_font(_FAMILY, style=style, fname=_FONTS / name)
    pdf.set_title(f"Quote {doc.number}")
    pdf.set_author(doc.issuer)
    pdf.set_auto_page_break(auto=True, margin=15)
    pdf.add_page()
    width = pdf.w - pdf.l_margin - pdf.r_margin

    def text(value: str, size: float = 10, style: str = "", height: float = 5) -> None:
        pdf.set_font(_FAMILY, style=style, size=size)
        pdf.multi_cell(width, height, _pdf_text(value), new_x=XPos.LMARGIN, new_y=YPos.NEXT)

    def heading(value: str) -> None:
        pdf.ln(3)
        text(value, size=12, style="B", height=7)

    def facts(items: tuple[Fact, ...]) -> None:
        for f in items:
            pdf.set_font(_FAMILY, style="B", size=10)
            pdf.cell(42, 5, _pdf_text(f.label))
            pdf.set_font(_FAMILY, size=10)
            pdf.multi_cell(width - 42, 5, _pdf_text(f.value), new_x=XPos.LMARGIN, new_y=YPos.NEXT)

    def bullets(items: tuple[str, ...]) -> None:
        for item in items:
            text(f"- {item}", size=9, height=4.5)

    text(f"Quote {doc.number}", size=18, style="B", height=10)
    text(f"Issued {doc.issued} by {doc.issuer}. Valid until {doc.valid_until}", size=9)
    if doc.expired:
        text(f"Expired: {doc.expiry_words}", size=10, style="B")
    heading("For")
    for address in doc.customer:
        text(address)
    heading("Job")
    facts(doc.job)
    heading("Setup")
    facts(doc.setup)
    if doc.notes:
        heading("Notes on this setup")
        bullets(doc.notes)
    heading("Cost")
    pdf.set_font(_FAMILY, size=9)
    # The quantity column is as wide as its widest cell (a quantity has up to 6 decimals: quantity()), so a long one
    # does not run into the description beside it.
    shown = [pdf.get_string_width(_pdf_text(f"{line.quantity} {line.unit}")) + 2 * pdf.c_margin for line in doc.lines]
    quantity_width = max([30.0, *shown])
    columns = (width - 60 - quantity_width, quantity_width, 30, 30)
    pdf.set_font(_FAMILY, style="B", size=9)
    for label, w, align in zip(("Item", "Quantity", "Unit price", "Amount"), columns, "LRRR", strict=True):
        pdf.cell(w, 6, label, border="B", align=align)
    pdf.ln(6)
    pdf.set_font(_FAMILY, size=9)
    for line in doc.lines:
        description = _pdf_text(line.description)
        wrapped = pdf.multi_cell(columns[0], 5, description, dry_run=True, output="LINES")
        rows = len(wrapped) if isinstance(wrapped, list) else 1
        if pdf.get_y() + 5 * rows > pdf.page_break_trigger:
            pdf.add_page()
        y = pdf.get_y()
        pdf.multi_cell(columns[0], 5, description, new_x=XPos.RIGHT, new_y=YPos.TOP)
        pdf.cell(columns[1], 5, _pdf_text(f"{line.quantity} {line.unit}"), align="R")
        pdf.cell(columns[2], 5, _pdf_text(line.unit_price), align="R")
        pdf.cell(columns[3], 5, _pdf_text(line.amount), align="R")
        pdf.set_xy(pdf.l_margin, y + 5 * rows)
    pdf.set_font(_FAMILY, style="B", size=10)
    pdf.cell(width - columns[3], 7, _pdf_text(f"Total ({doc.currency})"), border="T")
    pdf.cell(columns[3], 7, _pdf_text(doc.total), border="T", align="R", new_x=XPos.LMARGIN, new_y=YPos.NEXT)
    heading("Assumptions")
    bullets(doc.assumptions)
    if doc.plan_assumptions:
        heading("The plan's assumptions")
        bullets(doc.plan_assumptions)
    heading("Prices")
    text(doc.price_source, size=9)
    return bytes(pdf.output())
