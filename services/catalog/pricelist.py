"""Validating a provider price list (CSV or JSON) row by row; pure, so the CLI, the API, the live
feeds and the migrations share it. A file with any bad row is rejected whole."""

from __future__ import annotations

import csv
import io
import json
import unicodedata
from datetime import UTC, date, datetime, timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from services.catalog.gpus import GpuSpec, find_gpu, gpu_specs, larger_of_its_model
from services.catalog.offers import Offer
from services.core.country import is_country_code
from services.core.errors import EstimatorError

MAX_ROWS = 10_000

# A cell a spreadsheet would run as a formula when the exported list is opened (OWASP "CSV
# injection"): it starts with one of these. A leading '-' is allowed only on a plain number, so a
# negative price is reported as a negative price.
FORMULA_PREFIXES = ("=", "+", "-", "@")

# Optional columns that an empty CSV cell leaves at their default.
_OPTIONAL_COLUMNS = (
    "spot_usd_per_hour",
    "whole_nodes_only",
    "inter_node_gbit_per_s",
    "billing_increment_s",
    "billing_minimum_s",
    "startup_s",
    "download_gbit_per_s",
    "preemption_per_hour",
    "gpus_per_node",
    "currency",
    "fetched_at",
    "host_ram_gib_per_node",
)

# The largest host RAM a row may give per node: 64 TiB, twice the largest single server EC2 rents
# (u7inh-32tb.480xlarge, 32 TiB: aws.amazon.com/ec2/instance-types/high-memory); a larger value is a typo
# (MB or bytes for GiB).
MAX_HOST_RAM_GIB_PER_NODE = 65_536.0
# The least price per GPU-hour a row may give: a tenth of a cent, under any card's price anywhere (the cheapest
# marketplace T4s rent for a few cents). Less is a price per second or per minute written as one per hour, which the
# planner would rank first at next to nothing.
MIN_USD_PER_GPU_HOUR = 0.001


def _today() -> str:
    return date.today().isoformat()


