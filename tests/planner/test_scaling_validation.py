"""The communication model against published scaling measurements, each within its stated tolerance."""

from __future__ import annotations

import pytest

from benchmarks.planner.scaling import CASES, predicted_ratio
from services.estimator.communication import Links, all_reduce_seconds, straggler_fraction


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_published_scaling_within_the_stated_tolerance(case) -> None:  # type: ignore[no-untyped-def]
    predicted = predicted_ratio(case)
    assert abs(predicted / case.measured_ratio - 1.0) <= case.tolerance, (predicted, case.measured_ratio)


def test_at_least_six_cited_cases_and_most_within_three_percent() -> None:
    assert len(CASES) >= 6 and all(c.source for c in CASES)
    close = [c for c in CASES if abs(predicted_ratio(c) / c.measured_ratio - 1.0) <= 0.03]
    assert len(close) >= 5


def test_pcie_is_slower_than_nvlink_and_the_network_slower_than_both() -> None:
    size = 1e9
    nvlink = all_reduce_seconds(size, Links(8, 1, "NVLink", 450.0))
    pcie = all_reduce_seconds(size, Links(8, 1, "PCIe", 64.0))
    no_p2p = all_reduce_seconds(size, Links(8, 1, "PCIe (no P2P)", 64.0))
    nodes = all_reduce_seconds(size, Links(8, 2, "NVLink", 450.0, 400.0))
    assert nvlink < nodes < pcie < no_p2p
    # 2 (n-1)/n x 1 GB over 0.87 x 450 GB/s, plus 14 ring steps of 1 us.
    assert nvlink == pytest.approx(2 * 7 / 8 * 1e9 / (0.87 * 450e9) + 14e-6)


def test_the_straggler_wait_grows_with_the_gpu_count() -> None:
    assert straggler_fraction(1) == 0.0
    waits = [straggler_fraction(n) for n in (2, 4, 8, 64)]
    assert waits == sorted(waits) and waits[-1] < 0.04
