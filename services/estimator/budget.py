"""A CPU-time budget for one estimate or plan, checked between units of work.

Bounds on the input (``bounds.py``) keep one estimate small; what still grows with the input is the
planner's search (offers x GPU counts x sharding x micro-batch). A budget turns a search that would run
for minutes into a clear answer naming what to narrow, instead of a stuck worker thread. It measures the
calling thread's CPU time (``time.thread_time``), so a busy machine does not make a request fail.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from services.estimator.errors import EstimatorError


class WorkBudgetExceeded(EstimatorError):
    """The work needed more CPU time than the budget allows; ``field`` says what to narrow."""


@dataclass
class CpuBudget:
    """``seconds`` of CPU time for the calling thread, counted from creation; None is unlimited."""

    seconds: float | None
    started_s: float = field(default_factory=time.thread_time)

    def used_s(self) -> float:
        return time.thread_time() - self.started_s

    def check(self, field: str, advice: str) -> None:
        """Raise :class:`WorkBudgetExceeded` naming ``field`` once the budget is spent."""
        if self.seconds is not None and self.used_s() > self.seconds:
            raise WorkBudgetExceeded(
                field, f"needs more than the {self.seconds:g} s of CPU time allowed per request; {advice}"
            )


def unlimited() -> CpuBudget:
    return CpuBudget(None)
