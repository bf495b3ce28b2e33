"""Organizations, API keys and dashboard sessions. Services take the session first and never commit."""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import Connection, Select, bindparam, func, select
from sqlalchemy.orm import Session

from services.core.db import utcnow
from services.core.errors import Conflict, NotFound, TooManyRequests, Unauthorized, Unprocessable
from services.core.pages import keyset_page
from services.orgs.repository import ApiKeyRepository, OrganizationRepository
from services.orgs.scopes import ADMIN_SCOPES, DEFAULT_SCOPES, format_scopes, parse_scopes
from services.orgs.tables import ApiKey, DashboardSession, Organization

KEY_PREFIX = "gp_"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._-]{0,99}\Z")
_ID = re.compile(r"^[0-9a-f]{32}\Z")


@dataclass(frozen=True)
class Principal:
    """Who is calling: the organization of the API key, whether the key administers that organization
    (``admin``: its keys, audit log and its own price list), whether it is a platform-admin key (the
    public catalog every organization plans on; minted only by the server's CLI), and the key's scopes
    and (for an agent key) the node and run it acts for."""

    organization_id: str
    organization_name: str
    admin: bool
    platform_admin: bool = False
    key_id: str | None = None
    key_prefix: str = ""
    scopes: frozenset[str] = field(default=DEFAULT_SCOPES)
    node_id: str | None = None
    run_id: str | None = None


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def create_organization(session: Session, name: str) -> Organization:
    name = name.strip()
    if not _NAME.match(name):
        raise Unprocessable(
            "organization name: 1-100 characters of letters, digits, space, '.', '_' or '-', "
            "starting with a letter or digit",
            field="name",
        )
    repo = OrganizationRepository(session)
    if repo.by_name(name) is not None:
        raise Conflict(f"organization {name!r} already exists", field="name")
    return repo.add(Organization(name=name))


def _checked_scopes(scopes: Iterable[str] | str | None, admin: bool) -> frozenset[str]:
    if scopes is None:
        return ADMIN_SCOPES if admin else DEFAULT_SCOPES
    try:
        parsed = parse_scopes(scopes)
    except ValueError as exc:
        raise Unprocessable(str(exc), field="scopes") from None
    return parsed | {"admin"} if admin else parsed


def check_key_quota(session: Session, organization_id: str, quota: int) -> None:
    """429 when the organization already has ``quota`` usable keys (under its row lock, so concurrent
    requests cannot all pass); 0 means no quota."""
    if quota <= 0:
        return
    OrganizationRepository(session).lock(organization_id)
    now = utcnow()
    count = session.scalar(
        select(func.count()).where(
            ApiKey.organization_id == organization_id,
            ApiKey.revoked_at.is_(None),
            (ApiKey.expires_at.is_(None)) | (ApiKey.expires_at > now),
        )
    )
    if (count or 0) >= quota:
        raise TooManyRequests(
            f"quota: {quota} usable keys per organization; revoke one first (POST /v1/keys/{{id}}/revoke)",
            retry_after_s=3600,
            field="keys",
        )


def issue_key(
    session: Session,
    organization_id: str,
    *,
    scopes: Iterable[str] | str | None = None,
    admin: bool = False,
    name: str | None = None,
    expires_at: datetime | None = None,
    node_id: str | None = None,
    run_id: str | None = None,
    rotated_from_id: str | None = None,
    platform_admin: bool = False,
) -> tuple[str, ApiKey]:
    """Create a key for the organization; returns (the key, shown only now, and its row). An agent key
    must be bound to a node (``node_id``), and only an agent key may be. ``platform_admin`` keys manage
    the public catalog; no API route mints one, only `gpuplan admin create-key --platform-admin` on
    the server (direct database access)."""
    chosen = _checked_scopes(scopes, admin or platform_admin)
    if name is not None and not _NAME.match(name):
        raise Unprocessable("name: 1-100 letters, digits, space, '.', '_' or '-'", field="name")
    if expires_at is not None and expires_at <= utcnow():
        raise Unprocessable("expires: must be in the future", field="expires_in_s")
    if "agent" in chosen and node_id is None:
        raise Unprocessable("node_id: an agent key acts for one node; give its id", field="node_id")
    if "agent" not in chosen and (node_id is not None or run_id is not None):
        raise Unprocessable("node_id/run_id: only an agent key is bound to a node or run", field="node_id")
    for value, label in ((node_id, "node_id"), (run_id, "run_id")):
        if value is not None and not _ID.match(value):
            raise Unprocessable(f"{label}: 32 lowercase hex characters", field=label)
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    row = ApiKeyRepository(session).add(
        ApiKey(
            organization_id=organization_id,
            key_hash=hash_key(key),
            prefix=key[:10],
            admin="admin" in chosen,
            platform_admin=platform_admin,
            scopes=format_scopes(chosen),
            name=name,
            expires_at=expires_at,
            node_id=node_id,
            run_id=run_id,
            rotated_from_id=rotated_from_id,
        )
    )
    return key, row


