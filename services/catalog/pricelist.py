"""Validating a provider price list (CSV or JSON) row by row; pure, so the CLI, the API and the
first migration share it. A file with any bad row is rejected whole."""

from __future__ import annotations

import csv
import io
import json
from datetime import date
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from services.catalog.gpus import GpuSpec, find_gpu, gpu_specs
from services.catalog.offers import Offer
from services.estimator.errors import EstimatorError

MAX_ROWS = 10_000


class OfferRow(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    provider: str = Field(min_length=1, max_length=100)
    gpu: str = Field(min_length=1, max_length=100)
    gpus_per_node: int = Field(default=1, ge=1, le=64)
    on_demand_usd_per_hour: float = Field(gt=0, le=10_000)
    spot_usd_per_hour: float | None = Field(default=None, gt=0, le=10_000)
    currency: str = Field(default="USD", pattern=r"^[A-Z]{3}$")
    region: str = Field(default="", max_length=100)
    country: str = Field(default="", max_length=2)
    interconnect: str = Field(default="", max_length=100)
    fetched_at: date = Field(default_factory=date.today)
    source: str = Field(default="", max_length=500)

    @field_validator("spot_usd_per_hour", mode="before")
    @classmethod
    def _empty_is_none(cls, value: Any) -> Any:
        return None if value == "" else value


class PriceListError(ValueError):
    """Every problem of a rejected file, one line each, with its row number (1 = first data row)."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems[:20]))
        self.problems = problems


def _rows_from_text(text: str, fmt: str) -> list[dict[str, Any]]:
    if fmt == "json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PriceListError([f"not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"]) from None
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
        return [dict(row) for row in reader]
    except csv.Error as exc:
        raise PriceListError([f"CSV price list: line {reader.line_num}: {exc}"]) from None


def parse_price_list(text: str, fmt: str, specs: tuple[GpuSpec, ...] | None = None) -> list[Offer]:
    """Validate every row; return the offers, or raise PriceListError naming each bad row."""
    if fmt not in ("csv", "json"):
        raise PriceListError([f"format: {fmt!r} is not supported; use 'csv' or 'json'"])
    rows = _rows_from_text(text, fmt)
    if not rows:
        raise PriceListError(["the price list has no rows"])
    if len(rows) > MAX_ROWS:
        raise PriceListError([f"the price list has {len(rows)} rows; at most {MAX_ROWS} are accepted"])
    specs = specs if specs is not None else gpu_specs()
    problems: list[str] = []
    offers: list[Offer] = []
    seen: set[tuple[str, str, int, str]] = set()
    for number, raw in enumerate(rows, start=1):
        cleaned = {k.strip(): v for k, v in raw.items() if k is not None and k.strip()}
        try:
            row = OfferRow.model_validate(cleaned)
        except ValidationError as exc:
            for err in exc.errors():
                field = ".".join(str(p) for p in err["loc"]) or "row"
                msg = err["msg"][:1].lower() + err["msg"][1:]
                if err["type"] == "extra_forbidden":
                    msg = f"unknown column; columns are {', '.join(OfferRow.model_fields)}"
                problems.append(f"row {number}: {field}: {msg} (got {err.get('input')!r})")
            continue
        try:
            spec = find_gpu(row.gpu, specs)
        except EstimatorError as exc:
            problems.append(f"row {number}: gpu: {exc.message}")
            continue
        key = (row.provider, spec.name, row.gpus_per_node, row.region)
        if key in seen:
            problems.append(
                f"row {number}: duplicate offer for {row.provider} {spec.name} x{row.gpus_per_node} {row.region}"
            )
            continue
        seen.add(key)
        offers.append(
            Offer(
                provider=row.provider,
                gpu=spec.name,
                gpus_per_node=row.gpus_per_node,
                on_demand_usd_per_hour=row.on_demand_usd_per_hour,
                spot_usd_per_hour=row.spot_usd_per_hour,
                currency=row.currency,
                region=row.region,
                country=row.country,
                interconnect=row.interconnect,
                fetched_at=row.fetched_at.isoformat(),
                source=row.source,
            )
        )
    if problems:
        raise PriceListError(problems)
    return offers
