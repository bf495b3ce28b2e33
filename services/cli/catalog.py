"""`gpuplan models` and `gpuplan gpus`: the bundled reference data; `gpuplan catalog refresh`: the live
price feeds; and the catalog the planning commands use (the service's, whenever a database is configured)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from services.catalog.gpus import gpu_specs
from services.catalog.models import CatalogModel, catalog_models
from services.cli.common import CliError, Parser, Subparsers
from services.cli.render import table
from services.estimator.architecture import architecture_from_config, parameter_counts
from services.estimator.errors import EstimatorError

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


def _params(model: CatalogModel) -> tuple[str, str]:
    """The parameter count shown for a model and where it comes from: the published total, else the
    count the estimator derives from the model's config.json (the same count its estimates use)."""
    if model.published_params:
        return f"{model.published_params / 1e9:.2f}B", "published"
    try:
        counted = parameter_counts(architecture_from_config(model.config)).total
    except EstimatorError:
        return "-", "-"
    return f"{counted / 1e9:.2f}B", "config.json"


def cmd_models(_args: argparse.Namespace) -> int:
    rows = []
    for model in catalog_models():
        params, source = _params(model)
        rows.append([model.hf_id, str(model.config.get("model_type", "-")), params, source])
    print(table(["model", "type", "params", "params from"], rows, right={2}))
    return 0


def cmd_gpus(_args: argparse.Namespace) -> int:
    rows = [
        [
            spec.name,
            f"{spec.memory_gib:.1f}",
            f"{spec.bf16_tflops:g}" if spec.bf16_tflops else "-",
            f"{spec.hbm_bandwidth_gb_per_s:g}",
        ]
        for spec in gpu_specs()
    ]
    print(table(["GPU", "memory GiB", "bf16 TFLOPs", "memory GB/s"], rows, right={1, 2, 3}))
    return 0


class _PrintedOutcomes(logging.Filter):
    """Leaves out the refresh's records of feed outcomes, which the command prints itself."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not hasattr(record, "feed_outcome")


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
    feed_log = logging.getLogger(refresh.__module__)
    printed = _PrintedOutcomes()  # a failed feed was said twice: its log record, then the line below
    feed_log.addFilter(printed)
    try:
        outcomes = refresh(make_sessionmaker(make_engine(settings.sqlalchemy_url)), settings, providers)
    finally:
        feed_log.removeFilter(printed)
    for outcome in outcomes:
        if outcome.ok:
            note = f" ({outcome.note})" if outcome.note else ""
            print(f"{outcome.provider}: {outcome.offers} offers{note}")
        else:
            print(f"{outcome.provider}: {outcome.failure()}", file=sys.stderr)
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
