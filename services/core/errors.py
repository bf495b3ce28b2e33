"""One error hierarchy; each error carries its HTTP status and is rendered by one handler."""

from __future__ import annotations

from typing import Any

# An answer lists at most this many problems, then a count of the rest: a 1 MiB body can carry 100,000
# bad items, and a client fixes the first few before it reads the rest (issue 21 item 1).
MAX_LISTED_PROBLEMS = 50


def listed(problems: list[str], more: int = 0, limit: int = MAX_LISTED_PROBLEMS) -> list[str]:
    """The first ``limit`` problems, then one line counting the others (and ``more`` not described)."""
    rest = max(0, len(problems) - limit) + more
    if not rest:
        return problems
    return [*problems[:limit], f"and {rest:,} more problem{'s' if rest != 1 else ''}"]


class GpuplanError(Exception):
    status_code = 400
    code = "bad_request"

    def __init__(self, message: str, *, field: str | None = None, details: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.details = details

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"error": self.code, "message": self.message}
        if self.field is not None:
            out["field"] = self.field
        if self.details is not None:
            out["details"] = self.details
        return out


class BadRequest(GpuplanError):
    status_code = 400


class Unauthorized(GpuplanError):
    status_code = 401
    code = "unauthorized"


class Forbidden(GpuplanError):
    status_code = 403
    code = "forbidden"


class NotFound(GpuplanError):
    status_code = 404
    code = "not_found"


class Conflict(GpuplanError):
    status_code = 409
    code = "conflict"


class Unprocessable(GpuplanError):
    """Input that parses but is not valid: 422 with one line per field in ``details``."""

    status_code = 422
    code = "invalid"


class ConfigurationError(GpuplanError):
    """The server is missing a setting the request needs (e.g. no bucket configured)."""

    status_code = 503
    code = "not_configured"


class PayloadTooLarge(GpuplanError):
    """A request body or declared upload over a configured limit: 413, the message names the limit."""

    status_code = 413
    code = "too_large"


class TooManyRequests(GpuplanError):
    """A rate limit or quota: 429 with ``Retry-After`` (seconds) so clients know when to come back."""

    status_code = 429
    code = "rate_limited"

    def __init__(self, message: str, *, retry_after_s: int, field: str | None = None) -> None:
        super().__init__(message, field=field, details={"retry_after_s": retry_after_s})
        self.retry_after_s = max(1, int(retry_after_s))


# The estimator's input errors. They live here, below the catalog and the estimator, because both raise
# them (the catalog for an unknown GPU or model); services.estimator.errors re-exports them by their old
# name. They are ValueErrors, not GpuplanErrors: each edge turns them into its own answer (the API's 422).
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


def with_api_hint(message: str, exc: EstimatorError) -> str:
    """An estimator message with the API's own hint: the estimator says a model name is unknown, the API
    says how to send the model's config.json in its fields."""
    if isinstance(exc, UnknownModelError):
        return f"{message} Give its Hugging Face id (owner/name), or send its config.json as model.config."
    return message
