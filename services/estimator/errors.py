"""Errors the estimator raises for input it cannot use. Each names the field and what is allowed."""

from __future__ import annotations


class EstimatorError(ValueError):
    """Bad or unsupported input; ``field`` is the plan field (dotted path) it concerns."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
