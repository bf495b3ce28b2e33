"""The fit rule: whether a predicted device peak fits a card (pure).

One rule for the estimate's per-card fits (the CLI's table, POST /v1/estimate) and the planner: the
predicted device peak times a headroom ratio from the uncertainty band is at most the card, less an extra
margin the user may ask for (constraints.safety_margin; none by default).
"""

from __future__ import annotations

from services.estimator.memory import GIB
from services.estimator.uncertainty import Key, Pool, bundled_pools, category, quantile_ratio

# The quantile of the device band's measured / predicted a setup is sized on (the band is
# services.estimator.uncertainty's, per category): fitted by benchmarks/accuracy/headroom.py on the declared
# split it names; docs/planner.md gives its held-out effect.
FIT_QUANTILE = 0.46


def headroom_ratio(
    framework: str,
    method: str,
    sharding: str,
    gpus: int,
    mode: str = "train",
    low_confidence: bool = False,
    pools: dict[Key, Pool] | None = None,
    level: float = FIT_QUANTILE,
) -> float:
    """What the predicted device peak is multiplied by before it is set against the card: the ``level``
    quantile of measured / predicted in the device band's category (``pools``: the bundled residual table),
    never below 1 (no card is offered that the predicted peak itself overflows)."""
    key = category(framework, method, sharding, gpus, "device", mode)
    return max(1.0, quantile_ratio(pools if pools is not None else bundled_pools(), key, level, low_confidence))


def usable_card_bytes(memory_gib: float, safety_margin: float) -> float:
    """Memory per GPU a setup may use: the card less the user's extra margin (constraints.safety_margin)."""
    return memory_gib * (1.0 - safety_margin) * GIB


def fits_card(peak_device_bytes: float, ratio: float, memory_gib: float, safety_margin: float = 0.0) -> bool:
    """The fit rule: the predicted device peak times the headroom ratio is at most the usable card."""
    return peak_device_bytes * ratio <= usable_card_bytes(memory_gib, safety_margin)
