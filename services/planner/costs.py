"""What a rented run pays, on demand and on spot (pure).

A run is billed from the moment its nodes are provisioned: start-up (provisioning and boot), downloading
the base model, training, the checkpoints it writes on the way, the final upload, and, on spot, the
restarts and recomputed work after preemptions. The provider bills per increment with a minimum; the
difference between the billed and the used time is ``billing_rounding``.

Defaults where an offer does not say (each an ASSUMPTION unless a source is named):

- start-up: 300 s (provisioning, image pull and boot; dstack reports instances taking 2-20 min to come up,
  shared/reference/orchestration_lessons.md section 2);
- model download: 4 Gbit/s (500 MB/s, what hf_transfer reaches from the Hugging Face Hub on a well
  connected cloud node per its README; slower links should be set on the offer);
- spot preemptions, the wait for capacity and the chance there is none: the sourced figures of
  services.planner.spot (SPOT_RISKS, measured on GPU spot traces), scaled by the node's GPUs (a whole 8-GPU node
  is lost 3.6x as often as one card) where the offer gives no rate of its own;
- final upload and checkpoint writes to object storage at 100 MB/s (services.planner.checkpoints).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from services.catalog.market import Market
from services.catalog.offers import Offer
from services.core.money import usd
from services.estimator.memo import quick_init
from services.planner.checkpoints import DEFAULT_MAX_INTERVAL_S, FAILURES_PER_GPU_HOUR, MIN_INTERVAL_S
from services.planner.models import PricingMode
from services.planner.spot import (
    AWS_GPU_PREEMPTIONS_PER_NODE_HOUR,
    CAPACITY_WAIT_CAP_HOURS,
    EIGHT_GPU_NODE_SCARCITY,
    SCARCITY_NODE_GPUS,
    SpotRisk,
    node_scarcity,
    on_demand_fallback_hours,
    spot_risk,
    young_daly_interval_seconds,
)

DEFAULT_STARTUP_S = 300.0
DEFAULT_DOWNLOAD_GBIT_PER_S = 4.0
# A one-GPU spot node where neither the user nor the offer gives a rate (services.planner.spot, sourced there).
DEFAULT_PREEMPTION_PER_NODE_HOUR = AWS_GPU_PREEMPTIONS_PER_NODE_HOUR
UPLOAD_BYTES_PER_S = 100e6
MAX_WRITE_SHARE_INVERSE = 10.0  # the hourly cap keeps checkpoint writes under 1/10 of the run


@quick_init
@dataclass(frozen=True)
class RunShape:
    """What the cost of a run depends on besides the offer: its size and its speed."""

    gpus: int
    nodes: int
    training_s: float  # uninterrupted training on these GPUs
    model_download_bytes: float  # the base model as downloaded (16-bit safetensors)
    checkpoint_bytes: float  # one resumable checkpoint
    final_upload_bytes: float  # the adapter or the weights at the end
    checkpoint_write_s: float  # training stalls this long per checkpoint


@quick_init
@dataclass(frozen=True)
class RunCost:
    """One pricing of one setup: expected wall-clock, billed time and the cost split by cause."""

    pricing: PricingMode
    price_usd_per_hour: float  # all GPUs of the setup
    hours: float  # expected wall-clock, start-up to final upload
    billed_hours: float
    expected_cost_usd: float
    breakdown: dict[str, float]  # USD: compute, startup, model_download, checkpoint_writes, preemption_rework,
    # billing_rounding
    interruptions_per_hour: float  # of the whole job
    expected_preemptions: float
    checkpoint_interval_s: float
    restart_s: float
    # Spot only (zero on demand): the per-node rate and where it comes from, the expected wall-clock spent waiting
    # for capacity (not billed: no node is held), the chance the job finishes on demand for lack of capacity, and
    # what that costs beyond spot (inside breakdown["preemption_rework"]).
    preemptions_per_node_hour: float = 0.0
    rate_source: str = ""
    capacity_wait_hours: float = 0.0
    on_demand_fallback_probability: float = 0.0
    on_demand_fallback_usd: float = 0.0


def startup_seconds(offer: Offer) -> float:
    return offer.startup_s if offer.startup_s is not None else DEFAULT_STARTUP_S


def download_seconds(offer: Offer, size_bytes: float) -> float:
    """Seconds to download the base model on each node (nodes download in parallel)."""
    gbit = offer.download_gbit_per_s if offer.download_gbit_per_s else DEFAULT_DOWNLOAD_GBIT_PER_S
    return size_bytes / (gbit / 8.0 * 1e9)


def preemption_rate(offer: Offer, override: float | None, gpus_per_node: int = 1) -> tuple[float, str]:
    """Spot preemptions per node-hour and their source: the user's figure, else the offer's (both per node as
    rented), else the provider's sourced one-GPU figure x the scarcity of a node of ``gpus_per_node`` GPUs."""
    if override is not None:
        return override, "constraints.preemptions_per_hour"
    if offer.preemption_per_hour is not None:
        return offer.preemption_per_hour, f"the offer's preemption_per_hour ({offer.source})"
    risk = spot_risk(offer.provider)
    scarcity = node_scarcity(gpus_per_node)
    source = f"{risk.source}, {risk.as_of}"
    if gpus_per_node > 1:
        source += f"; x{scarcity:.2g} for a node of {gpus_per_node} GPUs"
    return risk.preemptions_per_node_hour * scarcity, source


