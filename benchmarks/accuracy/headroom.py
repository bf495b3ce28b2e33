"""Fit the planner's headroom quantile (services.estimator.fit.FIT_QUANTILE) on a declared split.

The planner offers a card when the predicted device peak times the ``level`` quantile of measured / predicted
in the setup's band category (services.estimator.uncertainty.quantile_ratio) is at most the card. A higher
level refuses more setups. On the split every level in (lowest, highest] is admissible:

- lowest: the smallest level at which the band's quantile alone refuses every measured out-of-memory run of
  the split on its card. The planner's ratio is never below 1 (it offers nothing the point estimate refuses),
  and every OOM of today's cases is predicted above its card, so that floor alone would refuse them all: the
  level is asked to catch them without it, so that the headroom rests on the band and not on the floor;
- highest: the largest level at which the planner's ratio (floor included) refuses at most
  TARGET_REFUSED_SHARE of the split's runs that ran.

The fitted level is the middle of that interval, rounded to two decimals, so that neither end decides it.

Declared split: the medium + high confidence measured cases of benchmarks/accuracy/cases.jsonl (``derived``
rows excluded), sized on the residual table of all those cases (the bundled one). The held-out effect is
``python -m benchmarks.accuracy.heldout``: the same rule with the table re-derived without each case's source.

Run: ``python -m benchmarks.accuracy.headroom`` (prints the interval and the fitted level; changes nothing).
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from typing import Any

from benchmarks.accuracy.band import residual_table
from benchmarks.accuracy.run import CaseResult, evaluate_case, load_cases
from services.estimator.fit import headroom_ratio
from services.estimator.plan import Plan
from services.estimator.uncertainty import Key, Pool, build_pools, category, quantile_ratio

# The target (gpuplan issue 26 item 8): refuse at most 2% of the runs that ran.
TARGET_REFUSED_SHARE = 0.02


@dataclass(frozen=True)
class Row:
    id: str
    oom: bool
    log_room: float  # ln(card / fit bytes): the largest log headroom ratio the card allows
    plan: Plan
    low_confidence: bool


def split_rows(pairs: list[tuple[dict[str, Any], CaseResult]]) -> list[Row]:
    """The declared split: medium + high measured cases with fit bytes and a known card."""
    out = []
    for case, r in pairs:
        if r.derived or r.refused or r.confidence not in ("medium", "high") or not r.card_gib or not r.fit_gib:
            continue
        plan = Plan.model_validate(case["plan"])
        out.append(Row(r.id, r.measured_oom, math.log(r.card_gib / r.fit_gib), plan, r.low_confidence_estimate))
    return out


def level_at_edge(row: Row, pools: dict[Key, Pool], floor: bool = True) -> float:
    """The level at which the row's card stops accepting it (bisection: the ratio rises with the level);
    ``floor``: with the planner's floor of 1 (else the band's quantile alone)."""
    p = row.plan
    key = category(p.framework, p.method, p.sharding, p.gpus, "device", p.mode)
    lo, hi = 1e-4, 1 - 1e-4
    for _ in range(50):
        mid = (lo + hi) / 2
        if floor:
            ratio = headroom_ratio(p.framework, p.method, p.sharding, p.gpus, p.mode, row.low_confidence, pools, mid)
        else:
            ratio = quantile_ratio(pools, key, mid, row.low_confidence)
        if math.log(ratio) <= row.log_room:
            lo = mid
        else:
            hi = mid
    return lo


def fit(rows: list[Row], pools: dict[Key, Pool]) -> dict[str, Any]:
    """The admissible interval of levels on ``rows`` and the fitted level (see the module docstring)."""
    ooms = sorted((level_at_edge(r, pools, floor=False), r.id) for r in rows if r.oom)
    ran = sorted((level_at_edge(r, pools), r.id) for r in rows if not r.oom)
    allowed = math.floor(TARGET_REFUSED_SHARE * len(ran))
    lowest = max(edge for edge, _ in ooms) if ooms else 0.0
    highest = ran[allowed][0] if allowed < len(ran) else 1.0
    return {
        "split": "medium + high measured cases, bundled residual table",
        "ooms": len(ooms),
        "runs_that_ran": len(ran),
        "refusals_allowed": allowed,
        "lowest_level": round(lowest, 4),
        "lowest_set_by": ooms[-1][1] if ooms else None,
        "highest_level": round(highest, 4),
        "highest_set_by": ran[allowed][1] if allowed < len(ran) else None,
        "fitted_level": round((lowest + highest) / 2, 2) if lowest < highest else None,
        "nearest_runs": [{"id": i, "edge_level": round(e, 4)} for e, i in ran[: allowed + 3]],
    }


def main(argv: list[str] | None = None) -> int:
    pairs = [(c, evaluate_case(c)) for c in load_cases()]
    rows = split_rows(pairs)
    pools = build_pools(residual_table([(c, r) for c, r in pairs if not r.derived]))
    print(json.dumps(fit(rows, pools), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
