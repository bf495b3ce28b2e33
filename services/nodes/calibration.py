"""Calibration rule: for a GPU model and training method with usable calibration results in the organization,
the planner and /v1/estimate use the median calibrated utilisation of the latest five instead of the GPU-class
prior (services/estimator/throughput.py UTILISATION_PRIOR). A result's calibrated utilisation is the
large-GEMM rate at which the estimate of the measured plan meets the measured tokens/s (``gemm_utilisation``,
services.estimator.estimate.utilisation_reproducing); results stored before that column existed count with
their hardware FLOPs utilisation.

One mislabelled node must not poison the organization's estimates (issue 25), so a result is screened when
it arrives (``screen``; stored either way, with the reason when it is not used) and bounded when it is used:

- the device it measured must be the node's GPU as NVML reported it at registration; a GPU named only by
  ``--gpu`` (NVML could not tell) is unverified, and since plans and estimates are not tied to nodes, an
  unverified result is used by no estimate; a result measured on ``cpu`` or on a node of 0 GPUs never is;
- its utilisation must lie in the class's plausible range (``plausible_range``) and near the organization's
  other results for the card and method (``agree``), when there are at least two;
- until a second result agrees, the median may move the estimate no further than the estimator's 80%
  tokens/s band allows (``limits``): the utilisation is held to prior x [low, high] of that band, which
  bounds the tokens/s by the same ratios (step time falls no faster than the GEMM time as it rises).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from services.catalog.gpus import GpuSpec, find_gpu
from services.estimator.errors import EstimatorError
from services.estimator.throughput import MATMUL_SHARE, TYPICAL_MATMUL_SHARE, utilisation_or_prior
from services.estimator.uncertainty import pool_of, prediction_bounds
from services.nodes.tables import BenchmarkRow

CALIBRATION_WINDOW = 5
# Results the organization needs for the card and method before a newcomer far from them is left out: with
# one, which of the two is wrong cannot be told, so both stay and the band caps the move (``select_utilisation``).
OUTLIER_QUORUM = 2


@dataclass(frozen=True)
class Limits:
    """What services/nodes/data/calibration_band.json (benchmarks/accuracy/calibration_band.py) implies."""

    band_low_ratio: float  # the 80% band of measured / predicted tokens/s
    band_high_ratio: float
    band_cases: int
    slowest_ratio: float  # the slowest published run's reproduced utilisation over its class prior
    slowest_case: str

    @property
    def agree_log(self) -> float:
        """Two results agree when their ratio is within half the band's width (log scale): farther apart,
        they cannot both be inside the band around one true rate."""
        return (math.log(self.band_high_ratio) - math.log(self.band_low_ratio)) / 2


@cache
def limits() -> Limits:
    """The band and the plausible floor, from the bundled table (read once per process)."""
    text = resources.files("services.nodes").joinpath("data/calibration_band.json").read_text(encoding="utf-8")
    data = json.loads(text)
    if data.get("schema_version") != 1:
        raise ValueError("calibration_band.json: schema_version 1 expected")
    # The same prediction interval the memory band uses (Hahn & Meeker, via services/estimator/uncertainty.py).
    pool = pool_of([float(v) for v in data["tokens_per_s_log_residuals"]])
    low, high = prediction_bounds(pool)
    slowest = min(data["utilisation_ratios"], key=lambda r: float(r["ratio_to_prior"]))
    return Limits(math.exp(low), math.exp(high), pool.n, float(slowest["ratio_to_prior"]), str(slowest["id"]))


def plausible_range(gpu: GpuSpec) -> tuple[float, float]:
    """(lowest, highest) GEMM utilisation a real training run on ``gpu`` plausibly reproduces.

    Lowest: the slowest published run with a measured rate (benchmarks/accuracy/cases.jsonl) relative to its
    class prior, applied to this class's prior. Highest: the best-case matmul share of the class (stas00's
    mamf-finder, services/estimator/throughput.py MATMUL_SHARE): a training step's GEMMs do not beat the best
    single matmul the card runs; classes without a measurement take the datacenter-typical share."""
    prior = utilisation_or_prior(gpu, None)
    return limits().slowest_ratio * prior, MATMUL_SHARE.get(gpu.gpu_class, TYPICAL_MATMUL_SHARE)


def agree(a: float, b: float) -> bool:
    return abs(math.log(a / b)) <= limits().agree_log


def catalog_name(device: str) -> str | None:
    """The catalog GPU a measured device name (``torch.cuda.get_device_name``) or NVML name is, if any."""
    if not device or device.strip().lower() == "cpu":
        return None
    try:
        return find_gpu(device).name
    except EstimatorError:
        return None


def device_check(
    node_gpu: str, node_gpu_count: int, nvml_gpu: str, device: str, measured_gpus: int = 1
) -> tuple[bool, str | None]:
    """(verified, why the result may not calibrate ``node_gpu`` or None) from what the node's NVML reported
    at registration and the device (and GPU count) the calibration measured on."""
    if node_gpu == "cpu":
        return False, "a CPU node: it calibrates no GPU"
    if device.strip().lower() == "cpu" or node_gpu_count == 0:
        return False, (
            f"measured on device {device or '(none)'!r} with {node_gpu_count} GPU(s): a CPU measurement never "
            f"calibrates a GPU (the node was registered as {node_gpu})"
        )
    measured = catalog_name(device)
    if measured != node_gpu:
        return False, f"measured on device {device or '(none)'!r}, which is not the node's GPU {node_gpu}"
    if measured_gpus > node_gpu_count:
        return False, f"measured on {measured_gpus} GPUs; the node registered {node_gpu_count}"
    if catalog_name(nvml_gpu) != node_gpu:
        return False, (
            f"unverified: NVML did not report the node's GPU at registration (it was named by --gpu), so the "
            f"result is used by no estimate; run the agent where NVML sees the {node_gpu}"
        )
    return True, None


def screen(
    gpu: GpuSpec,
    utilisation: float | None,
    met: bool,
    others: Sequence[float],
) -> str | None:
    """Why a device-verified result's utilisation may not be used (None: it may); ``others`` are the
    organization's latest used results for the same card and method."""
    if utilisation is None:
        return None  # a generic model: the hardware utilisation stands in (see the module docstring)
    if not met:
        return f"implausible: no GEMM utilisation from 1e-6 to 1 reproduces the measured rate on a {gpu.name}"
    low, high = plausible_range(gpu)
    if not low <= utilisation <= high:
        lim = limits()
        return (
            f"implausible: GEMM utilisation {utilisation:.4g} is outside {low:.3g}-{high:.3g} for {gpu.gpu_class} "
            f"GPUs (lowest: the slowest published run, {lim.slowest_case}, at {lim.slowest_ratio:g} x its class "
            f"prior; highest: the class's best-case matmul share, stas00's mamf-finder)"
        )
    if len(others) >= OUTLIER_QUORUM:
        median = statistics.median(others)
        if not agree(utilisation, median):
            return (
                f"far from the organization's other results: GEMM utilisation {utilisation:.4g} against the median "
                f"{median:.4g} of {len(others)} result(s) for the {gpu.name} (agreement: within x"
                f"{math.exp(limits().agree_log):.2f})"
            )
    return None


