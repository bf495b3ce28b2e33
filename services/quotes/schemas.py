from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, field_validator, model_validator

from services.core.request_models import ClosedModel, SingleLine


class QuoteRequest(ClosedModel):
    """A setup to quote: a card and GPU count (optionally the provider, region and nodes), or the best setup for N
    GPUs, on demand or on spot, for a customer."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu: SingleLine | None = Field(default=None, min_length=1, max_length=100)
    gpus: StrictInt | None = Field(default=None, ge=1, le=1024)
    provider: SingleLine | None = Field(default=None, min_length=1, max_length=100)
    region: SingleLine | None = Field(
        default=None,
        max_length=100,
        description="the offer's region; an empty one (a recommendation's, sent back as it is) names an offer without",
    )
    nodes: StrictInt | None = Field(default=None, ge=1, le=1024, description="the nodes the GPUs run on (checked)")
    offer_gpus_per_node: StrictInt | None = Field(
        default=None,
        ge=1,
        le=64,
        description="the node size of the offer (a recommendation's offer_gpus_per_node): which of a provider's offers "
        "of the card in that region, where it sells several node sizes",
    )
    best_for_gpus: StrictInt | None = Field(default=None, ge=1, le=1024)
    spot: StrictBool = False
    checkpoint_storage_months: StrictFloat = Field(
        default=0.0,
        ge=0,
        le=120,
        description="months to keep the last checkpoint in object storage (a line of its own)",
    )
    customer_name: SingleLine | None = Field(default=None, min_length=1, max_length=200)
    customer_email: SingleLine | None = Field(default=None, max_length=320)

    @field_validator("provider", "customer_name", "customer_email", mode="before")
    @classmethod
    def _trimmed(cls, value: Any) -> Any:
        # What the document prints: "  Ada " is Ada, and a name of spaces alone is no name (min_length); a provider
        # of spaces alone is none either, not a 422 saying "no offer for A40 at     in the catalog".
        return value.strip() if isinstance(value, str) else value

    @field_validator("customer_email")
    @classmethod
    def _email(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[^@\s]{1,64}@[^@\s]+\.[^@\s]+", value):
            # RFC 5321 section 4.5.3.1.1: a local part of at most 64 octets.
            raise ValueError(f"not an email address (name@example.org, at most 64 characters before @), got {value!r}")
        return value

    @model_validator(mode="after")
    def _what(self) -> QuoteRequest:
        if self.best_for_gpus is None and (self.gpu is None or self.gpus is None):
            # The message names the field it misses first (the API's errors name the field before the colon).
            missing = "gpu" if self.gpu is None else "gpus"
            raise ValueError(f"{missing}: give 'gpu' and 'gpus' (optionally 'provider'), or 'best_for_gpus'")
        if self.best_for_gpus is not None and (self.gpu is not None or self.gpus is not None):
            raise ValueError("best_for_gpus: give either a setup ('gpu' and 'gpus') or 'best_for_gpus', not both")
        return self


class LineItem(BaseModel):
    description: str
    quantity: float = Field(
        description="to the fewest decimals (2 to 6) at which quantity x unit_price_usd is amount_usd to the cent"
    )
    unit: str
    unit_price_usd: float
    amount_usd: float


class Customer(BaseModel):
    name: str | None = None
    email: str | None = None


class PriceList(BaseModel):
    """Where the quoted price comes from."""

    provider: str
    region: str
    source: str
    fetched_at: str
    age_hours: float | None = None


class QuoteOut(BaseModel):
    id: str
    number: str = Field(description="the quote number printed on the document")
    plan_id: str
    created_at: datetime
    valid_until: datetime
    expired: bool = Field(
        description="whether valid_until has passed by the server's clock when the quote is read: an expired quote "
        "is no longer an offer (ask for a new one)"
    )
    customer: Customer
    issuer: str = Field(default="", description="the organization that issued the quote")
    model: str = ""
    method: str = ""
    job: str = Field(default="", description="the training job: data set, epochs and tokens")
    setup: dict[str, Any] = Field(
        description="the quoted setup, as the plan's recommendation has it; pricing is on_demand or spot (the plan's "
        "spelling)"
    )
    line_items: list[LineItem]
    job_cost_usd: float = Field(description="the planned run's expected cost: the plan's number for this setup")
    total_usd: float
    currency: str
    notes: list[str] = Field(default_factory=list, description="the planner's notes on the setup, as the plan shows")
    assumptions: list[str] = Field(description="what this quote's numbers rest on")
    plan_assumptions: list[str] = Field(default_factory=list, description="the planner's assumptions for the plan")
    price_list: PriceList | None = None


class QuoteList(BaseModel):
    items: list[QuoteOut]
    next_cursor: str | None = Field(default=None, description="pass as ?before= for the next page; null: the last")
