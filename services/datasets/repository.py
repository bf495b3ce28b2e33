from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from services.core.db import requeue_running
from services.core.pages import keyset_page
from services.datasets.tables import DatasetPartRow, DatasetRow


class DatasetRepository:
    def __init__(self, session: Session) -> None:
        self.session = session

    def get(self, dataset_id: str) -> DatasetRow | None:
        return self.session.get(DatasetRow, dataset_id)

    def get_for_org(self, organization_id: str, dataset_id: str) -> DatasetRow | None:
        return self.session.scalar(
            select(DatasetRow).where(DatasetRow.id == dataset_id, DatasetRow.organization_id == organization_id)
        )

    def page_for_org(
        self, organization_id: str, limit: int, before: str | None
    ) -> tuple[Sequence[DatasetRow], str | None]:
        query = select(DatasetRow).where(DatasetRow.organization_id == organization_id)
        return keyset_page(self.session, query, DatasetRow, limit, before)

    def unfinished_ids(self) -> Sequence[str]:
        """Checks queued or running (in-process tasks die with the process; these resume at start)."""
        return self.session.scalars(select(DatasetRow.id).where(DatasetRow.status.in_(("queued", "running")))).all()

    def requeue_running(self, ids: Sequence[str]) -> None:
        """Show checks about to be resumed as queued (services.core.db.requeue_running)."""
        requeue_running(self.session, DatasetRow, ids)

    def add(self, row: DatasetRow) -> DatasetRow:
        self.session.add(row)
        self.session.flush()
        return row

    def parts(self, dataset_id: str) -> Sequence[DatasetPartRow]:
        query = select(DatasetPartRow).where(DatasetPartRow.dataset_id == dataset_id)
        return self.session.scalars(query.order_by(DatasetPartRow.part_number)).all()

    def part(self, dataset_id: str, part_number: int) -> DatasetPartRow | None:
        return self.session.scalar(
            select(DatasetPartRow).where(
                DatasetPartRow.dataset_id == dataset_id, DatasetPartRow.part_number == part_number
            )
        )

    def add_part(self, row: DatasetPartRow) -> DatasetPartRow:
        self.session.add(row)
        self.session.flush()
        return row

    def delete(self, row: DatasetRow) -> None:
        """The data set's row and its parts (the parts first: not every database enforces the cascade)."""
        self.session.execute(delete(DatasetPartRow).where(DatasetPartRow.dataset_id == row.id))
        self.session.delete(row)
        self.session.flush()
