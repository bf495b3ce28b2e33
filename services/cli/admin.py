"""`gpuplan admin`: organizations, API keys and price lists, straight on the database."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from services.cli.common import CliError, Parser, Subparsers

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
        "--admin", action="store_true", help="administers its organization (imports the organization's own prices)"
    )
    create_key.add_argument(
        "--platform-admin",
        action="store_true",
        help="may change the public catalog every organization plans on (POST /v1/platform/catalog/offers)",
    )
    create_key.set_defaults(handler=cmd_create_key)
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
    from services.core.db import unit_of_work
    from services.orgs.service import create_key

    with unit_of_work(_session_factory()) as session:
        print(create_key(session, args.org, admin=args.admin, platform_admin=args.platform_admin))
    return 0


def cmd_import_offers(args: argparse.Namespace) -> int:
    """Upsert the file's providers in one transaction: every row is checked first, nothing half-imported."""
    from services.catalog.service import import_price_list_file
    from services.core.db import unit_of_work

    path = Path(args.file)
    if not path.is_file():
        raise CliError(f"import-offers: no file {args.file}")
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
