"""The audit log: who (key prefix or the server's CLI), what (action and target), when, from where.
Written in the same transaction as the action where the action is a service call, or after a
successful API request for the audited route families (services/api/app.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from services.core.pages import keyset_page
from services.orgs.tables import AuditEvent


def record(
    session: Session,
    organization_id: str | None,
    actor: str,
    action: str,
    target: str | None = None,
    remote_addr: str | None = None,
    detail: dict[str, Any] | None = None,
) -> AuditEvent:
    event = AuditEvent(
        organization_id=organization_id,
        actor=actor[:100],
        action=action[:64],
        target=target[:200] if target else None,
        remote_addr=remote_addr[:64] if remote_addr else None,
        detail=detail,
    )
    session.add(event)
    session.flush()
    return event


def list_events(
    session: Session, organization_id: str, limit: int, before: str | None = None, action: str | None = None
) -> Sequence[AuditEvent]:
    """The organization's events, newest first, a page of ``limit`` after the cursor event ``before``."""
    query = select(AuditEvent).where(AuditEvent.organization_id == organization_id)
    if action is not None:
        query = query.where(AuditEvent.action == action)
    rows, _cursor = keyset_page(session, query, AuditEvent, limit, before)
    return rows