def billed_seconds(used_s: float, increment_s: int, minimum_s: int) -> float:
    """Seconds a provider bills for ``used_s`` of use: rounded up to the increment, at least the minimum."""
    rounded = math.ceil(used_s / increment_s - 1e-9) * increment_s if increment_s > 1 else used_s
    return max(float(rounded), float(minimum_s))


def checkpoint_interval_s(write_s: float, interruptions_per_hour: float, training_s: float) -> float:
    """Young/Daly interval sqrt(2 x write x MTBF) (Young 1974), at least 60 s and no longer than the run.

    Where interruptions are rare the optimum is days, so it is capped at an hour (a run should not lose
    hours to a bug or a dead disk), but the cap never makes writes take more than a tenth of the time
    (a checkpoint that takes 40 minutes to write is not written every hour)."""
    if interruptions_per_hour > 0 and write_s > 0:
        optimum = young_daly_interval_seconds(write_s, 3600.0 / interruptions_per_hour)
    else:
        optimum = math.inf
    cap = max(DEFAULT_MAX_INTERVAL_S, MAX_WRITE_SHARE_INVERSE * write_s)
    return max(min(optimum, cap, max(training_s, MIN_INTERVAL_S)), MIN_INTERVAL_S)


def run_cost(
    offer: Offer,
    shape: RunShape,
    pricing: PricingMode,
    *,
    preemptions_per_node_hour: float | None = None,
    restart_s: float | None = None,
) -> RunCost:
    """Expected cost of the run on ``offer`` under ``pricing`` (spot needs ``offer.spot_usd_per_hour``).

    Interruptions: on spot the preemption rate x nodes (``preemption_rate``); on demand hardware failures, 2e-5 per
    GPU-hour (Llama 3 paper, see services.planner.checkpoints). Each one costs a restart (start-up and download
    again unless ``restart_s`` says otherwise) plus half a checkpoint interval of lost work; checkpoints are
    written every Young/Daly interval. On spot each preemption also waits for capacity (wall-clock, unbilled), and
    after a share of them none comes back within the cap, so the rest of the job runs on demand
    (services.planner.spot). First order in rate x (restart + interval / 2).
    """
    per_gpu = offer.spot_usd_per_hour if pricing == "spot" else offer.on_demand_usd_per_hour
    if per_gpu is None:
        raise ValueError(f"offer {offer.provider} / {offer.gpu} has no {pricing} price")
    price = per_gpu * shape.gpus
    per_s = price / 3600.0
    startup_s = startup_seconds(offer)
    download_s = download_seconds(offer, shape.model_download_bytes)
    risk: SpotRisk | None = None
    node_rate, rate_source = 0.0, ""
    if pricing == "spot":
        node_rate, rate_source = preemption_rate(offer, preemptions_per_node_hour, shape.gpus // shape.nodes)
        # A preemption of any node stops the job.
        rate = node_rate * shape.nodes
        risk = spot_risk(offer.provider)
    else:
        rate = FAILURES_PER_GPU_HOUR * shape.gpus
    # Sharded checkpoints: every node writes its part at once.
    write_s = shape.checkpoint_write_s / shape.nodes
    interval = checkpoint_interval_s(write_s, rate, shape.training_s)
    writes = max(0, math.ceil(shape.training_s / interval) - 1)
    checkpoint_s = writes * write_s + shape.final_upload_bytes / UPLOAD_BYTES_PER_S
    restart = restart_s if restart_s is not None else startup_s + download_s
    base_s = startup_s + download_s + shape.training_s + checkpoint_s
    preemptions = (shape.training_s + checkpoint_s) / 3600.0 * rate
    rework_s = preemptions * (restart + interval / 2.0)
    used_s = base_s + rework_s
    billed_s = billed_seconds(used_s, offer.billing_increment_s, offer.billing_minimum_s)
    wait_h = fallback_p = fallback_usd = 0.0
    if risk is not None:
        # Waiting for capacity holds no node (nothing billed) but takes wall-clock; after a wait of the cap the
        # rest of the job runs on demand, paying the difference for those hours.
        wait_h = preemptions * risk.wait_hours
        job_h = (shape.training_s + checkpoint_s) / 3600.0
        lam = rate * risk.no_capacity_share
        fallback_p = 1.0 - math.exp(-lam * job_h)
        extra_per_h = max(offer.on_demand_usd_per_hour - per_gpu, 0.0) * shape.gpus
        fallback_usd = on_demand_fallback_hours(job_h, lam) * extra_per_h
    breakdown = {
        "compute": shape.training_s * per_s,
        "startup": startup_s * per_s,
        "model_download": download_s * per_s,
        "checkpoint_writes": checkpoint_s * per_s,
        "preemption_rework": rework_s * per_s,
        "billing_rounding": (billed_s - used_s) * per_s,
        # Its own line, not rework: it is the on-demand price's excess over spot, not hours at the spot price (a
        # quote probe of stop 52 found a spot quote billing 746 GPU-hours for a run of 302).
        "on_demand_fallback": fallback_usd,
    }
    return RunCost(
        pricing=pricing,
        price_usd_per_hour=price,
        hours=used_s / 3600.0 + wait_h,
        billed_hours=billed_s / 3600.0,
        expected_cost_usd=billed_s * per_s + fallback_usd,
        breakdown=breakdown,
        interruptions_per_hour=rate,
        expected_preemptions=preemptions,
        checkpoint_interval_s=interval,
        restart_s=restart,
        preemptions_per_node_hour=node_rate,
        rate_source=rate_source,
        capacity_wait_hours=wait_h,
        on_demand_fallback_probability=fallback_p,
        on_demand_fallback_usd=fallback_usd,
    )


def spot_note(cost: RunCost, nodes: int, on_demand_usd: float) -> str:
    """What spot adds to a setup, in the numbers the cost rests on, and where the rate comes from."""
    rework = cost.breakdown["preemption_rework"]
    per_node = f"{cost.preemptions_per_node_hour:.3g} per node-hour"
    rate = per_node if nodes == 1 else f"{per_node} x {nodes} nodes = {cost.interruptions_per_hour:.3g} per hour"
    return (
        f"spot: {cost.expected_preemptions:.2f} preemptions expected ({rate}; {cost.rate_source}); each costs a "
        f"restart of {cost.restart_s / 60:.0f} min and half a checkpoint interval (every "
        f"{cost.checkpoint_interval_s / 60:.0f} min): {usd(rework)} of rework and "
        f"{usd(cost.breakdown['checkpoint_writes'])} of checkpoints, plus {cost.capacity_wait_hours * 60:.0f} min "
        f"waiting for capacity (unbilled); a {cost.on_demand_fallback_probability:.0%} chance capacity does not "
        f"come back within {CAPACITY_WAIT_CAP_HOURS:g} h and the job finishes on demand "
        f"({usd(cost.on_demand_fallback_usd)} expected); on demand the same setup is {usd(on_demand_usd)}"
    )


@dataclass(frozen=True)
class OfferColumns:
    """What ``run_cost`` reads of each offer, as arrays over the offers priced together (NaN: not given)."""

    on_demand_usd_per_hour: np.ndarray
    spot_usd_per_hour: np.ndarray
    startup_s: np.ndarray
    download_s: np.ndarray
    billing_increment_s: np.ndarray
    billing_minimum_s: np.ndarray
    preemption_per_hour: np.ndarray
    # The provider's sourced spot figures (services.planner.spot.spot_risk).
    risk_preemptions_per_node_hour: np.ndarray
    risk_wait_hours: np.ndarray
    risk_no_capacity_share: np.ndarray

    def take(self, rows: np.ndarray) -> OfferColumns:
        """The columns of the offers at ``rows`` (positions or a mask), repeated as often as named."""
        return OfferColumns(*(getattr(self, f.name)[rows] for f in dataclasses.fields(self)))


_PRICED = ("on_demand_usd_per_hour", "spot_usd_per_hour", "startup_s", "download_gbit_per_s")
_BILLED = ("billing_increment_s", "billing_minimum_s", "preemption_per_hour")


def offer_columns(market: Market, rows: np.ndarray, model_download_bytes: float, full: bool = True) -> OfferColumns:
    """The columns that pricing reads of the offers of ``market`` at ``rows`` (None becomes NaN); without ``full``,
    only those the lower bound of a cost reads (prices, start-up, download), the others NaN."""
    read = {name: column[rows] for name, column in market.floats(_PRICED + _BILLED if full else _PRICED).items()}
    startup, gbit = read["startup_s"], read["download_gbit_per_s"]
    # startup_seconds and download_seconds, element by element (a download rate of 0 or none: the default)
    startup = np.where(np.isnan(startup), DEFAULT_STARTUP_S, startup)
    gbit = np.where(np.isnan(gbit) | (gbit == 0), DEFAULT_DOWNLOAD_GBIT_PER_S, gbit)
    unread = np.full(len(rows), np.nan)
    increment = minimum = preemption = unread
    risk = np.full((len(rows), 3), np.nan)
    if full:
        increment, minimum, preemption = (read[name] for name in _BILLED)
        ids, providers = market.codes(("provider",))
        figures = [spot_risk(str(p)) for (p,) in providers]
        per_provider = np.array(
            [(r.preemptions_per_node_hour, r.wait_hours, r.no_capacity_share) for r in figures], dtype=float
        ).reshape(len(providers), 3)
        risk = per_provider[ids[rows]]
    return OfferColumns(
        on_demand_usd_per_hour=read["on_demand_usd_per_hour"],
        spot_usd_per_hour=read["spot_usd_per_hour"],
        startup_s=startup,
        download_s=model_download_bytes / (gbit / 8.0 * 1e9),
        billing_increment_s=increment,
        billing_minimum_s=minimum,
        preemption_per_hour=preemption,
        risk_preemptions_per_node_hour=risk[:, 0],
        risk_wait_hours=risk[:, 1],
        risk_no_capacity_share=risk[:, 2],
    )


def run_costs(
    offers: OfferColumns,
    gpus: np.ndarray,
    nodes: np.ndarray,
    training_s: np.ndarray,
    sizes: RunShape,
    pricing: PricingMode,
    *,
    preemptions_per_node_hour: float | None = None,
    restart_s: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(expected cost USD, expected hours) of ``run_cost`` for many runs at once: run i on the offer of row i of
    ``offers`` with ``gpus[i]`` GPUs on ``nodes[i]`` nodes training ``training_s[i]`` seconds (``sizes`` gives the
    bytes and write time, its other fields unused). The same operations in the same order as ``run_cost``, so the
    same numbers to the last bit (exponentials through math.exp)."""
    spot = pricing == "spot"
    per_gpu = offers.spot_usd_per_hour if spot else offers.on_demand_usd_per_hour
    price = per_gpu * gpus
    per_s = price / 3600.0
    startup_s, download_s = offers.startup_s, offers.download_s
    if spot:
        if preemptions_per_node_hour is not None:
            node_rate = np.full(len(gpus), float(preemptions_per_node_hour))
        else:
            g = np.clip(gpus // nodes, 1, SCARCITY_NODE_GPUS)
            scarcity = 1.0 + (EIGHT_GPU_NODE_SCARCITY - 1.0) * (g - 1) / (SCARCITY_NODE_GPUS - 1)
            sourced = offers.risk_preemptions_per_node_hour * scarcity
            node_rate = np.where(np.isnan(offers.preemption_per_hour), sourced, offers.preemption_per_hour)
        rate = node_rate * nodes
    else:
        rate = FAILURES_PER_GPU_HOUR * gpus
    write_s = sizes.checkpoint_write_s / nodes
    # checkpoint_interval_s
    with np.errstate(divide="ignore"):
        optimum = np.where(
            (rate > 0) & (write_s > 0), np.sqrt(2.0 * write_s * (3600.0 / np.where(rate > 0, rate, 1.0))), np.inf
        )
    cap = np.maximum(DEFAULT_MAX_INTERVAL_S, MAX_WRITE_SHARE_INVERSE * write_s)
    interval = np.maximum(np.minimum(np.minimum(optimum, cap), np.maximum(training_s, MIN_INTERVAL_S)), MIN_INTERVAL_S)
    writes = np.maximum(0.0, np.ceil(training_s / interval) - 1)
    checkpoint_s = writes * write_s + sizes.final_upload_bytes / UPLOAD_BYTES_PER_S
    restart = restart_s if restart_s is not None else startup_s + download_s
    base_s = startup_s + download_s + training_s + checkpoint_s
    preemptions = (training_s + checkpoint_s) / 3600.0 * rate
    rework_s = preemptions * (restart + interval / 2.0)
    used_s = base_s + rework_s
    # billed_seconds
    increment, minimum = offers.billing_increment_s, offers.billing_minimum_s
    rounded = np.where(increment > 1, np.ceil(used_s / increment - 1e-9) * increment, used_s)
    billed_s = np.maximum(rounded, minimum)
    cost = billed_s * per_s
    hours = used_s / 3600.0
    if spot:
        wait_h = preemptions * offers.risk_wait_hours
        job_h = (training_s + checkpoint_s) / 3600.0
        lam = rate * offers.risk_no_capacity_share
        extra_per_h = np.maximum(offers.on_demand_usd_per_hour - per_gpu, 0.0) * gpus
        # on_demand_fallback_hours
        lost = [math.exp(-x) for x in (lam * job_h).tolist()]
        with np.errstate(divide="ignore", invalid="ignore"):
            fallback_h = np.where((lam > 0) & (job_h > 0), job_h - (1.0 - np.array(lost)) / lam, 0.0)
        cost = cost + fallback_h * extra_per_h
        hours = hours + wait_h
    return cost, hours
