"""The dashboard's list pages as view data: the catalog's offers by card, quotes, runs and data sets.
Pure: rows in, what the templates show out (services/dashboard/views.py holds the plan and node pages)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from services.dashboard.views import ago, usd, when
from services.planner.planner import STALE_AFTER_HOURS, price_age_hours

# A price is shown as stale past the planner's own threshold, the one its notes use.
STALE_AFTER_DAYS = STALE_AFTER_HOURS / 24


@dataclass(frozen=True)
class OfferView:
    provider: str
    gpus_per_node: int
    region: str
    on_demand: str  # per GPU-hour
    spot: str
    fetched: str
    age: str
    stale: bool
    source: str
    own: bool  # the organization's own negotiated price
    host_ram: str


@dataclass(frozen=True)
class CardOffers:
    gpu: str
    memory_gib: float
    offers: tuple[OfferView, ...]  # cheapest on demand first


def offers_by_card(rows: Iterable[Any], now: datetime, own_version_id: str | None) -> list[CardOffers]:
    """Catalog rows (GpuOfferRow) grouped by card, the cards by their cheapest price, the offers cheapest first."""
    cards: dict[str, list[Any]] = {}
    for row in rows:
        cards.setdefault(row.gpu, []).append(row)
    out = []
    for gpu, group in cards.items():
        group.sort(key=lambda r: (r.on_demand_usd_per_hour, r.provider, r.region))
        views = []
        for r in group:
            age_hours = price_age_hours(r.fetched_at, now)
            fetched = now - timedelta(hours=age_hours) if age_hours is not None else None
            views.append(
                OfferView(
                    provider=r.provider,
                    gpus_per_node=r.gpus_per_node,
                    region=r.region or "—",
                    on_demand=usd(r.on_demand_usd_per_hour),
                    spot=usd(r.spot_usd_per_hour) if r.spot_usd_per_hour is not None else "—",
                    fetched=r.fetched_at or "unknown",
                    age=ago(fetched, now) if fetched is not None else "unknown",
                    stale=age_hours is None or age_hours > STALE_AFTER_HOURS,
                    source=r.source,
                    own=own_version_id is not None and r.version_id == own_version_id,
                    host_ram=f"{r.host_ram_gib_per_node:,.0f} GiB" if r.host_ram_gib_per_node else "not stated",
                )
            )
        out.append(CardOffers(gpu=gpu, memory_gib=float(group[0].gpu_memory_gib), offers=tuple(views)))
    return sorted(out, key=lambda c: (min(r.on_demand_usd_per_hour for r in cards[c.gpu]), c.gpu))


@dataclass(frozen=True)
class QuoteView:
    id: str
    number: str
    customer: str
    model: str
    setup: str
    total: str
    issued: str
    valid_until: str
    expired: bool


def quote_rows(quotes: Sequence[Any], now: datetime) -> list[QuoteView]:
    """From the API's QuoteOut."""
    out = []
    for q in quotes:
        setup = q.setup or {}
        pricing = " spot" if setup.get("pricing") == "spot" else ""
        label = f"{setup.get('gpus', '?')} x {setup.get('gpu', '?')} at {setup.get('provider', '?')}{pricing}"
        out.append(
            QuoteView(
                id=q.id,
                number=q.number,
                customer=q.customer.name or "—",
                model=q.model or "—",
                setup=label,
                total=usd(q.total_usd),
                issued=when(q.created_at),
                valid_until=when(q.valid_until),
                expired=q.valid_until <= now,  # as the API says it (services.quotes.service.to_out)
            )
        )
    return out


@dataclass(frozen=True)
class RunView:
    id: str
    plan_id: str
    status: str
    nodes: int
    last_durable: str
    progress: str
    where: str
    spot: bool
    started: str


def run_rows(runs: Sequence[Any], now: datetime) -> list[RunView]:
    """From the API's RunOut."""
    return [
        RunView(
            id=r.id,
            plan_id=r.plan_id,
            status=r.status,
            nodes=len(r.node_ids),
            last_durable=f"step {r.last_durable_step}" if r.last_durable_step is not None else "none yet",
            progress=(
                f"step {r.progress_step}"
                + (f", loss {r.progress_loss:.3f}" if r.progress_loss is not None else "")
                + f" ({ago(r.progress_at, now)})"
                if r.progress_step is not None
                else "no report yet"
            ),
            where=f"s3://{r.bucket}/{r.prefix}",
            spot=r.spot,
            started=ago(r.created_at, now),
        )
        for r in runs
    ]


@dataclass(frozen=True)
class DatasetView:
    id: str
    name: str
    status: str
    size: str
    rows: str
    tokens: str
    tokenizer: (
        str  # which tokenizer counted: "hub:owner/name", "upload" or "estimate: characters/4"; "" before a report
    )
    personal_data: str
    created: str


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n} B"


# Reports stored before they named their tokenizer name only the counting method.
_METHOD_SOURCES = {"approx_4_chars_per_token": "estimate: characters/4", "tokenizer_json": "upload"}


def _tokenizer(report: dict[str, Any]) -> str:
    source = (report.get("tokenizer") or {}).get("source")
    if isinstance(source, str) and source:
        return source
    method = (report.get("tokens") or {}).get("method")
    return _METHOD_SOURCES.get(method, "") if isinstance(method, str) else ""


def dataset_rows(rows: Sequence[Any], now: datetime) -> list[DatasetView]:
    """From data set rows (DatasetRow): the check's report where it is done."""
    out = []
    for d in rows:
        report = d.report or {}
        tokens = report.get("tokens") or {}
        out.append(
            DatasetView(
                id=d.id,
                name=d.name,
                status=d.status,
                size=_size(d.size_bytes),
                rows=f"{report['rows_total']:,}" if "rows_total" in report else "—",
                tokens=(
                    f"median {tokens['p50_tokens']:,}, p90 {tokens['p90_tokens']:,}" if "p50_tokens" in tokens else "—"
                ),
                tokenizer=_tokenizer(report),
                personal_data=(
                    f"{report['pii_findings_total']:,} found"
                    if report.get("pii_findings_total")
                    else ("none found" if "pii_findings_total" in report else "—")
                ),
                created=ago(d.created_at, now),
            )
        )
    return out