def normalise_fetched_at(value: str) -> str:
    """An ISO date ("2026-11-01") stays a date; a time becomes UTC "YYYY-MM-DDTHH:MM:SSZ" (a zone is required)."""
    text = value.strip()
    if len(text) == 10:
        return date.fromisoformat(text).isoformat()
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        raise ValueError("a time needs its zone, e.g. 2026-11-01T12:00:00Z")
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class OfferRow(BaseModel):
    """One row of a price list: per-GPU hourly prices and the terms of the offer (Offer schema v2)."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    provider: str = Field(min_length=1, max_length=100)
    gpu: str = Field(min_length=1, max_length=100)
    gpus_per_node: int = Field(default=1, ge=1, le=64)
    on_demand_usd_per_hour: float = Field(gt=0, le=10_000)
    spot_usd_per_hour: float | None = Field(default=None, gt=0, le=10_000)
    currency: str = Field(default="USD", max_length=3)
    region: str = Field(default="", max_length=100)
    country: str = Field(default="", description="ISO 3166-1 alpha-2 code (US, DE), upper-cased; empty: unknown")
    interconnect: str = Field(default="", max_length=100)
    fetched_at: str = Field(default_factory=_today, max_length=40)
    source: str = Field(default="", max_length=500)
    whole_nodes_only: bool = False
    inter_node_gbit_per_s: float | None = Field(default=None, gt=0, le=100_000)
    billing_increment_s: int = Field(default=1, ge=1, le=86_400)
    billing_minimum_s: int = Field(default=0, ge=0, le=30 * 86_400)
    startup_s: float | None = Field(default=None, ge=0, le=86_400)
    download_gbit_per_s: float | None = Field(default=None, gt=0, le=10_000)
    preemption_per_hour: float | None = Field(default=None, ge=0, le=100)
    host_ram_gib_per_node: float | None = Field(default=None, gt=0, le=MAX_HOST_RAM_GIB_PER_NODE, allow_inf_nan=False)

    @field_validator(
        "gpus_per_node",
        "on_demand_usd_per_hour",
        "spot_usd_per_hour",
        "inter_node_gbit_per_s",
        "billing_increment_s",
        "billing_minimum_s",
        "startup_s",
        "download_gbit_per_s",
        "preemption_per_hour",
        "host_ram_gib_per_node",
        mode="before",
    )
    @classmethod
    def _not_a_boolean(cls, value: Any) -> Any:
        # JSON's true read as 1 (a price of $1.00, one GPU per node): a column shifted or mistyped, not a number.
        if isinstance(value, bool):
            raise ValueError("expected a number, not true or false")
        return value

    @field_validator("on_demand_usd_per_hour", "spot_usd_per_hour")
    @classmethod
    def _per_gpu_hour(cls, value: float | None) -> float | None:
        if value is not None and value < MIN_USD_PER_GPU_HOUR:
            raise ValueError(
                f"below ${MIN_USD_PER_GPU_HOUR} per GPU-hour: prices are per GPU-hour, not per second or minute"
            )
        return value

    @field_validator("whole_nodes_only", mode="before")
    @classmethod
    def _a_boolean(cls, value: Any) -> Any:
        # JSON's 1 or "yes" for a flag: pydantic's lax reading took them; a JSON row says true or false (a CSV cell,
        # text, keeps the spellings a spreadsheet writes: true/false, yes/no, 1/0).
        if isinstance(value, int | float) and not isinstance(value, bool):
            raise ValueError("expected true or false")
        return value

    @field_validator("currency")
    @classmethod
    def _in_dollars(cls, value: str) -> str:
        # Every price and cost gpuplan works out is USD (on_demand_usd_per_hour, expected_cost_usd), and it holds no
        # exchange rate: a row in another currency was ranked as if its number were dollars (a quote probe of stop 52).
        if value.upper() != "USD":
            raise ValueError("prices are USD per GPU-hour: convert the row to USD (gpuplan holds no exchange rate)")
        return "USD"

    @field_validator("country")
    @classmethod
    def _iso_country(cls, value: str) -> str:
        # The planner's region filter and the catalog's ?region= match an offer by this code (Constraints.allows_region,
        # services/catalog/repository.py, upper-cased): "1", "U" or "USA" matched no place anyone names, and went on
        # into a String(2) column.
        if value and not is_country_code(value):
            raise ValueError("expected an ISO 3166-1 alpha-2 country code (two letters, e.g. US, DE), or empty")
        return value.upper()

    @field_validator("fetched_at")
    @classmethod
    def _iso_time(cls, value: str) -> str:
        try:
            found = normalise_fetched_at(value)
        except (ValueError, OverflowError):  # OverflowError: 0001-01-01T00:00:00+14:00 is before year 1 in UTC
            raise ValueError("expected an ISO date (2026-11-01) or UTC time (2026-11-01T12:00:00Z)") from None
        # A price fetched in the future would never read as stale (services.planner.planner.price_age_hours); a day
        # of slack covers the time zones between the provider's date and this machine's.
        if date.fromisoformat(found[:10]) > date.today() + timedelta(days=1):
            raise ValueError(f"{found} is in the future: when was this price read?")
        return found


class PriceListError(ValueError):
    """Every problem of a rejected file, one line each, with its row number (1 = first data row)."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems[:20]))
        self.problems = problems


