from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, model_validator

from services.core.request_models import ClosedModel


class QuoteRequest(ClosedModel):
    """A setup to quote: a card and GPU count (optionally a provider), or the best setup for N GPUs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu: str | None = Field(default=None, min_length=1, max_length=100)
    gpus: StrictInt | None = Field(default=None, ge=1, le=1024)
    provider: str | None = Field(default=None, min_length=1, max_length=100)
    best_for_gpus: StrictInt | None = Field(default=None, ge=1, le=1024)
    spot: bool = False
    checkpoint_storage_months: float = Field(default=1.0, ge=0, le=120)

    @model_validator(mode="after")
    def _what(self) -> QuoteRequest:
        if self.best_for_gpus is None and (self.gpu is None or self.gpus is None):
            raise ValueError("give 'gpu' and 'gpus' (optionally 'provider'), or 'best_for_gpus'")
        if self.best_for_gpus is not None and (self.gpu is not None or self.gpus is not None):
            raise ValueError("best_for_gpus: give either a setup ('gpu' and 'gpus') or 'best_for_gpus', not both")
        return self


class LineItem(BaseModel):
    description: str
    quantity: float
    unit: str
    unit_price_usd: float
    amount_usd: float


class QuoteOut(BaseModel):
    id: str
    plan_id: str
    created_at: datetime
    valid_until: datetime
    setup: dict[str, Any]
    line_items: list[LineItem]
    total_usd: float
    currency: str
    assumptions: list[str]
