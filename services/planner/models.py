"""What the planner answers: ranked setups, the best per card, and why the others were left out."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

PricingMode = Literal["on_demand", "spot"]
RejectionKind = Literal[
    "memory", "precision", "gpu_count", "budget", "deadline", "budget_and_deadline", "region", "provider", "unknown_gpu"
]


class _Out(BaseModel):
    model_config = ConfigDict(frozen=True)


class Recommendation(_Out):
    """One setup that fits with the margin: where, how many GPUs, how configured, how fast, what it costs."""

    @model_validator(mode="before")
    @classmethod
    def _stored_before_padding(cls, data: Any) -> Any:
        # Recommendations stored before padding was counted have no data_tokens_per_s: their hours and cost
        # were computed at tokens_per_s, so that is the rate they stand for.
        if isinstance(data, dict) and "data_tokens_per_s" not in data and "tokens_per_s" in data:
            return {**data, "data_tokens_per_s": data["tokens_per_s"]}
        return data

    provider: str
    gpu: str
    region: str
    pricing: PricingMode = Field(description="how this entry is priced: on demand, or spot with expected rework")
    expected_cost_usd: float = Field(description="what the rented run is expected to cost under this pricing")
    expected_hours: float = Field(description="expected wall-clock under this pricing, start-up to final upload")
    cost_breakdown: dict[str, float] = Field(
        description="USD under this pricing: compute, startup, model_download, checkpoint_writes, "
        "preemption_rework, billing_rounding, on_demand_fallback (spot: the expected on-demand finish's excess over "
        "spot; they add up to expected_cost_usd)"
    )
    gpus: int = Field(description="all GPUs of the setup, every node together")
    gpus_per_node: int
    nodes: int
    offer_gpus_per_node: int | None = Field(
        default=None,
        description="the node size of the offer it rents (with provider, card and region, what names the offer: one "
        "provider may sell a card in several node sizes); null in plans stored before it was recorded",
    )
    links: str = Field(default="", description="how the GPUs are connected: within a node, and between nodes")
    sharding: str
    cpu_offload: bool
    host_ram_gib_per_node: float | None = Field(
        default=None, description="CPU memory per node the offloaded optimizer states need (None without offload)"
    )
    optimizer: str = "adamw"
    micro_batch_size: int
    gradient_accumulation_steps: int
    effective_batch_size: int = Field(description="micro_batch_size x gradient_accumulation_steps x gpus")
    gradient_checkpointing: bool
    fits: bool = True
    peak_gib_per_gpu: float = Field(description="predicted peak device memory per GPU (nvidia-smi view)")
    gpu_memory_gib: float
    usable_gib: float = Field(description="the card's memory less the safety margin")
    headroom_gib: float = Field(description="gpu_memory_gib - peak_gib_per_gpu")
    tokens_per_s: float = Field(description="all GPUs together, pad tokens included")
    tokens_per_s_per_gpu: float
    data_tokens_per_s: float = Field(
        description="the data set's tokens consumed per second, all GPUs together: tokens_per_s less the padding "
        "(equal for packed rows); hours and cost follow it"
    )
    mfu: float
    scaling_efficiency: float = Field(
        description="tokens/s on these GPUs / (gpus x tokens/s of one GPU of the card at the same micro-batch)"
    )
    hours: float = Field(description="expected wall-clock hours on demand, start-up to final upload")
    cost_usd: float = Field(description="expected whole-job cost on demand (start-up, download, billing included)")
    price_usd_per_hour: float = Field(description="on-demand price of all GPUs of the setup")
    spot_price_usd_per_hour: float | None = Field(description="spot price of all GPUs; None without spot")
    spot_hours: float | None = Field(
        description="expected wall-clock on spot: preemptions, the wait for capacity and checkpoints included"
    )
    spot_cost_usd: float | None = Field(description="expected whole-job cost on spot, rework included")
    expected_preemptions: float | None
    checkpoint_interval_minutes: float | None = Field(description="the checkpoint interval the spot cost assumes")
    qualifies_with: PricingMode = Field(description="the pricing under which the setup meets budget and deadline")
    price_fetched_at: str = Field(default="", description="when the offer's price was fetched")
    price_age_hours: float | None = Field(default=None, description="age of the price at planning time")
    stale_price: bool = Field(default=False, description="the price is older than a day")
    notes: list[str]
    ranking_notes: list[str] = Field(
        default_factory=list,
        description="the notes that compare this setup with the others ranked (constraints.prefer_simpler_within, "
        "the CPU-offload caution); they are in notes too, a caution first and comparisons last",
    )

    @model_validator(mode="before")
    @classmethod
    def _priced(cls, data: Any) -> Any:
        """A recommendation written before the expected-cost fields (stored plans, exports) is read as its
        on-demand pricing."""
        if isinstance(data, dict) and "expected_cost_usd" not in data and "cost_usd" in data:
            data = {
                "pricing": "on_demand",
                "expected_cost_usd": data["cost_usd"],
                "expected_hours": data.get("hours", 0.0),
                "cost_breakdown": {
                    "compute": data["cost_usd"],
                    "startup": 0.0,
                    "model_download": 0.0,
                    "checkpoint_writes": 0.0,
                    "preemption_rework": 0.0,
                    "billing_rounding": 0.0,
                    "on_demand_fallback": 0.0,
                },
                **data,
            }
        return data


class Rejection(_Out):
    """A card (or one offer of it) with no setup the user can take, and why, in numbers."""

    gpu: str
    provider: str | None = Field(default=None, description="None when the reason holds for every offer of the card")
    kind: RejectionKind
    reason: str
    needed_gib_per_gpu: float | None = None
    gpu_memory_gib: float | None = None
    usable_gib: float | None = None
    usable_gib_per_gpu: float | None = Field(default=None, description="the card's memory less the safety margin")
    fix: str | None = Field(default=None, description="the cheapest change that makes it fit")
    gpus: int | None = Field(default=None, description="the GPU count the numbers refer to")
    cost_usd: float | None = None
    hours: float | None = None
    suggestion: str | None = None
    host_ram_needed_gib_per_node: float | None = Field(
        default=None, description="host RAM per node the leanest CPU-offload setup needs (when host RAM was the limit)"
    )
    host_ram_gib_per_node: float | None = Field(
        default=None, description="host RAM per node the offer has for that setup (when host RAM was the limit)"
    )


class PlannerResult(_Out):
    """Setups ranked by total job cost (cheapest first), the best per card, and the rejections."""

    model: str
    total_tokens: float
    plan_effective_batch_size: int
    recommendations: list[Recommendation]
    best_per_gpu: list[Recommendation] = Field(
        description="each card's first qualifying setup among its own (the cheapest unless a simpler setup of the "
        "card is within constraints.prefer_simpler_within of it; other cards' setups do not hold it back), cheapest "
        "first"
    )
    rejections: list[Rejection]
    candidates_evaluated: int = Field(description="setups whose memory was checked (offer x GPUs x config x batch)")
    warnings: list[str]
    assumptions: list[str]
