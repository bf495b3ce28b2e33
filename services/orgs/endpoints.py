"""The organization's keys and audit log (admin scope): list, create, revoke, rotate; GET /v1/audit."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, Path, Query, Request

from services.api.deps import DbDep, PageCursor, PageLimit, PrincipalDep, SettingsDep
from services.api.routing import OffLoopRoute
from services.core.db import utcnow
from services.core.pages import DEFAULT_LIMIT
from services.orgs import audit, service
from services.orgs.schemas import AuditEventOut, AuditList, KeyCreate, KeyCreated, KeyList, KeyOut, KeyRotate
from services.orgs.service import Principal
from services.orgs.tables import ApiKey
from services.runs.binding import check_binding_target

# Bodies are validated off the event loop (services/api/routing.py).
router = APIRouter(prefix="/v1", tags=["keys"], route_class=OffLoopRoute)
KeyId = Annotated[str, Path(pattern="^[0-9a-f]{32}$", description="the key's id (GET /v1/keys)")]


def _out(row: ApiKey) -> KeyOut:
    return KeyOut(
        id=row.id,
        prefix=row.prefix,
        name=row.name,
        scopes=row.scopes.split(","),
        created_at=row.created_at,
        expires_at=row.expires_at,
        revoked_at=row.revoked_at,
        node_id=row.node_id,
        run_id=row.run_id,
        rotated_from_id=row.rotated_from_id,
    )


def actor(principal: Principal) -> str:
    return f"key:{principal.key_prefix}" if principal.key_prefix else "key"


def client_addr(request: Request) -> str | None:
    return request.client.host if request.client else None


@router.get("/keys", operation_id="keys-list", response_model=KeyList)
def list_keys(
    db: DbDep,
    principal: PrincipalDep,
    include_revoked: Annotated[bool, Query(description="also revoked keys")] = False,
    limit: PageLimit = DEFAULT_LIMIT,
    before: PageCursor = None,
) -> KeyList:
    """The organization's keys, newest first, a page at a time (``next_cursor`` names the next page)."""
    with db.transaction() as (session, _pending):
        rows, cursor = service.keys_page(session, principal.organization_id, include_revoked, limit, before)
        return KeyList(items=[_out(r) for r in rows], next_cursor=cursor)


@router.post("/keys", operation_id="keys-create", status_code=201, response_model=KeyCreated)
def create_key(
    body: KeyCreate, db: DbDep, principal: PrincipalDep, settings: SettingsDep, request: Request
) -> KeyCreated:
    """A new key of this organization with the given scopes (shown once, in this answer); at most
    GPUPLAN_QUOTA_KEYS usable keys per organization."""
    expires_at = utcnow() + timedelta(seconds=body.expires_in_s) if body.expires_in_s else None
    with db.transaction() as (session, _pending):
        service.check_key_quota(session, principal.organization_id, settings.quota_keys)
        check_binding_target(session, principal.organization_id, body.node_id, body.run_id)
        key, row = service.issue_key(
            session,
            principal.organization_id,
            scopes=body.scopes,
            name=body.name,
            expires_at=expires_at,
            node_id=body.node_id,
            run_id=body.run_id,
        )
        audit.record(
            session,
            principal.organization_id,
            actor(principal),
            "key.create",
            f"key:{row.prefix}",
            client_addr(request),
            {"scopes": row.scopes.split(","), "expires_at": expires_at.isoformat() if expires_at else None},
        )
        return KeyCreated(key=key, **_out(row).model_dump())


@router.post("/keys/{key_id}/revoke", operation_id="keys-revoke", response_model=KeyOut)
def revoke_key(key_id: KeyId, db: DbDep, principal: PrincipalDep, request: Request) -> KeyOut:
    """Revoke a key; it is refused from the next request on (see GPUPLAN_KEY_CACHE_S)."""
    with db.transaction() as (session, _pending):
        row = service.revoke_key(session, principal.organization_id, key_id)
        audit.record(
            session,
            principal.organization_id,
            actor(principal),
            "key.revoke",
            f"key:{row.prefix}",
            client_addr(request),
        )
        out = _out(row)
    db.forget_keys()
    return out


@router.post("/keys/{key_id}/rotate", operation_id="keys-rotate", status_code=201, response_model=KeyCreated)
def rotate_key(
    key_id: KeyId, db: DbDep, principal: PrincipalDep, request: Request, body: KeyRotate | None = None
) -> KeyCreated:
    """A replacement key with the same scopes; the old one is revoked now or after ``grace_s``."""
    grace_s = body.grace_s if body is not None else 0
    with db.transaction() as (session, _pending):
        key, row = service.rotate_key(session, principal.organization_id, key_id, grace_s)
        audit.record(
            session,
            principal.organization_id,
            actor(principal),
            "key.rotate",
            f"key:{row.prefix}",
            client_addr(request),
            {"replaced": key_id, "grace_s": grace_s},
        )
        out = KeyCreated(key=key, **_out(row).model_dump())
    db.forget_keys()
    return out


@router.get("/audit", operation_id="audit-list", response_model=AuditList)
def list_audit(
    db: DbDep,
    principal: PrincipalDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    before: Annotated[str | None, Query(pattern="^[0-9a-f]{32}$", description="cursor: next_cursor")] = None,
    action: Annotated[str | None, Query(max_length=64, pattern="^[a-z._-]+$")] = None,
) -> AuditList:
    """The organization's audit log, newest first: who did what, when and from where."""
    with db.transaction() as (session, _pending):
        rows = audit.list_events(session, principal.organization_id, limit, before, action)
        items = [AuditEventOut.model_validate(r, from_attributes=True) for r in rows]
    return AuditList(items=items, next_cursor=items[-1].id if len(items) == limit else None)
