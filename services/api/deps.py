"""Request-scoped plumbing: the database handle, the caller (authenticated, its scope checked against
the route), and transactions that record their tasks in the outbox and send them after they commit."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

from fastapi import Depends, Header, Query, Request
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from services.api.limits import check_failures, check_rate, make_counters, record_failure
from services.api.routing import run_blocking
from services.core.db import unit_of_work
from services.core.errors import Forbidden, Unauthorized
from services.core.leases import record_outbox
from services.core.pages import MAX_LIMIT
from services.core.settings import Settings
from services.core.tasks import CeleryRunner, InProcessRunner, PendingTasks
from services.orgs.scopes import allowed_scopes
from services.orgs.service import Principal, authenticate
from services.runs.binding import check_agent_request


class Database:
    def __init__(
        self, factory: sessionmaker[Session], runner: InProcessRunner | CeleryRunner, settings: Settings | None = None
    ) -> None:
        self.factory = factory
        self.runner = runner
        self.settings = settings or Settings(database_url="sqlite://")
        self.lease_s = self.settings.task_lease_s
        self.key_cache_s = self.settings.key_cache_s
        self.counters = make_counters(self.settings)
        self.principals: dict[str, tuple[float, Principal]] = {}
        # The key read on every request is one statement, so it needs no transaction of its own: in
        # autocommit it is one round trip to the database (a Session's BEGIN, SELECT and COMMIT were
        # three), and it still sees every revocation committed before it starts.
        bind = factory.kw.get("bind")
        self.key_reader: Engine | None = (
            bind.execution_options(isolation_level="AUTOCOMMIT") if isinstance(bind, Engine) else None
        )

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

    def read_key(self, authorization: str | None) -> Principal:
        """The key's principal, read from the database now (401 for an unknown, revoked or expired key)."""
        if self.key_reader is None:
            with unit_of_work(self.factory) as session:
                return authenticate(session, authorization)
        with self.key_reader.connect() as conn:
            return authenticate(conn, authorization)

    def forget_keys(self) -> None:
        """Drop cached callers (a key was revoked or rotated in this process)."""
        self.principals.clear()


# These two only read the app's state: async, so FastAPI calls them in the request's own loop (a plain
# ``def`` dependency is sent to a worker thread and back, about 0.1 ms of CPU each, for nothing).
async def get_db(request: Request) -> Database:
    db: Database = request.app.state.db
    return db


async def get_settings_dep(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def _caller(db: Database, authorization: str | None) -> Principal:
    """The key's principal; cached for GPUPLAN_KEY_CACHE_S seconds when that is set (0, the default,
    reads the key on every request, so a revocation holds from the next request on)."""
    if db.key_cache_s <= 0:
        return db.read_key(authorization)
    now = time.monotonic()
    cached = db.principals.get(authorization or "")
    if cached is not None and now - cached[0] < db.key_cache_s:
        return cached[1]
    principal = db.read_key(authorization)
    if len(db.principals) > 10_000:
        db.principals.clear()
    db.principals[authorization or ""] = (now, principal)
    return principal


async def get_principal(
    request: Request,
    db: Annotated[Database, Depends(get_db)],
    authorization: Annotated[str | None, Header()] = None,
) -> Principal:
    """The authenticated caller, refused (403) when its key's scopes do not cover this route. It reads the
    database: in place on a worker loop (an off-loop route, services/api/routing.py), on a worker thread
    from the main loop."""
    return await run_blocking(_principal, request, db, authorization)


def _principal(request: Request, db: Database, authorization: str | None) -> Principal:
    address = request.client.host if request.client else "unknown"
    check_failures(db.counters, address, db.settings.auth_failures_per_minute)
    try:
        principal = _caller(db, authorization)
    except Unauthorized:
        record_failure(db.counters, address, db.settings.auth_failures_per_minute)
        raise
    route = request.scope.get("route")
    template = getattr(route, "path", request.url.path)
    allowed = allowed_scopes(request.method, template)
    if not principal.scopes & allowed:
        raise Forbidden(
            f"this key's scopes ({', '.join(sorted(principal.scopes))}) do not allow {request.method} {template}; "
            f"it needs one of: {', '.join(sorted(allowed))}",
            field="authorization",
        )
    check_rate(db.counters, principal.key_id or principal.organization_id, db.settings.rate_limit_per_minute)
    if "agent" in principal.scopes:
        with unit_of_work(db.factory) as session:
            check_agent_request(session, principal, request.path_params)
    request.state.principal = principal
    return principal


DbDep = Annotated[Database, Depends(get_db)]
SettingsDep = Annotated[Settings, Depends(get_settings_dep)]
PrincipalDep = Annotated[Principal, Depends(get_principal)]

# Every list endpoint pages (services/core/pages.py): ?limit=N&before=<the previous page's next_cursor>.
PageLimit = Annotated[int, Query(ge=1, le=MAX_LIMIT, description="items per page")]
PageCursor = Annotated[
    str | None, Query(pattern="^[0-9a-f]{32}$", description="cursor: the previous page's next_cursor")
]
