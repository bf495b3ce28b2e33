"""The one handler that turns errors into JSON bodies naming the field and what is allowed."""

from __future__ import annotations

import reprlib
from typing import Any

import anyio.to_thread
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from sqlalchemy.exc import DBAPIError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from services.core.errors import EstimatorError, GpuplanError, TooManyRequests, with_api_hint
from services.estimator.validation import describe_error_list

_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "too_large", 415: "unsupported_media_type"}
# pydantic's sequence length errors, and the string ones they are when the input is a string.
_SEQUENCE_LENGTH = {"too_long": "string_too_long", "too_short": "string_too_short"}
_NOT_AN_OBJECT = frozenset(("model_attributes_type", "dict_type", "model_type", "missing", "list_type"))


class ErrorBody(BaseModel):
    """Every 4xx/5xx answer: a code, one readable line, and the field it concerns where there is one."""

    error: str
    message: str
    field: str | None = None
    details: Any = None


def _is_json(content_type: str | None) -> bool:
    media = (content_type or "").split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def _body_problem(request: Request, errors: list[Any]) -> str | None:
    """A message for a body that is missing, not JSON, or JSON of the wrong kind (the route reads an object)."""
    whole_body = [e for e in errors if tuple(e.get("loc", ())) == ("body",) and e.get("type") in _NOT_AN_OBJECT]
    if not whole_body:
        return None
    content_type = request.headers.get("content-type")
    if whole_body[0]["type"] == "missing":
        return "body: missing; send the request body as JSON with the header Content-Type: application/json"
    if not _is_json(content_type):
        got = f"got Content-Type: {content_type}" if content_type else "no Content-Type was given"
        return f"body: must be JSON sent with the header Content-Type: application/json ({got})"
    # JSON, but not what the route reads: the whole body is wrong, so the body is the field. Described as a field
    # error it had no location, and the plan validator's fallback named "plan" on every route (a heartbeat's `[]`).
    kind = "array" if whole_body[0]["type"] == "list_type" else "object"
    return f"body: must be a JSON {kind} (got {reprlib.repr(whole_body[0].get('input'))})"


def _json_syntax(errors: list[Any], body: Any) -> str | None:
    """FastAPI's own JSON decode error ("65: jSON decode error") as a line naming the position."""
    for err in errors:
        if err.get("type") == "json_invalid":
            loc = err.get("loc", ())
            pos = loc[1] if len(loc) > 1 and isinstance(loc[1], int) else None
            reason = (err.get("ctx") or {}).get("error", "not valid JSON")
            if pos is None or not isinstance(body, str):
                return f"body: not valid JSON: {reason}"
            line = body.count("\n", 0, pos) + 1
            column = pos - (body.rfind("\n", 0, pos) + 1) + 1
            return f"body: not valid JSON at line {line}, column {column} (character {pos}): {reason}"
    return None


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at this path (Starlette's 405 names only the first route's):
    the router is asked, method by method, whether a route matches fully."""
    allowed = []
    for method in _METHODS:
        scope = {**request.scope, "method": method}
        if any(route.matches(scope)[0] == Match.FULL for route in request.app.router.routes):
            allowed.append(method)
    return allowed


def _string_wording(errors: list[Any]) -> list[Any]:
    """pydantic's length errors with "characters" where the input is text: a length constraint it cannot put in the
    string schema (a ``str`` with an after-validator, inside ``| None``: RunCreate.prefix) is checked as a sequence's,
    and said "Value should have at most 512 items after validation, not 513" of a string."""
    out = []
    for err in errors:
        kind, given, ctx = err.get("type"), err.get("input"), err.get("ctx") or {}
        if kind in _SEQUENCE_LENGTH and isinstance(given, str):
            limit = ctx.get("max_length" if kind == "too_long" else "min_length")
            if isinstance(limit, int):
                bound = "at most" if kind == "too_long" else "at least"
                noun = "character" if limit == 1 else "characters"
                err = {**err, "type": _SEQUENCE_LENGTH[kind], "msg": f"String should have {bound} {limit} {noun}"}
        out.append(err)
    return out


def validation_response(request: Request, exc: RequestValidationError) -> JSONResponse:
    """The 422 for a request FastAPI could not validate: its first problem, and at most 50 more listed."""
    errors = _string_wording(list(exc.errors()))
    special = _json_syntax(errors, exc.body)
    if special is not None and "content-type" not in request.headers:
        special += "; send JSON with the header Content-Type: application/json"
    special = special or _body_problem(request, errors)
    if special is not None:
        return JSONResponse({"error": "invalid", "message": special, "field": "body"}, status_code=422)
    # An unknown field of any body (a key's, a quote's) was told to check the plan schema.
    problems = describe_error_list(errors, schema="this request's schema (/docs)") or ["invalid request"]
    return _invalid(problems)


def _pydantic_response(exc: ValidationError) -> JSONResponse:
    return _invalid(describe_error_list(_string_wording(list(exc.errors()))))


def _invalid(problems: list[str]) -> JSONResponse:
    """The 422 of described validation problems, with ``field`` the first one names (each line is "field: what"),
    as every other 422 has it: a client that marks the field it names marks these too."""
    body: dict[str, Any] = {"error": "invalid", "message": problems[0], "details": problems}
    field, sep, _ = problems[0].partition(": ")
    if sep and field and " " not in field:
        body["field"] = field
    return JSONResponse(body, status_code=422)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(GpuplanError)
    async def _gpuplan(_request: Request, exc: GpuplanError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else None
        if isinstance(exc, TooManyRequests):
            headers = {"Retry-After": str(exc.retry_after_s)}
        return JSONResponse(exc.body(), status_code=exc.status_code, headers=headers)

    @app.exception_handler(DBAPIError)
    async def _database(_request: Request, exc: DBAPIError) -> JSONResponse:
        if not exc.connection_invalidated:
            raise exc
        # The database dropped the connection (a restart, a failover): the pool is invalidated and the
        # next request connects afresh, so this one is worth retrying.
        body = {"error": "unavailable", "message": "the database connection was lost; retry the request"}
        return JSONResponse(body, status_code=503, headers={"Retry-After": "1"})

    # Describing thousands of errors is work: it runs on a worker thread, never on the event loop.
    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return await anyio.to_thread.run_sync(validation_response, request, exc)

    @app.exception_handler(ValidationError)
    async def _pydantic(_request: Request, exc: ValidationError) -> JSONResponse:
        return await anyio.to_thread.run_sync(_pydantic_response, exc)

    @app.exception_handler(EstimatorError)
    async def _estimator(_request: Request, exc: EstimatorError) -> JSONResponse:
        return JSONResponse(
            {"error": "invalid", "message": with_api_hint(str(exc), exc), "field": exc.field}, status_code=422
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        headers = dict(exc.headers or {})
        message = str(exc.detail)
        if exc.status_code == 405:
            allowed = allowed_methods(request)
            headers["Allow"] = ", ".join(allowed)
            message = f"method {request.method} is not allowed here; allowed: {', '.join(allowed)}"
        body = {"error": _HTTP_CODES.get(exc.status_code, "http_error"), "message": message}
        return JSONResponse(body, status_code=exc.status_code, headers=headers or None)
