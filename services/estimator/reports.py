"""The estimate as the API and the command line return it: memory per GPU, fit per card, throughput and cost
(pydantic models, frozen). services.estimator.estimate builds them."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class _Out(BaseModel):
    model_config = ConfigDict(frozen=True)


class ParameterReport(_Out):
    total: int
    trainable: int
    active: int
    embedding: int
    attention: int
    mlp: int
    lm_head: int


class MemoryReport(_Out):
    peak_allocated_gib: float
    peak_reserved_gib: float
    peak_device_gib: float
    peak_moment: str
    breakdown: dict[str, float]  # GiB per component at the peak moment; sums to peak_device_gib
    moments_gib: dict[str, float]  # allocated GiB at each moment of the step
    activations_per_layer_per_token_bytes: dict[str, float]
    optimizer_states_paged_gib: float
    # Free cached blocks (FSDP1's stream pools, the segments of other batch lengths, what checkpointed
    # rebuilds leave cached) that max_memory_reserved and nvidia-smi also show when memory is plentiful;
    # the allocator frees them before failing, so fits do not count them, and on a known card they are at
    # most what it has left.
    reclaimable_cache_gib: float
    # [p10, p90] of the device peak (the figure fits are checked against): 80% of measured peaks of the
    # plan's category fell inside such a band (services/estimator/uncertainty.py).
    interval_gib: list[float]
    intervals_gib: dict[str, list[float]]  # the same band for each counter: allocated, reserved, device
    interval_basis: str


class FitReport(_Out):
    gpu: str
    memory_gib: float
    fits: bool
    headroom_gib: float
    tight: bool


class ThroughputReport(_Out):
    gpu: str
    gpus: int
    tokens_per_s: float  # tokens processed per second over all GPUs, pad tokens included
    tokens_per_s_per_gpu: float
    # Tokens of the data set consumed per second (equal to tokens_per_s for packed rows or when the plan
    # gives no mean example length); the run's time and cost follow it.
    data_tokens_per_s: float
    mfu: float
    utilisation_assumed: float
    utilisation_source: str
    hardware_flops_per_token: float
    step_seconds: float
    seconds_per_step: dict[str, float]


class CostReport(_Out):
    provider: str
    gpu: str
    gpus: int
    fits: bool
    tokens_per_s: float  # processed, pad tokens included
    data_tokens_per_s: float  # the data set's tokens per second: usd_per_million_tokens and hours use it
    on_demand_usd_per_hour: float  # for all GPUs of the plan
    spot_usd_per_hour: float | None
    usd_per_million_tokens: float
    hours: float | None
    on_demand_usd: float | None
    spot_usd: float | None


class Estimate(_Out):
    model: str
    model_type: str
    # "low" where the model's family is unknown and its shapes come from the standard config keys.
    confidence: str = "high"
    parameters: ParameterReport
    mode: str
    memory: MemoryReport
    fits: list[FitReport]
    throughput: ThroughputReport | None
    costs: list[CostReport]
    total_tokens: float | None
    warnings: list[str]
    assumptions: list[str]
