"""Request-scoped plumbing: the database handle, the caller, and transactions that send their
tasks only after they commit."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

from fastapi import Depends, Header, Request
from sqlalchemy.orm import Session, sessionmaker

from services.core.db import unit_of_work
from services.core.leases import record_outbox
from services.core.settings import Settings
from services.core.tasks import CeleryRunner, InProcessRunner, PendingTasks
from services.orgs.service import Principal, authenticate


class Database:
    def __init__(
        self, factory: sessionmaker[Session], runner: InProcessRunner | CeleryRunner, lease_s: float = 60.0
    ) -> None:
        self.factory = factory
        self.runner = runner
        self.lease_s = lease_s
        self.principals: dict[str, tuple[float, Principal]] = {}

    @contextmanager
    def transaction(self) -> Iterator[tuple[Session, PendingTasks]]:
        """A unit of work whose enqueued tasks are written to the outbox (their lease rows) before it
        commits and sent after; a send that fails is sent again by the lease sweep."""
        pending = PendingTasks()
        with unit_of_work(self.factory) as session:
            yield session, pending
            if pending.items:
                record_outbox(session, pending.items, self.lease_s)
        pending.flush(self.runner)


def get_db(request: Request) -> Database:
    db: Database = request.app.state.db
    return db


def get_settings_dep(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


# Authenticated keys are remembered briefly so a busy client does not cost a database read per call;
# a revoked key stops working within this many seconds.
PRINCIPAL_CACHE_SECONDS = 10.0


def get_principal(
    db: Annotated[Database, Depends(get_db)],
    authorization: Annotated[str | None, Header()] = None,
) -> Principal:
    now = time.monotonic()
    cached = db.principals.get(authorization or "")
    if cached is not None and now - cached[0] < PRINCIPAL_CACHE_SECONDS:
        return cached[1]
    with unit_of_work(db.factory) as session:
        principal = authenticate(session, authorization)
    if len(db.principals) > 10_000:
        db.principals.clear()
    db.principals[authorization or ""] = (now, principal)
    return principal


DbDep = Annotated[Database, Depends(get_db)]
SettingsDep = Annotated[Settings, Depends(get_settings_dep)]
PrincipalDep = Annotated[Principal, Depends(get_principal)]
