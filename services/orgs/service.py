"""Organizations and API keys. Services take the session first and never commit."""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass

from sqlalchemy.orm import Session

from services.core.errors import Conflict, NotFound, Unauthorized, Unprocessable
from services.orgs.repository import ApiKeyRepository, OrganizationRepository
from services.orgs.tables import ApiKey, Organization

KEY_PREFIX = "gp_"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._-]{0,99}$")


@dataclass(frozen=True)
class Principal:
    """Who is calling: the organization of the API key, whether the key administers that organization
    (``admin``: its keys and its own price list), and whether it is a platform-admin key (the public
    catalog every organization plans on; minted only by the server's CLI)."""

    organization_id: str
    organization_name: str
    admin: bool
    platform_admin: bool = False


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


def create_key(session: Session, organization_name: str, *, admin: bool = False, platform_admin: bool = False) -> str:
    """Create an API key for the organization and return it (the only time it is visible).

    ``platform_admin`` keys manage the public catalog; no API route mints one, only `gpuplan admin
    create-key --platform-admin` on the server (direct database access)."""
    org = OrganizationRepository(session).by_name(organization_name)
    if org is None:
        raise NotFound(f"no organization named {organization_name!r}", field="org")
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    ApiKeyRepository(session).add(
        ApiKey(
            organization_id=org.id,
            key_hash=hash_key(key),
            prefix=key[:10],
            admin=admin or platform_admin,
            platform_admin=platform_admin,
        )
    )
    return key


def authenticate(session: Session, authorization: str | None) -> Principal:
    """The caller behind an ``Authorization: Bearer KEY`` header, or 401."""
    if not authorization:
        raise Unauthorized("missing API key: send 'Authorization: Bearer <key>'")
    scheme, _, key = authorization.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise Unauthorized("malformed Authorization header: expected 'Bearer <key>'")
    found = ApiKeyRepository(session).by_hash(hash_key(key.strip()))
    if found is None:
        raise Unauthorized("unknown or revoked API key")
    org = OrganizationRepository(session).by_id(found.organization_id)
    if org is None:
        raise Unauthorized("unknown or revoked API key")
    return Principal(
        organization_id=org.id,
        organization_name=org.name,
        admin=found.admin,
        platform_admin=found.platform_admin,
    )