def create_key(
    session: Session,
    organization_name: str,
    *,
    admin: bool = False,
    scopes: Iterable[str] | str | None = None,
    name: str | None = None,
    expires_at: datetime | None = None,
    node_id: str | None = None,
    run_id: str | None = None,
    platform_admin: bool = False,
) -> str:
    """Create an API key for the named organization and return it (the only time it is visible)."""
    org = OrganizationRepository(session).by_name(organization_name)
    if org is None:
        raise NotFound(f"no organization named {organization_name!r}", field="org")
    key, _row = issue_key(
        session,
        org.id,
        scopes=scopes,
        admin=admin,
        name=name,
        expires_at=expires_at,
        node_id=node_id,
        run_id=run_id,
        platform_admin=platform_admin,
    )
    return key


def _keys_query(organization_id: str, include_revoked: bool) -> Select[ApiKey]:
    query = select(ApiKey).where(ApiKey.organization_id == organization_id)
    return query if include_revoked else query.where(ApiKey.revoked_at.is_(None))


def list_keys(session: Session, organization_id: str, include_revoked: bool = False) -> Sequence[ApiKey]:
    """Every key of the organization, newest first (the admin CLI; the API pages them)."""
    query = _keys_query(organization_id, include_revoked)
    return session.scalars(query.order_by(ApiKey.created_at.desc(), ApiKey.id.desc())).all()


def keys_page(
    session: Session, organization_id: str, include_revoked: bool, limit: int, before: str | None
) -> tuple[Sequence[ApiKey], str | None]:
    return keyset_page(session, _keys_query(organization_id, include_revoked), ApiKey, limit, before)


def _key_in_org(session: Session, organization_id: str, key_id: str) -> ApiKey:
    row = session.get(ApiKey, key_id) if _ID.match(key_id) else None
    if row is None or row.organization_id != organization_id:
        raise NotFound(f"no key {key_id!r} in this organization", field="key_id")
    return row


def find_key(session: Session, key_id_or_prefix: str) -> ApiKey:
    """A key by id or by its shown prefix (``gp_xxxxxxx``), for the server's admin CLI."""
    if _ID.match(key_id_or_prefix):
        row = session.get(ApiKey, key_id_or_prefix)
        if row is not None:
            return row
    rows = session.scalars(select(ApiKey).where(ApiKey.prefix == key_id_or_prefix)).all()
    if len(rows) != 1:
        raise NotFound(f"no single key with id or prefix {key_id_or_prefix!r} ({len(rows)} match)", field="key")
    return rows[0]


def revoke_key(session: Session, organization_id: str, key_id: str) -> ApiKey:
    """Revoke a key of the organization (revoking twice is harmless); its sessions end with it."""
    row = _key_in_org(session, organization_id, key_id)
    if row.revoked_at is None:
        row.revoked_at = utcnow()
    return row