@dataclass(frozen=True)
class Selected:
    utilisation: float
    results: int
    capped: bool  # held to the band around the prior until a second result agrees


def select_utilisation(values: Sequence[float], prior: float) -> Selected:
    """The utilisation the latest used results (newest first) give: their median, held to prior x the band
    unless at least two of them agree with it."""
    window = list(values[:CALIBRATION_WINDOW])
    median = statistics.median(window)
    if sum(1 for v in window if agree(v, median)) >= 2:
        return Selected(median, len(window), False)
    lim = limits()
    held = min(max(median, prior * lim.band_low_ratio), prior * lim.band_high_ratio)
    return Selected(held, len(window), held != median)


def _value(row: BenchmarkRow) -> float | None:
    return row.gemm_utilisation if row.gemm_utilisation is not None else row.hardware_utilisation


def used_values(session: Session, organization_id: str, method: str, gpu: str | None = None) -> dict[str, list[float]]:
    """GPU name -> the utilisations of the organization's used results for ``method``, newest first."""
    query = select(BenchmarkRow).where(
        BenchmarkRow.organization_id == organization_id,
        BenchmarkRow.method == method,
        or_(BenchmarkRow.gemm_utilisation.is_not(None), BenchmarkRow.hardware_utilisation.is_not(None)),
        BenchmarkRow.comparable.is_(True),
        BenchmarkRow.used.is_(True),
    )
    if gpu is not None:
        query = query.where(BenchmarkRow.gpu == gpu)
    by_gpu: dict[str, list[float]] = {}
    for row in session.scalars(query.order_by(BenchmarkRow.created_at.desc(), BenchmarkRow.id.desc())):
        value = _value(row)
        if value is not None:
            by_gpu.setdefault(row.gpu, []).append(value)
    return by_gpu


def calibrated_utilisation(session: Session, organization_id: str, method: str) -> dict[str, tuple[float, str]]:
    """GPU name -> (calibrated utilisation for ``method``, where it came from)."""
    out: dict[str, tuple[float, str]] = {}
    for gpu, values in used_values(session, organization_id, method).items():
        try:
            spec = find_gpu(gpu)
        except EstimatorError:
            continue  # a card since removed from the catalog
        chosen = select_utilisation(values, utilisation_or_prior(spec, None))
        source = f"calibrated on {chosen.results} {method} run(s) on {gpu}"
        if chosen.capped:
            lim = limits()
            source += (
                f", held to the 80% tokens/s band of the prior (x{lim.band_low_ratio:.2f}-x{lim.band_high_ratio:.2f})"
                " until a second result agrees"
            )
        out[gpu] = (chosen.utilisation, source)
    return out
