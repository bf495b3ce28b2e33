from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select, tuple_
from sqlalchemy.orm import Session

from services.core.db import requeue_running
from services.core.errors import Unprocessable
from services.plans.tables import PlanRow


@dataclass(frozen=True)
class PlanListRow:
    """What a list page shows of a plan (the full plan is GET /v1/plans/{id})."""

    id: str
    status: str
    model_name: str
    method: str
    created_at: datetime
    cheapest: dict[str, Any] | None


_SUMMARY_COLUMNS = (
    PlanRow.id,
    PlanRow.status,
    PlanRow.model_name,
    PlanRow.method,
    PlanRow.created_at,
    PlanRow.cheapest,
)


class PlanRepository:
    def __init__(self, session: Session) -> None:
        self.session = session

    def get(self, plan_id: str) -> PlanRow | None:
        return self.session.get(PlanRow, plan_id)

    def get_for_org(self, organization_id: str, plan_id: str) -> PlanRow | None:
        return self.session.scalar(
            select(PlanRow).where(PlanRow.id == plan_id, PlanRow.organization_id == organization_id)
        )

    def by_idempotency_key(self, organization_id: str, key: str) -> PlanRow | None:
        return self.session.scalar(
            select(PlanRow).where(PlanRow.organization_id == organization_id, PlanRow.idempotency_key == key)
        )

    def list_for_org(self, organization_id: str, limit: int, before: str | None = None) -> list[PlanListRow]:
        """A page of the organization's plans, newest first, as summary rows: a keyset page on the
        (organization_id, created_at, id) index after the plan ``before``, so the cost of a page does
        not grow with the number of plans (no OFFSET, no full rows)."""
        query = select(*_SUMMARY_COLUMNS).where(PlanRow.organization_id == organization_id)
        if before is not None:
            anchor = self.session.execute(
                select(PlanRow.created_at, PlanRow.id).where(
                    PlanRow.id == before, PlanRow.organization_id == organization_id
                )
            ).first()
            if anchor is None:
                raise Unprocessable(
                    f"before: {before!r} is not an item of this list (use a next_cursor)", field="before"
                )
            # A row-value comparison, which Postgres and SQLite both read as one range on the index.
            query = query.where(tuple_(PlanRow.created_at, PlanRow.id) < tuple_(anchor[0], anchor[1]))
        rows = self.session.execute(query.order_by(PlanRow.created_at.desc(), PlanRow.id.desc()).limit(limit))
        return [PlanListRow(*r) for r in rows]

    def unfinished_ids(self, older_than: datetime | None = None) -> Sequence[str]:
        """Plans still queued or running; with ``older_than``, only those queued or started before it."""
        query = select(PlanRow.id).where(PlanRow.status.in_(("queued", "running")))
        if older_than is not None:
            query = query.where(
                ((PlanRow.status == "queued") & (PlanRow.created_at < older_than))
                | ((PlanRow.status == "running") & (PlanRow.started_at < older_than))
            )
        return self.session.scalars(query).all()

    def requeue_running(self, ids: Sequence[str]) -> None:
        """Show plans about to be resumed as queued (services.core.db.requeue_running)."""
        requeue_running(self.session, PlanRow, ids)

    def add(self, row: PlanRow) -> PlanRow:
        self.session.add(row)
        self.session.flush()
        return row
