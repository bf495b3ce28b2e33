"""Errors the estimator raises for input it cannot use. Each names the field and what is allowed.

They are defined in services.core.errors, since the catalog raises them too and sits below the estimator."""

from __future__ import annotations

from services.core.errors import EstimatorError, UnknownModelError

__all__ = ["EstimatorError", "UnknownModelError"]
