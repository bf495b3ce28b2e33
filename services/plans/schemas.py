"""Request and response bodies of the plans API."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, model_validator

from services.core.request_models import ClosedModel
from services.estimator.plan import MAX_EXAMPLE_TOKENS, DataSpec, Plan, check_length_percentiles
from services.planner.constraints import Constraints

LENGTH_PERCENTILE_KEYS = ("p50_tokens", "p90_tokens", "p99_tokens", "max_tokens")


class Dataset(ClosedModel):
    """The data set: ``{"examples": N, "avg_tokens": T}`` or ``{"tokens": N}`` (tokens per epoch)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    examples: StrictInt | None = Field(default=None, gt=0, le=10**12)
    avg_tokens: StrictFloat | None = Field(default=None, ge=1, le=MAX_EXAMPLE_TOKENS)  # as data.avg_tokens_per_example
    tokens: StrictInt | None = Field(default=None, gt=0, le=10**15)
    # Length percentiles of the examples (a checked data set fills them): padding is computed from them.
    p50_tokens: StrictInt | None = Field(default=None, gt=0, le=MAX_EXAMPLE_TOKENS)
    p90_tokens: StrictInt | None = Field(default=None, gt=0, le=MAX_EXAMPLE_TOKENS)
    p99_tokens: StrictInt | None = Field(default=None, gt=0, le=MAX_EXAMPLE_TOKENS)
    max_tokens: StrictInt | None = Field(default=None, gt=0, le=MAX_EXAMPLE_TOKENS)

    @model_validator(mode="after")
    def _size_given(self) -> Dataset:
        if self.tokens is None and (self.examples is None or self.avg_tokens is None):
            raise ValueError("give 'tokens', or 'examples' together with 'avg_tokens'")
        if self.tokens is not None and self.examples is not None:  # examples was ignored: the size came from tokens
            raise ValueError("examples: give 'tokens', or 'examples' with 'avg_tokens', not both")
        check_length_percentiles([(n, getattr(self, n)) for n in LENGTH_PERCENTILE_KEYS])  # under "dataset"
        return self


class PlanRequest(Plan):
    """The estimator's plan schema plus the data set, epochs and constraints."""

    dataset: Dataset | None = None
    dataset_id: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9_-]{1,64}$",
        description="a checked data set (POST /v1/datasets): its size, seq_len and warnings size the plan",
    )
    epochs: StrictFloat | None = Field(default=None, gt=0, le=1000)
    constraints: Constraints = Constraints()

    @model_validator(mode="after")
    def _data_once(self) -> PlanRequest:
        if self.dataset is not None and self.data is not None:
            raise ValueError("dataset: give the data set once, as 'dataset' (or the estimator's 'data'), not both")
        return self

    def to_plan(self) -> Plan:
        fields = self.model_dump(exclude={"dataset", "dataset_id", "epochs", "constraints"})
        if self.dataset is not None:
            d = self.dataset
            fields["data"] = DataSpec(
                tokens=d.tokens,
                examples=d.examples,
                avg_tokens_per_example=d.avg_tokens,
                epochs=self.epochs or 1.0,
                p50_tokens_per_example=d.p50_tokens,
                p90_tokens_per_example=d.p90_tokens,
                p99_tokens_per_example=d.p99_tokens,
                max_tokens_per_example=d.max_tokens,
            ).model_dump()
        elif self.data is not None and self.epochs is not None:
            fields["data"] = {**self.data.model_dump(), "epochs": self.epochs}
        return Plan.model_validate(fields)


PlanStatus = Literal["queued", "running", "done", "failed"]


class PlanCreated(BaseModel):
    id: str
    status: PlanStatus


class PlanSummary(BaseModel):
    id: str
    status: PlanStatus
    model: str
    method: str
    created_at: datetime
    cheapest: dict[str, Any] | None = None


class PlanList(BaseModel):
    items: list[PlanSummary]
    next_cursor: str | None = None


class PlanOut(BaseModel):
    id: str
    status: PlanStatus
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    request: dict[str, Any]
    estimate: dict[str, Any] | None
    recommendations: list[dict[str, Any]]
    rejections: list[dict[str, Any]]
    warnings: list[str]
    error: str | None
    attempts: int = 0
    trace_status: PlanStatus | None = None
    trace: dict[str, Any] | None = None
