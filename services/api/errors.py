"""The one handler that turns errors into JSON bodies naming the field and what is allowed."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from services.core.errors import GpuplanError, TooManyRequests
from services.estimator.errors import EstimatorError, UnknownModelError
from services.estimator.validation import describe_error_list, describe_errors


def with_api_hint(message: str, exc: EstimatorError) -> str:
    """An estimator message with the API's own hint: the estimator says a model name is unknown, the API
    says how to send the model's config.json in its fields."""
    if isinstance(exc, UnknownModelError):
        return f"{message} Send its config.json as model.config instead."
    return message


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(GpuplanError)
    async def _gpuplan(_request: Request, exc: GpuplanError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else None
        if isinstance(exc, TooManyRequests):
            headers = {"Retry-After": str(exc.retry_after_s)}
        return JSONResponse(exc.body(), status_code=exc.status_code, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = describe_error_list(exc.errors()) or ["invalid request"]
        return JSONResponse({"error": "invalid", "message": problems[0], "details": problems}, status_code=422)

    @app.exception_handler(ValidationError)
    async def _pydantic(_request: Request, exc: ValidationError) -> JSONResponse:
        problems = describe_errors(exc)
        return JSONResponse({"error": "invalid", "message": problems[0], "details": problems}, status_code=422)

    @app.exception_handler(EstimatorError)
    async def _estimator(_request: Request, exc: EstimatorError) -> JSONResponse:
        return JSONResponse(
            {"error": "invalid", "message": with_api_hint(str(exc), exc), "field": exc.field}, status_code=422
        )
