from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from services.core.db import Base, IdMixin, TimestampMixin, UtcDateTime


class DatasetRow(IdMixin, TimestampMixin, Base):
    """An uploaded data set file in object storage and the result of checking it."""

    __tablename__ = "datasets"

    organization_id: Mapped[str] = mapped_column(ForeignKey("organizations.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    file_format: Mapped[str] = mapped_column(String(16))  # jsonl, json, csv, parquet
    gzipped: Mapped[bool] = mapped_column(Boolean, default=False)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str | None] = mapped_column(String(64), default=None)
    data_country: Mapped[str | None] = mapped_column(String(2), default=None)
    # uploading -> queued -> running -> done / failed
    status: Mapped[str] = mapped_column(String(16), default="uploading")
    bucket: Mapped[str] = mapped_column(String(255))
    object_key: Mapped[str] = mapped_column(String(1024))
    upload_id: Mapped[str | None] = mapped_column(String(1024), default=None)
    part_size_bytes: Mapped[int] = mapped_column(BigInteger)
    tokenizer_key: Mapped[str | None] = mapped_column(String(1024), default=None)
    # The model it trains (catalog name or Hub id): its tokenizer.json from the Hub counts the tokens.
    model: Mapped[str | None] = mapped_column(String(200), default=None)
    rows_done: Mapped[int] = mapped_column(BigInteger, default=0)
    rows_total: Mapped[int | None] = mapped_column(BigInteger, default=None)
    rows_total_estimated: Mapped[bool] = mapped_column(Boolean, default=True)
    report: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    error: Mapped[str | None] = mapped_column(Text, default=None)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    uploaded_at: Mapped[datetime | None] = mapped_column(UtcDateTime, default=None)
    started_at: Mapped[datetime | None] = mapped_column(UtcDateTime, default=None)
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime, default=None)


class DatasetPartRow(IdMixin, TimestampMixin, Base):
    """One received part of a multipart upload; sending a part again replaces it."""

    __tablename__ = "dataset_parts"
    __table_args__ = (UniqueConstraint("dataset_id", "part_number", name="uq_dataset_parts_dataset_part"),)

    dataset_id: Mapped[str] = mapped_column(ForeignKey("datasets.id", ondelete="CASCADE"), index=True)
    part_number: Mapped[int] = mapped_column(Integer)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    etag: Mapped[str] = mapped_column(String(200))
