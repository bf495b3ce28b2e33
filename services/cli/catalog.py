"""`gpuplan models` and `gpuplan gpus`: the bundled reference data; `gpuplan catalog refresh`: the live
price feeds; and the catalog the planning commands use (the service's, whenever a database is configured)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from services.catalog.gpus import gpu_specs
from services.catalog.models import catalog_models
from services.cli.common import CliError, Parser, Subparsers

if TYPE_CHECKING:
    from services.catalog.offers import Offer

FEED_PROVIDERS = ("runpod", "lambda", "vast", "aws")  # services.catalog.feeds.PROVIDERS, without importing it


def register(sub: Subparsers) -> None:
    sub.add_parser("models", help="list the bundled model catalog").set_defaults(handler=cmd_models)
    sub.add_parser("gpus", help="list the GPU specs gpuplan knows").set_defaults(handler=cmd_gpus)
    catalog = sub.add_parser("catalog", help="the provider catalog the service plans on")
    catalog_sub = catalog.add_subparsers(dest="catalog_command", required=True, parser_class=Parser)
    refresh = catalog_sub.add_parser(
        "refresh", help="fetch live prices from the providers' APIs into the public catalog (on the server)"
    )
    refresh.add_argument(
        "--provider",
        action="append",
        choices=FEED_PROVIDERS,
        help="only this provider (repeatable); default: those in GPUPLAN_CATALOG_FEEDS",
    )
    refresh.set_defaults(handler=cmd_catalog_refresh)


def cmd_models(_args: argparse.Namespace) -> int:
    for model in catalog_models():
        params = f"{model.published_params / 1e9:.2f}B" if model.published_params else "?"
        print(f"{model.hf_id:55} {model.config.get('model_type', '?'):12} {params:>9}")
    return 0


def cmd_gpus(_args: argparse.Namespace) -> int:
    for spec in gpu_specs():
        bf16 = f"{spec.bf16_tflops:g}" if spec.bf16_tflops else "-"
        print(
            f"{spec.name:14} {spec.memory_gib:6.1f} GiB  bf16 {bf16:>6} TFLOPs  {spec.hbm_bandwidth_gb_per_s:6g} GB/s"
        )
    return 0


def cmd_catalog_refresh(args: argparse.Namespace) -> int:
    """Refresh the feeds; exit 1 when one failed (its last good prices stay, its error is recorded)."""
    from services.catalog.feeds.refresh import refresh
    from services.cli.server import load_settings, migrate_database
    from services.core.db import make_engine, make_sessionmaker

    settings = load_settings()
    providers = args.provider or list(settings.feed_names)
    if not providers:
        raise CliError(
            "no feed to refresh: give --provider NAME or set GPUPLAN_CATALOG_FEEDS "
            f"(feeds: {', '.join(FEED_PROVIDERS)})"
        )
    migrate_database(settings)
    outcomes = refresh(make_sessionmaker(make_engine(settings.sqlalchemy_url)), settings, providers)
    for outcome in outcomes:
        if outcome.ok:
            note = f" ({outcome.note})" if outcome.note else ""
            print(f"{outcome.provider}: {outcome.offers} offers{note}")
        else:
            print(f"{outcome.provider}: failed, last good prices kept: {outcome.error}", file=sys.stderr)
    return 0 if all(o.ok for o in outcomes) else 1


def cli_offers() -> tuple[Offer, ...] | None:
    """The public catalog the service plans on, when a database is configured (GPUPLAN_DATABASE_URL, or the
    embedded default's SQLite file in this directory); None means the bundled price lists."""
    from services.cli.server import load_settings
    from services.core.settings import DEFAULT_SQLITE_FILE

    settings = load_settings()
    if settings.database_url is None and not (Path.cwd() / DEFAULT_SQLITE_FILE).is_file():
        return None
    from sqlalchemy.exc import SQLAlchemyError

    from services.catalog.service import catalog_offers
    from services.core.db import make_engine, make_sessionmaker, unit_of_work

    engine = make_engine(settings.sqlalchemy_url)
    try:
        with unit_of_work(make_sessionmaker(engine)) as session:
            offers = catalog_offers(session)
    except SQLAlchemyError as exc:
        reason = str(getattr(exc, "orig", None) or exc).splitlines()[0]
        raise CliError(
            f"cannot read the catalog from the database ({reason}); run `gpuplan migrate`, "
            "or unset GPUPLAN_DATABASE_URL to plan on the bundled price lists"
        ) from None
    finally:
        engine.dispose()
    return offers