def rotate_key(
    session: Session, organization_id: str, key_id: str, grace_s: int = 0, *, server_cli: bool = False
) -> tuple[str, ApiKey]:
    """A new key with the old one's scopes, name, binding and expiry; the old key is revoked now, or
    with ``grace_s`` stays valid that many seconds so running clients can switch. A platform-admin key
    is rotated only by the server's CLI (``server_cli``), which alone mints such keys."""
    old = _key_in_org(session, organization_id, key_id)
    if old.platform_admin and not server_cli:
        raise Conflict(
            "a platform-admin key is rotated on the server: gpuplan admin rotate-key <prefix>", field="key_id"
        )
    if old.revoked_at is not None:
        raise Conflict(f"key {key_id} is revoked; create a new key instead", field="key_id")
    now = utcnow()
    if old.expires_at is not None and old.expires_at <= now:
        raise Conflict(f"key {key_id} has expired; create a new key instead", field="key_id")
    key, new = issue_key(
        session,
        organization_id,
        scopes=old.scopes,
        name=old.name,
        expires_at=old.expires_at,
        node_id=old.node_id,
        run_id=old.run_id,
        rotated_from_id=old.id,
        platform_admin=old.platform_admin,
    )
    if grace_s <= 0:
        old.revoked_at = now
    else:
        until = now + timedelta(seconds=grace_s)
        old.expires_at = min(old.expires_at, until) if old.expires_at is not None else until
    return key, new


# The query of a principal, read as plain rows (no ORM objects), so it runs on a Session or on a bare
# Connection alike; built once with the hash as a bound parameter, since the API reads a key on every
# request and building the statement (and its cache key) cost more than running it.
_PRINCIPAL_OF_HASH = (
    select(
        ApiKey.id,
        ApiKey.organization_id,
        Organization.name,
        ApiKey.prefix,
        ApiKey.platform_admin,
        ApiKey.scopes,
        ApiKey.expires_at,
        ApiKey.node_id,
        ApiKey.run_id,
    )
    .join(Organization, Organization.id == ApiKey.organization_id)
    .where(ApiKey.key_hash == bindparam("key_hash"), ApiKey.revoked_at.is_(None))
)


def principal_for_hash(session: Session | Connection, key_hash: str) -> Principal | None:
    """The caller behind a key hash, or None for an unknown, revoked or expired key."""
    row = session.execute(_PRINCIPAL_OF_HASH, {"key_hash": key_hash}).first()
    if row is None:
        return None
    key_id, organization_id, org_name, prefix, platform_admin, scopes_text, expires_at, node_id, run_id = row
    if expires_at is not None and expires_at <= utcnow():
        return None
    scopes = parse_scopes(scopes_text)
    return Principal(
        organization_id=organization_id,
        organization_name=org_name,
        admin="admin" in scopes,
        platform_admin=platform_admin,
        key_id=key_id,
        key_prefix=prefix,
        scopes=scopes,
        node_id=node_id,
        run_id=run_id,
    )


def authenticate(session: Session | Connection, authorization: str | None) -> Principal:
    """The caller behind an ``Authorization: Bearer KEY`` header, or 401."""
    if not authorization:
        raise Unauthorized("missing API key: send 'Authorization: Bearer <key>'")
    scheme, _, key = authorization.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise Unauthorized("malformed Authorization header: expected 'Bearer <key>'")
    principal = principal_for_hash(session, hash_key(key.strip()))
    if principal is None:
        raise Unauthorized("unknown, revoked or expired API key")
    return principal


# --- dashboard sessions ---------------------------------------------------------------------------


def start_session(session: Session, key_hash: str, max_age_s: float) -> str:
    """A server-side dashboard session for a signed-in key; returns its id (kept in the signed cookie)."""
    session_id = secrets.token_urlsafe(32)
    session.add(
        DashboardSession(
            session_hash=hash_key(session_id),
            key_hash=key_hash,
            expires_at=utcnow() + timedelta(seconds=max_age_s),
        )
    )
    session.flush()
    return session_id


def session_principal(session: Session, session_id: str) -> Principal | None:
    """The caller of a live dashboard session: None once it is signed out, expired or its key revoked."""
    row = session.scalar(select(DashboardSession).where(DashboardSession.session_hash == hash_key(session_id)))
    if row is None or row.ended_at is not None or row.expires_at <= utcnow():
        return None
    return principal_for_hash(session, row.key_hash)


def end_session(session: Session, session_id: str) -> None:
    """Sign out: the session ends on the server, so a copy of the cookie no longer works."""
    row = session.scalar(select(DashboardSession).where(DashboardSession.session_hash == hash_key(session_id)))
    if row is not None and row.ended_at is None:
        row.ended_at = utcnow()
