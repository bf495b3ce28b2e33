"""Request and response bodies of the data sets API."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from services.core.request_models import ClosedModel, SingleLine

FileFormat = Literal["jsonl", "json", "csv", "parquet"]
DatasetStatus = Literal["uploading", "queued", "running", "done", "failed"]


class DatasetCreate(ClosedModel):
    """Start a resumable upload: the file's name and exact size; the format is taken from the name
    (``train.jsonl.gz``) unless given."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: SingleLine = Field(
        min_length=1,
        max_length=200,
        pattern=r"^[^\x00-\x1f\x7f]+$",
        description="file name, e.g. train.jsonl or chat.csv.gz (no control characters)",
    )
    size_bytes: StrictInt = Field(
        gt=0, le=5 * 2**40, description="exact size of the file as uploaded (compressed size for .gz)"
    )
    sha256: str | None = Field(
        default=None, pattern=r"^[0-9a-fA-F]{64}$", description="SHA-256 of the file, checked on complete"
    )
    format: FileFormat | None = Field(default=None, description="jsonl, json, csv or parquet; default: from name")
    gzip: StrictBool | None = Field(default=None, description="gzip-compressed; default: the name ends in .gz")
    data_country: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z]{2}$",
        description="ISO 3166-1 alpha-2 code of the data's home country (e.g. TR, DE), for the data-location check",
    )
    model: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="the model it trains (Hub id such as meta-llama/Llama-3.1-8B, or a bundled name): the check "
        "counts tokens with that model's tokenizer.json from the Hub; without one, characters / 4",
    )


class DatasetProgress(BaseModel):
    rows_done: int
    rows_total: int | None = Field(description="estimated from the bytes read until the check finishes")
    rows_total_estimated: bool
    percent: float | None


class DatasetUpload(BaseModel):
    part_size_bytes: int
    parts_total: int
    parts_done: list[int]
    parts_missing: list[int]
    bytes_received: int
    part_url: str = Field(description="PUT each part's raw bytes here, {n} from 1 to parts_total")
    complete_url: str


class DatasetOut(BaseModel):
    id: str
    name: str
    status: DatasetStatus
    file_format: FileFormat
    gzipped: bool
    size_bytes: int
    sha256: str | None
    data_country: str | None
    tokenizer: bool = Field(description="whether a tokenizer.json was uploaded for exact token counts")
    model: str | None = Field(description="the model whose Hub tokenizer counts the tokens (report.tokenizer says)")
    created_at: datetime
    uploaded_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    attempts: int
    upload: DatasetUpload
    progress: DatasetProgress
    report: dict[str, Any] | None
    error: str | None


class DatasetSummary(BaseModel):
    id: str
    name: str
    status: DatasetStatus
    size_bytes: int
    created_at: datetime


class DatasetList(BaseModel):
    items: list[DatasetSummary]
    next_cursor: str | None = Field(default=None, description="pass as ?before= for the next page; null: the last")