def _rows_from_text(text: str, fmt: str) -> list[dict[str, Any]]:
    # A byte-order mark (Excel's "CSV UTF-8" writes one) is not part of the first column's name.
    text = text.removeprefix("\ufeff")
    if fmt == "json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PriceListError([f"not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"]) from None
        # `admin import-offers` reads the file without the API's middleware: these were tracebacks there.
        except RecursionError:
            raise PriceListError(["JSON price list: nested too deeply"]) from None
        except ValueError:  # an integer of more digits than Python converts (4,300)
            raise PriceListError(["JSON price list: a number of more than 4,300 digits"]) from None
        if isinstance(data, dict) and isinstance(data.get("offers"), list):
            data = data["offers"]
        if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
            raise PriceListError(["JSON price list: expected a list of offer objects (or {'offers': [...]})"])
        return data
    body = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    reader = csv.DictReader(io.StringIO(body, newline=""))
    try:
        if reader.fieldnames is None:
            raise PriceListError(["CSV price list: empty file, expected a header row"])
        names = [name.strip() for name in reader.fieldnames]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:  # csv.DictReader keeps the last of two same-named columns, silently
            raise PriceListError([f"CSV price list: the header names {', '.join(map(repr, twice))} twice"])
        return [dict(row) for row in reader]
    except csv.Error as exc:
        raise PriceListError([f"CSV price list: line {reader.line_num}: {exc}"]) from None


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def cell_problems(number: int, row: dict[str, Any]) -> list[str]:
    """Cells no price list may hold: a formula a spreadsheet would run, or a control character (a NUL byte)."""
    problems = []
    for field, value in row.items():
        if not isinstance(value, str):
            continue
        text = value.strip()
        control = next((c for c in value if unicodedata.category(c) == "Cc"), None)
        # Invisible format characters: a bidi override (U+202E) reorders a provider's name on a quote, a zero-width
        # space makes "aws" and "a\u200bws" two providers that read alike.
        invisible = next((c for c in value if unicodedata.category(c) == "Cf"), None)
        if control == "\x00":
            problems.append(f"row {number}: {field}: contains a NUL byte")
        elif control is not None:  # a newline or an escape in a provider's or card's name, as the fuzzer sent
            problems.append(f"row {number}: {field}: contains the control character {control!r}")
        elif invisible is not None:
            problems.append(f"row {number}: {field}: contains the invisible character U+{ord(invisible):04X}")
        elif text.startswith(FORMULA_PREFIXES) and not (text.startswith("-") and _is_number(text)):
            problems.append(
                f"row {number}: {field}: looks like a spreadsheet formula (starts with {text[0]!r}); "
                f"cells may not start with {', '.join(repr(p) for p in FORMULA_PREFIXES)}"
            )
    return problems


def spot_above_on_demand(on_demand_usd_per_hour: Any, spot_usd_per_hour: Any) -> bool:
    """Whether a spot price lies above the on-demand price of the same offer: a data error (swapped columns, a
    price per node beside one per GPU), since spot capacity is sold at or below on demand (AWS caps the Spot
    price at the On-Demand price: docs.aws.amazon.com, EC2 User Guide, "Spot Instance pricing")."""
    prices = (on_demand_usd_per_hour, spot_usd_per_hour)
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in prices):
        return False  # absent or not a number: the row's own checks name it
    return bool(spot_usd_per_hour > on_demand_usd_per_hour)


def offer_from_row(row: OfferRow, spec: GpuSpec) -> Offer:
    return Offer(
        provider=row.provider,
        gpu=spec.name,
        gpus_per_node=row.gpus_per_node,
        on_demand_usd_per_hour=row.on_demand_usd_per_hour,
        spot_usd_per_hour=row.spot_usd_per_hour,
        currency=row.currency,
        region=row.region,
        country=row.country,
        interconnect=row.interconnect,
        fetched_at=row.fetched_at,
        source=row.source,
        whole_nodes_only=row.whole_nodes_only,
        inter_node_gbit_per_s=row.inter_node_gbit_per_s,
        billing_increment_s=row.billing_increment_s,
        billing_minimum_s=row.billing_minimum_s,
        startup_s=row.startup_s,
        download_gbit_per_s=row.download_gbit_per_s,
        preemption_per_hour=row.preemption_per_hour,
        host_ram_gib_per_node=row.host_ram_gib_per_node,
    )


def offer_key(offer: Offer) -> tuple[str, str, str, int]:
    """What makes two offers the same offer: an import replaces an offer with the same key."""
    return (offer.provider, offer.gpu, offer.region, offer.gpus_per_node)


def overlay_key(provider: str, gpu: str, region: str, gpus_per_node: int) -> tuple[str, str, str, int]:
    """The key an import or an organization's own offer replaces an offer by: offer_key with provider and region in
    any case.

    The quote and the planner's provider and region filters (Constraints.allows_provider, allows_region) compare
    them without case, so "VAST" over "vast" (or "EU" over "eu") kept both offers as twins a quote could not tell
    apart (a false 409 on every quote of the card). casefold, as services.catalog.service.import_offers names one
    provider; the row kept is whole, so the spelling the planner and its quotes see is the newer one's."""
    return (provider.casefold(), gpu, region.casefold(), gpus_per_node)


