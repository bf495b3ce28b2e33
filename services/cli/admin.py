"""`gpuplan admin`: organizations, API keys and price lists, straight on the database."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from services.cli.common import CliError, Parser, Subparsers, int_arg, regular_file

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, sessionmaker


def register(sub: Subparsers) -> None:
    admin = sub.add_parser("admin", help="organizations, API keys and price lists")
    admin_sub = admin.add_subparsers(dest="admin_command", required=True, parser_class=Parser)
    create_org = admin_sub.add_parser("create-org", help="create an organization")
    create_org.add_argument("name")
    create_org.set_defaults(handler=cmd_create_org)
    create_key = admin_sub.add_parser("create-key", help="create an API key; prints the key alone")
    create_key.add_argument("--org", required=True, help="organization name")
    create_key.add_argument(
        "--admin", action="store_true", help="adds the admin scope (its keys, audit log and own prices)"
    )
    create_key.add_argument(
        "--platform-admin",
        action="store_true",
        help="may change the public catalog every organization plans on (POST /v1/platform/catalog/offers)",
    )
    create_key.add_argument(
        "--scope", action="append", metavar="SCOPE", help="read, plan, agent or admin; repeat (default: read, plan)"
    )
    create_key.add_argument("--name", help="what the key is for")
    create_key.add_argument("--expires-in", type=int_arg("--expires-in"), metavar="S", help="seconds until it expires")
    create_key.add_argument("--node", metavar="ID", help="agent keys: the node it acts for")
    create_key.add_argument("--run", metavar="ID", help="agent keys: the run it acts for")
    create_key.set_defaults(handler=cmd_create_key)
    list_keys = admin_sub.add_parser("list-keys", help="the keys of an organization (never the keys themselves)")
    list_keys.add_argument("--org", required=True, help="organization name")
    list_keys.add_argument("--all", action="store_true", help="also revoked keys")
    list_keys.add_argument("--json", action="store_true", help="one JSON object")
    list_keys.set_defaults(handler=cmd_list_keys)
    revoke = admin_sub.add_parser("revoke-key", help="revoke a key by id or prefix (refused from the next request)")
    revoke.add_argument("key", help="the key's id or its prefix (gp_xxxxxxx, from list-keys)")
    revoke.set_defaults(handler=cmd_revoke_key)
    rotate = admin_sub.add_parser("rotate-key", help="replace a key; prints the new key alone")
    rotate.add_argument("key", help="the key's id or its prefix")
    rotate.add_argument("--grace", type=int_arg("--grace"), default=0, metavar="S", help="old key works S more seconds")
    rotate.set_defaults(handler=cmd_rotate_key)
    import_offers = admin_sub.add_parser(
        "import-offers",
        help="upsert a CSV/JSON price list into the public catalog (all or nothing; other providers are kept)",
    )
    import_offers.add_argument("file")
    import_offers.add_argument(
        "--replace-provider",
        action="append",
        default=[],
        metavar="NAME",
        help="drop all old offers of this provider first (repeatable)",
    )
    import_offers.add_argument(
        "--org", metavar="NAME", help="import as this organization's own prices instead of the public catalog"
    )
    import_offers.set_defaults(handler=cmd_import_offers)
    remove = admin_sub.add_parser("remove-provider", help="remove every offer of a provider from the catalog")
    remove.add_argument("provider", nargs="+")
    remove.add_argument(
        "--org", metavar="NAME", help="from this organization's own prices instead of the public catalog"
    )
    remove.set_defaults(handler=cmd_remove_provider)


def _session_factory() -> sessionmaker[Session]:
    """Sessions on the migrated database of the configured settings."""
    from services.cli.server import load_settings, migrate_database
    from services.core.db import make_engine, make_sessionmaker

    settings = load_settings()
    migrate_database(settings)
    return make_sessionmaker(make_engine(settings.sqlalchemy_url))


def cmd_create_org(args: argparse.Namespace) -> int:
    from services.core.db import unit_of_work
    from services.orgs.service import create_organization

    with unit_of_work(_session_factory()) as session:
        org = create_organization(session, args.name)
        print(f"created organization {org.name!r}", file=sys.stderr)
    return 0


def cmd_create_key(args: argparse.Namespace) -> int:
    from datetime import timedelta

    from services.core.db import unit_of_work, utcnow
    from services.orgs import audit
    from services.orgs.repository import OrganizationRepository
    from services.orgs.service import issue_key
    from services.runs.binding import check_binding_target

    if args.expires_in is not None and not 60 <= args.expires_in <= 5 * 366 * 86_400:
        raise CliError("--expires-in: 60 to 158112000 seconds (5 years)")
    with unit_of_work(_session_factory()) as session:
        org = OrganizationRepository(session).by_name(args.org)
        if org is None:
            raise CliError(f"--org: no organization named {args.org!r}")
        check_binding_target(session, org.id, args.node, args.run)
        expires_at = utcnow() + timedelta(seconds=args.expires_in) if args.expires_in else None
        key, row = issue_key(
            session,
            org.id,
            scopes=args.scope,
            admin=args.admin,
            name=args.name,
            expires_at=expires_at,
            node_id=args.node,
            run_id=args.run,
            platform_admin=args.platform_admin,
        )
        detail = {"scopes": row.scopes, "platform_admin": row.platform_admin}
        audit.record(session, org.id, "admin-cli", "key.create", f"key:{row.prefix}", "local", detail)
        print(key)
    return 0


def cmd_list_keys(args: argparse.Namespace) -> int:
    import json

    from services.core.db import unit_of_work
    from services.orgs.repository import OrganizationRepository
    from services.orgs.service import list_keys

    with unit_of_work(_session_factory()) as session:
        org = OrganizationRepository(session).by_name(args.org)
        if org is None:
            raise CliError(f"--org: no organization named {args.org!r}")
        rows: list[dict[str, Any]] = [
            {
                "id": r.id,
                "prefix": r.prefix,
                "name": r.name,
                "scopes": r.scopes.split(","),
                "created_at": r.created_at.isoformat(),
                "expires_at": r.expires_at.isoformat() if r.expires_at else None,
                "revoked_at": r.revoked_at.isoformat() if r.revoked_at else None,
                "node_id": r.node_id,
                "run_id": r.run_id,
            }
            for r in list_keys(session, org.id, include_revoked=args.all)
        ]
    if args.json:
        print(json.dumps({"items": rows}, indent=2))
        return 0
    print(f"{'ID':32}  {'PREFIX':10}  {'SCOPES':18}  {'EXPIRES':20}  {'REVOKED':20}  NAME")
    for r in rows:
        print(
            f"{r['id']:32}  {r['prefix']:10}  {','.join(r['scopes']):18}  {(r['expires_at'] or '-')[:19]:20}  "
            f"{(r['revoked_at'] or '-')[:19]:20}  {r['name'] or ''}"
        )
    return 0


def cmd_revoke_key(args: argparse.Namespace) -> int:
    from services.core.db import unit_of_work
    from services.orgs import audit
    from services.orgs.service import find_key, revoke_key

    with unit_of_work(_session_factory()) as session:
        found = find_key(session, args.key)
        row = revoke_key(session, found.organization_id, found.id)
        audit.record(session, row.organization_id, "admin-cli", "key.revoke", f"key:{row.prefix}", "local")
        print(f"revoked key {row.prefix} ({row.id}); it is refused from the next request on", file=sys.stderr)
    return 0


def cmd_rotate_key(args: argparse.Namespace) -> int:
    from services.core.db import unit_of_work
    from services.orgs import audit
    from services.orgs.service import find_key, rotate_key

    if not 0 <= args.grace <= 7 * 86_400:
        raise CliError("--grace: 0 to 604800 seconds (7 days)")
    with unit_of_work(_session_factory()) as session:
        old = find_key(session, args.key)
        key, row = rotate_key(session, old.organization_id, old.id, args.grace, server_cli=True)
        audit.record(
            session, row.organization_id, "admin-cli", "key.rotate", f"key:{row.prefix}", "local", {"replaced": old.id}
        )
        print(key)
    return 0


def cmd_import_offers(args: argparse.Namespace) -> int:
    """Upsert the file's providers in one transaction: every row is checked first, nothing half-imported."""
    from services.catalog.service import import_price_list_file
    from services.core.db import unit_of_work

    path = Path(args.file)
    if not regular_file(path):
        raise CliError(f"import-offers: no file {args.file[:200]}")
    factory = _session_factory()
    with unit_of_work(factory) as session:
        organization_id = _organization_id(session, args.org)
        result = import_price_list_file(
            session, path, organization_id=organization_id, replace_providers=args.replace_provider
        )
        owner = f"organization {args.org!r}" if args.org else "the public catalog"
        print(
            f"imported {path.name} into {owner}: {result.added} added, {result.updated} updated, "
            f"{result.kept} kept, {result.removed} removed; {result.version.rows} offers in version "
            f"{result.version.id}",
            file=sys.stderr,
        )
    return 0


def _organization_id(session: Session, name: str | None) -> str | None:
    """The id of the organization named by --org; None (the public catalog) without it."""
    from services.orgs.repository import OrganizationRepository

    if name is None:
        return None
    org = OrganizationRepository(session).by_name(name)
    if org is None:
        raise CliError(f"--org: no organization named {name!r}")
    return org.id


def cmd_remove_provider(args: argparse.Namespace) -> int:
    from services.catalog.service import remove_providers
    from services.core.db import unit_of_work

    with unit_of_work(_session_factory()) as session:
        organization_id = _organization_id(session, args.org)
        result = remove_providers(session, args.provider, source="cli removal", organization_id=organization_id)
        print(
            f"removed {result.removed} offers; {result.version.rows} offers in version {result.version.id}",
            file=sys.stderr,
        )
    return 0
