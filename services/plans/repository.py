from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from services.plans.tables import PlanRow


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

    def list_for_org(self, organization_id: str, limit: int, before: str | None = None) -> Sequence[PlanRow]:
        query = select(PlanRow).where(PlanRow.organization_id == organization_id)
        if before is not None:
            anchor = self.get_for_org(organization_id, before)
            if anchor is not None:
                query = query.where(
                    (PlanRow.created_at < anchor.created_at)
                    | ((PlanRow.created_at == anchor.created_at) & (PlanRow.id < anchor.id))
                )
        return self.session.scalars(query.order_by(PlanRow.created_at.desc(), PlanRow.id.desc()).limit(limit)).all()

    def unfinished_ids(self, older_than: datetime | None = None) -> Sequence[str]:
        """Plans still queued or running; with ``older_than``, only those queued or started before it."""
        query = select(PlanRow.id).where(PlanRow.status.in_(("queued", "running")))
        if older_than is not None:
            query = query.where(
                ((PlanRow.status == "queued") & (PlanRow.created_at < older_than))
                | ((PlanRow.status == "running") & (PlanRow.started_at < older_than))
            )
        return self.session.scalars(query).all()

    def add(self, row: PlanRow) -> PlanRow:
        self.session.add(row)
        self.session.flush()
        return row
