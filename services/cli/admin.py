"""`gpuplan admin`: organizations, API keys and price lists, straight on the database."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from services.cli.common import Parser, Subparsers

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
    create_key.add_argument("--admin", action="store_true", help="may import price lists")
    create_key.set_defaults(handler=cmd_create_key)
    import_offers = admin_sub.add_parser("import-offers", help="import a CSV/JSON price list (all or nothing)")
    import_offers.add_argument("file")
    import_offers.set_defaults(handler=cmd_import_offers)


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
        print(create_key(session, args.org, admin=args.admin))
    return 0


def cmd_import_offers(args: argparse.Namespace) -> int:
    from services.catalog.service import import_price_list_file
    from services.core.db import unit_of_work

    factory = _session_factory()
    path = Path(args.file)
    if not path.is_file():
        raise SystemExit(f"gpuplan: error: import-offers: no file {args.file}")
    with unit_of_work(factory) as session:
        version = import_price_list_file(session, path)
        print(f"imported {version.rows} offers as catalog version {version.id}", file=sys.stderr)
    return 0