def parse_rows(rows: list[dict[str, Any]], specs: tuple[GpuSpec, ...] | None = None) -> list[Offer]:
    """Validate every row (dicts of column -> value); return the offers, or raise PriceListError naming each bad row."""
    if not rows:
        raise PriceListError(["the price list has no rows"])
    if len(rows) > MAX_ROWS:
        raise PriceListError([f"the price list has {len(rows)} rows; at most {MAX_ROWS} are accepted"])
    specs = specs if specs is not None else gpu_specs()
    problems: list[str] = []
    offers: list[Offer] = []
    seen: dict[tuple[str, str, str, int], int] = {}
    for number, raw in enumerate(rows, start=1):
        extra = raw.get(None)  # type: ignore[call-overload]  # csv.DictReader puts cells past the header there
        if isinstance(extra, list) and extra:
            problems.append(f"row {number}: {len(extra)} more cell(s) than the header has columns ({extra[:3]!r})")
            continue
        cleaned = {k.strip(): v for k, v in raw.items() if isinstance(k, str) and k.strip()}
        bad_cells = cell_problems(number, cleaned)
        if bad_cells:
            problems.extend(bad_cells)
            continue
        for column in _OPTIONAL_COLUMNS:
            if isinstance(cleaned.get(column), str) and not cleaned[column].strip():
                del cleaned[column]
        try:
            row = OfferRow.model_validate(cleaned)
        except ValidationError as exc:
            for err in exc.errors():
                field = ".".join(str(p) for p in err["loc"]) or "row"
                msg = err["msg"][:1].lower() + err["msg"][1:]
                if err["type"] == "value_error":  # a validator's own words, without pydantic's "Value error, "
                    msg = msg.removeprefix("value error, ")
                if err["type"] == "extra_forbidden":
                    msg = f"unknown column; columns are {', '.join(OfferRow.model_fields)}"
                problems.append(f"row {number}: {field}: {msg} (got {err.get('input')!r})")
            continue
        if spot_above_on_demand(row.on_demand_usd_per_hour, row.spot_usd_per_hour):
            problems.append(
                f"row {number}: spot_usd_per_hour: {row.spot_usd_per_hour:g} is above on_demand_usd_per_hour "
                f"({row.on_demand_usd_per_hour:g}); spot capacity is sold at or below the on-demand price "
                "(check the columns, and that both are per GPU-hour)"
            )
            continue
        try:
            spec = find_gpu(row.gpu, specs)
        except EstimatorError as exc:
            problems.append(f"row {number}: gpu: {exc.message}")
            continue
        smaller = larger_of_its_model(row.gpu, spec, specs)
        if smaller is not None:  # planned on memory a row of the smaller card does not have: it ran out of memory
            problems.append(
                f"row {number}: gpu: {row.gpu!r} names no memory and could be the {smaller.name} or the {spec.name}; "
                "name the card with its memory"
            )
            continue
        offer = offer_from_row(row, spec)
        key = overlay_key(*offer_key(offer))  # provider and region in any case, as an import matches them
        if key in seen:
            problems.append(
                f"row {number}: duplicate offer for {row.provider} {spec.name} x{row.gpus_per_node} "
                f"region {row.region!r} (same provider, gpu, region and gpus_per_node as row {seen[key]})"
            )
            continue
        seen[key] = number
        offers.append(offer)
    if problems:
        raise PriceListError(problems)
    return offers


def parse_price_list(text: str, fmt: str, specs: tuple[GpuSpec, ...] | None = None) -> list[Offer]:
    """Validate every row of a CSV or JSON price list; return the offers, or raise PriceListError."""
    if fmt not in ("csv", "json"):
        raise PriceListError([f"format: {fmt!r} is not supported; use 'csv' or 'json'"])
    return parse_rows(_rows_from_text(text, fmt), specs)


EXPORT_COLUMNS = tuple(OfferRow.model_fields)


def export_csv(offers: tuple[Offer, ...] | list[Offer]) -> str:
    """The offers as a price-list CSV that ``parse_price_list`` reads back unchanged."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=EXPORT_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for offer in offers:
        row: dict[str, Any] = {}
        for column in EXPORT_COLUMNS:
            value = getattr(offer, column)
            if value is None:
                value = ""
            elif isinstance(value, bool):
                value = "true" if value else "false"
            row[column] = value
        writer.writerow(row)
    return out.getvalue()
