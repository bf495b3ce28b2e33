"""The error an export raises: a plan setting the chosen format cannot express, or a file it cannot read."""

from __future__ import annotations

from services.estimator.errors import EstimatorError


class ExportError(EstimatorError):
    """A setting the format cannot express (or an exported file the reader cannot use).

    ``field`` is the plan field (or, when reading, the file key) concerned. A subclass of
    :class:`EstimatorError` (a ``ValueError``), so the API and the CLI render it as bad input.
    """
