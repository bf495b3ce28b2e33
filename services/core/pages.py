"""Keyset pages of an organization's rows: newest first (or oldest first), ``limit`` at a time, after the
row whose id the previous page ended with (its ``next_cursor``). A page costs one range read on the
(organization_id, created_at, id) order however many rows precede it: no OFFSET."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from sqlalchemy import Select, tuple_
from sqlalchemy.orm import Session

from services.core.errors import Unprocessable

Row = TypeVar("Row")

DEFAULT_LIMIT = 100
MAX_LIMIT = 500


def keyset_page(
    session: Session,
    query: Select[Row],
    model: Any,
    limit: int,
    before: str | None,
    *,
    newest_first: bool = True,
) -> tuple[Sequence[Row], str | None]:
    """(rows, next cursor) of ``query`` (already limited to the caller's organization and filters). A cursor
    that names no row of this query is a 422 naming ``before``."""
    order = (model.created_at, model.id)
    if before is not None:
        anchor = session.execute(query.with_only_columns(*order).where(model.id == before)).first()
        if anchor is None:
            raise Unprocessable(f"before: {before!r} is not an item of this list (use a next_cursor)", field="before")
        key = tuple_(*order)
        query = query.where(key < tuple_(*anchor) if newest_first else key > tuple_(*anchor))
    ordering = [c.desc() for c in order] if newest_first else list(order)
    rows = session.scalars(query.order_by(*ordering).limit(limit)).all()
    return rows, (rows[-1].id if len(rows) == limit else None)  # type: ignore[attr-defined]
