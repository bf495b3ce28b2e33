"""The one place that builds the engine and sessions (sync SQLAlchemy 2, shared by API and workers)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TypeVar

from sqlalchemy import DateTime, MetaData, String, create_engine, event, update
from sqlalchemy.engine import Dialect, Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker
from sqlalchemy.types import TypeDecorator

# Stable constraint names, so Alembic autogenerate and both databases agree.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


def new_id() -> str:
    return uuid.uuid4().hex


def utcnow() -> datetime:
    return datetime.now(UTC)


class UtcDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every database (SQLite keeps no zone: stored naive UTC)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime: gpuplan stores timezone-aware UTC times only")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class IdMixin:
    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)


class TimestampMixin:
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection, _record):  # type: ignore[no-untyped-def]
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.close()

        return engine
    # No pre-ping: it costs a round trip on every checkout, and a request checks out one or two
    # connections (POST /v1/estimate on 2 cores: 460-500 requests/s with it, 610-700 without;
    # benchmarks/api). A connection the server dropped fails on use instead: SQLAlchemy then
    # invalidates the pool, the request is answered 503 with Retry-After (services/api/errors.py), and
    # the next one connects afresh. pool_recycle retires connections before typical idle timeouts.
    return create_engine(url, pool_pre_ping=False, pool_recycle=1800)


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(bind=engine, expire_on_commit=False)


@contextmanager
def unit_of_work(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A session whose work commits at the end of the block, or rolls back on error.

    Services never commit; the request or task boundary does, here.
    """
    session = factory()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def requeue_running(session: Session, table: type[Base], ids: Sequence[str]) -> None:
    """Put rows of a status-tracked table (``id``, ``status``) that are about to be resumed back to queued,
    in one conditional update: a row another process has just finished keeps its status, which an ORM
    read-then-write would overwrite."""
    if ids:
        session.execute(
            update(table)
            .where(table.id.in_(ids), table.status == "running")  # type: ignore[attr-defined]
            .values(status="queued")
            .execution_options(synchronize_session=False)
        )


T = TypeVar("T")


def once_more_if_raced(work: Callable[[], T], retry: bool) -> T:
    """``work`` (which opens its own transaction), run once more where it lost a race on a unique constraint and
    ``retry``: two requests with one new idempotency key both insert, the constraint fails the later, and its second
    run finds the first's row (plans and quotes)."""
    try:
        return work()
    except IntegrityError:
        if not retry:
            raise
    return work()
