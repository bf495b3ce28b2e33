"""The uncertainty band of a memory estimate: [p10, p90] of the measured peak, from past residuals.

The estimator's error is not the same everywhere: a LitGPT LoRA run on one GPU is predicted within a
few percent, a multi-GPU FSDP run read from nvidia-smi much less closely. So the band comes from the
residuals of measured cases in the same category (framework x method x sharding x metric), computed by
``benchmarks/accuracy/band.py`` over benchmarks/accuracy/cases.jsonl and stored in
``data/residuals.json``. The file is package data, read once; estimating does no other I/O.

A residual is ln(measured / predicted) for one case, on the counter the case measured. For a category:

1. Pool upward while it has fewer than ``MIN_CASES`` residuals: (framework, method, sharding, metric)
   -> (framework, method, sharding) -> (method, sharding) -> (method) -> all cases.
2. Take the normal-theory prediction interval for one new case, mean +- t(0.9, n-1) x sd x sqrt(1 + 1/n)
   (Hahn & Meeker, "Statistical Intervals", 2nd ed., section 4.6; the t-quantile and the 1/n term widen
   the band when the pool is small), and widen it to the pool's empirical p10 and p90 when those lie
   outside (heavy tails).
3. Low confidence (an architecture estimated from generic config keys, or a model without an
   architecture): the standard deviation is at least that of all cases, and the band at least as wide
   as the band of all cases.

The numbers are in-sample: the residuals come from the same cases the estimator was checked on.
``benchmarks/accuracy/band.py`` also reports leave-one-out coverage, the honest figure.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

# Below this many residuals a category borrows its parent's: a p10/p90 from fewer points is noise.
MIN_CASES = 8
# The band's nominal coverage: the 10th to the 90th percentile.
LOWER_QUANTILE = 0.10
UPPER_QUANTILE = 0.90

Key = tuple[str, ...]


def sharding_kind(sharding: str, gpus: int) -> str:
    """'single' (one GPU), 'ddp' (replicated on several), or the sharding name (zero1-3, fsdp)."""
    if sharding == "none":
        return "single" if gpus == 1 else "ddp"
    return sharding


def category(framework: str, method: str, sharding: str, gpus: int, metric: str, mode: str = "train") -> Key:
    """The most specific category of a case or an estimate: framework, method, sharding, metric."""
    return (framework, method if mode == "train" else "inference", sharding_kind(sharding, gpus), metric)


def parents(key: Key) -> list[Key]:
    """The key and its ancestors, most specific first (see the module docstring, step 1)."""
    framework, method, sharding, _metric = key
    return [key, (framework, method, sharding), (method, sharding), (method,), ()]


@dataclass(frozen=True)
class Pool:
    """Summary of the log residuals of one category (with its descendants)."""

    n: int
    mean: float
    sd: float
    empirical_low: float
    empirical_high: float


@dataclass(frozen=True)
class Band:
    """Multiplicative band: the measured peak lies in [low_ratio, high_ratio] x predicted, 80% of the time."""

    low_ratio: float
    high_ratio: float
    cases: int
    category: str  # the category the residuals came from, e.g. "torchtune/lora/single"
    widened_low_confidence: bool

    def interval(self, predicted: float) -> tuple[float, float]:
        return predicted * self.low_ratio, predicted * self.high_ratio


def quantile(values: list[float], q: float) -> float:
    """Linear-interpolated quantile of ``values`` (numpy's default 'linear' method)."""
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def t_quantile(p: float, dof: int) -> float:
    """Student's t quantile: exact for 1 and 2 degrees of freedom, else the Cornish-Fisher expansion
    around the normal quantile (Abramowitz & Stegun 26.7.5; error < 1e-3 for dof >= 3 at p = 0.9)."""
    if dof < 1:
        raise ValueError("dof: at least 1 degree of freedom")
    if dof == 1:
        return math.tan(math.pi * (p - 0.5))
    if dof == 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    z = statistics.NormalDist().inv_cdf(p)
    v = float(dof)
    return (
        z
        + (z**3 + z) / (4 * v)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3)
    )


def pool_of(residuals: list[float]) -> Pool:
    n = len(residuals)
    return Pool(
        n=n,
        mean=statistics.fmean(residuals),
        sd=statistics.stdev(residuals) if n > 1 else 0.0,
        empirical_low=quantile(residuals, LOWER_QUANTILE),
        empirical_high=quantile(residuals, UPPER_QUANTILE),
    )


