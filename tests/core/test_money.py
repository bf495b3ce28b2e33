"""Money in messages, quotes and pages: an amount that is not zero never reads as "$0.00"."""

from __future__ import annotations

import pytest

from benchmarks.planner.run import benchmark_plan
from services.catalog.offers import bundled_offers
from services.core.money import usd
from services.planner import Constraints, plan_setups


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (1234.5, "$1,234.50"),
        (0.0, "$0.00"),
        (0.005, "$0.01"),
        (0.004, "< $0.01"),
        (1e-300, "< $0.01"),
        (-2.5, "-$2.50"),
        (-0.001, "> -$0.01"),
    ],
)
def test_an_amount_that_is_not_zero_never_reads_zero(value: float, shown: str) -> None:
    assert usd(value) == shown


def test_a_budget_under_a_cent_is_not_written_as_zero_in_the_rejections() -> None:
    # "over the $0.00 budget" reads as free, or as no budget at all.
    result = plan_setups(benchmark_plan("qlora"), bundled_offers(), constraints=Constraints(budget_usd=0.004))
    over = [r.reason for r in result.rejections if r.kind == "budget"]
    assert over and all("over the < $0.01 budget" in reason for reason in over)
    assert not any("$0.00" in r.reason for r in result.rejections)
