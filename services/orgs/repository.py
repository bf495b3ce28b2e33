from __future__ import annotations

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from services.core.db import utcnow
from services.orgs.tables import ApiKey, Organization


class OrganizationRepository:
    def __init__(self, session: Session) -> None:
        self.session = session

    def by_name(self, name: str) -> Organization | None:
        return self.session.scalar(select(Organization).where(Organization.name == name))

    def by_id(self, org_id: str) -> Organization | None:
        return self.session.get(Organization, org_id)

    def lock(self, org_id: str) -> None:
        """Hold the organization's row until the transaction ends, so that quota checks and the rows they
        admit are serialised per organization (issue 21: 40 concurrent plans at a quota of 5 were all
        admitted). An UPDATE takes the row lock on PostgreSQL and the write lock on SQLite; call it first
        in the transaction, before any read, so SQLite waits for the lock instead of failing busy."""
        self.session.execute(text("UPDATE organizations SET name = name WHERE id = :id"), {"id": org_id})

    def add(self, org: Organization) -> Organization:
        self.session.add(org)
        self.session.flush()
        return org


class ApiKeyRepository:
    def __init__(self, session: Session) -> None:
        self.session = session

    def by_hash(self, key_hash: str) -> ApiKey | None:
        """A key that is neither revoked nor expired."""
        found = self.session.scalar(select(ApiKey).where(ApiKey.key_hash == key_hash, ApiKey.revoked_at.is_(None)))
        if found is None:
            return None
        if found.expires_at is not None and found.expires_at <= utcnow():
            return None
        return found

    def add(self, key: ApiKey) -> ApiKey:
        self.session.add(key)
        self.session.flush()
        return key
