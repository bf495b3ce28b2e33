"""Calibration rule: for a GPU model and training method with calibration results in the organization,
the planner and /v1/estimate use the median calibrated utilisation of the latest five results instead of
the GPU-class prior (services/estimator/throughput.py UTILISATION_PRIOR). A result's calibrated utilisation
is the large-GEMM rate at which the estimate of the measured plan meets the measured tokens/s
(``gemm_utilisation``, services.estimator.estimate.utilisation_reproducing); results stored before that
column existed count with their hardware FLOPs utilisation. A result the node could not measure as planned
(``comparable`` false, e.g. QLoRA without bitsandbytes) never counts."""

from __future__ import annotations

import statistics

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from services.nodes.tables import BenchmarkRow

CALIBRATION_WINDOW = 5


def calibrated_utilisation(session: Session, organization_id: str, method: str) -> dict[str, tuple[float, str]]:
    """GPU name -> (median calibrated utilisation of the latest results for ``method``, where it came from)."""
    rows = session.scalars(
        select(BenchmarkRow)
        .where(
            BenchmarkRow.organization_id == organization_id,
            BenchmarkRow.method == method,
            or_(BenchmarkRow.gemm_utilisation.is_not(None), BenchmarkRow.hardware_utilisation.is_not(None)),
            BenchmarkRow.comparable.is_(True),
        )
        .order_by(BenchmarkRow.created_at.desc())
    ).all()
    by_gpu: dict[str, list[float]] = {}
    for row in rows:
        values = by_gpu.setdefault(row.gpu, [])
        value = row.gemm_utilisation if row.gemm_utilisation is not None else row.hardware_utilisation
        if len(values) < CALIBRATION_WINDOW and value is not None:
            values.append(value)
    return {
        gpu: (statistics.median(values), f"calibrated on {len(values)} {method} run(s) on {gpu}")
        for gpu, values in by_gpu.items()
    }
