"""Errors the planner raises for a plan it cannot plan. Each names the field and what is needed."""

from __future__ import annotations

from services.estimator.errors import EstimatorError


class PlannerError(EstimatorError):
    """A plan the estimator accepts but the planner cannot rank (no data set size, no architecture, ...).

    A subclass of :class:`EstimatorError`, so the API and the CLI render it as bad input (4xx / exit 2).
    """
