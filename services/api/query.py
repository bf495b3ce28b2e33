"""Query parameters that take one value are given once.

FastAPI reads a repeated scalar query parameter (``?format=axolotl&format=deepspeed``) as its last value and
says nothing, so the caller gets an answer to a question they did not ask. A route's single-valued query
parameters are listed once, when the route is built, and a request that repeats one is refused as a 422
naming it; parameters declared as lists (``list[str]``) keep taking repeats.
"""

from __future__ import annotations

import types
from collections.abc import Set
from typing import Annotated, Any, Union, get_args, get_origin

from fastapi import Request
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.params import Query


def _takes_many(annotation: Any) -> bool:
    """Whether FastAPI reads every value of a parameter so annotated (a list, tuple or set, or one of them
    or None), not only the last."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _takes_many(get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        return any(_takes_many(arg) for arg in get_args(annotation))
    kind = origin or annotation
    return isinstance(kind, type) and issubclass(kind, (list, tuple, Set))


def single_valued_query(dependant: Dependant) -> frozenset[str]:
    """The names (aliases) of the query parameters that take one value, the route's own and its
    dependencies' (services/api/deps.py's page size and cursor)."""
    names: set[str] = set()
    pending, seen = [dependant], set()
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        for field in current.query_params:
            if isinstance(field.field_info, Query) and not _takes_many(field.field_info.annotation):
                names.add(field.alias)
        pending.extend(current.dependencies)
    return frozenset(names)


def refuse_repeats(request: Request, names: frozenset[str]) -> None:
    """Raise the 422 of every parameter in ``names`` that the request gives more than once."""
    if not names or not request.scope.get("query_string"):
        return
    errors = []
    for name in sorted(names):
        values = request.query_params.getlist(name)
        if len(values) > 1:
            message = "given more than once; it takes one value"
            errors.append({"type": "repeated_query", "loc": ("query", name), "msg": message, "input": values})
    if errors:
        raise RequestValidationError(errors)
