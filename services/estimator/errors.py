"""Errors the estimator raises for input it cannot use. Each names the field and what is allowed."""

from __future__ import annotations


class EstimatorError(ValueError):
    """Bad or unsupported input; ``field`` is the plan field (dotted path) it concerns."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class UnknownModelError(EstimatorError):
    """A model name the bundled catalog does not hold. The message names the closest catalog models (or
    says none is close); it does not say how to pass a config.json, since that differs per edge (a CLI
    flag, an API field, a dashboard box): each edge adds its own hint."""

    def __init__(self, name: str, message: str, closest: tuple[str, ...]) -> None:
        super().__init__("model.name", message)
        self.name = name
        self.closest = closest