def build_pools(residuals_by_category: dict[Key, list[float]]) -> dict[Key, Pool]:
    """Pools for every category and each of its ancestors (an ancestor holds all its descendants)."""
    gathered: dict[Key, list[float]] = {}
    for key, values in residuals_by_category.items():
        for parent in parents(key):
            gathered.setdefault(parent, []).extend(values)
    return {key: pool_of(values) for key, values in gathered.items() if values}


def prediction_bounds(pool: Pool) -> tuple[float, float]:
    """(low, high) log-ratio bounds: the t prediction interval widened to the empirical quantiles."""
    if pool.n < 2:
        return pool.empirical_low, pool.empirical_high
    half = t_quantile(UPPER_QUANTILE, pool.n - 1) * pool.sd * math.sqrt(1 + 1 / pool.n)
    return min(pool.mean - half, pool.empirical_low), max(pool.mean + half, pool.empirical_high)


def chosen_pool(pools: dict[Key, Pool], key: Key) -> tuple[Key, Pool]:
    """The pool a band of ``key`` rests on: its own if large enough, else the nearest ancestor's (step 1)."""
    chain = parents(key)
    chosen = chain[-1]
    for candidate in chain:
        found = pools.get(candidate)
        if found is not None and found.n >= MIN_CASES:
            chosen = candidate
            break
    pool = pools.get(chosen) or pools.get(())
    if pool is None:
        raise ValueError("residuals: the residual table is empty")
    return chosen, pool


def quantile_ratio(pools: dict[Key, Pool], key: Key, level: float, low_confidence: bool = False) -> float:
    """The ``level`` quantile of measured / predicted for ``key``: exp(mean + t(level, n-1) x sd x sqrt(1 + 1/n)),
    the normal-theory prediction quantile of step 2 at another level (sd at least all cases' when low confidence)."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level: a quantile strictly between 0 and 1 (got {level})")
    _, pool = chosen_pool(pools, key)
    root = pools.get(())
    sd = max(pool.sd, root.sd) if low_confidence and root is not None else pool.sd
    if pool.n < 2:
        return math.exp(pool.mean)
    return math.exp(pool.mean + t_quantile(level, pool.n - 1) * sd * math.sqrt(1 + 1 / pool.n))


def band_from_pools(pools: dict[Key, Pool], key: Key, low_confidence: bool = False) -> Band:
    """The band for ``key``: its own pool if large enough, else the nearest ancestor's (step 1-3)."""
    chosen, pool = chosen_pool(pools, key)
    root = pools.get(())
    lo, hi = prediction_bounds(pool)
    if low_confidence and root is not None:
        widened = Pool(pool.n, pool.mean, max(pool.sd, root.sd), pool.empirical_low, pool.empirical_high)
        lo, hi = prediction_bounds(widened)
        root_lo, root_hi = prediction_bounds(root)
        lo, hi = min(lo, root_lo), max(hi, root_hi)
    return Band(
        low_ratio=math.exp(lo),
        high_ratio=math.exp(hi),
        cases=pool.n,
        category="/".join(chosen) or "all cases",
        widened_low_confidence=low_confidence,
    )


def parse_table(data: dict[str, Any]) -> dict[Key, list[float]]:
    """Residual lists by category from the JSON layout written by benchmarks/accuracy/band.py."""
    if data.get("schema_version") != 1:
        raise ValueError("residuals: schema_version 1 expected")
    out: dict[Key, list[float]] = {}
    for row in data["categories"]:
        key = (str(row["framework"]), str(row["method"]), str(row["sharding"]), str(row["metric"]))
        out[key] = [float(v) for v in row["log_residuals"]]
    return out


@cache
def bundled_pools() -> dict[Key, Pool]:
    """The residual pools from the bundled table, loaded once per process."""
    text = resources.files("services.estimator").joinpath("data/residuals.json").read_text(encoding="utf-8")
    return build_pools(parse_table(json.loads(text)))


def memory_band(
    framework: str,
    method: str,
    sharding: str,
    gpus: int,
    metric: str,
    mode: str = "train",
    low_confidence: bool = False,
) -> Band:
    """The [p10, p90] band (as ratios to the prediction) for one counter of one plan."""
    return band_from_pools(bundled_pools(), category(framework, method, sharding, gpus, metric, mode), low_confidence)
