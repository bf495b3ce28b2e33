"""The service commands: serve, migrate and admin. Imported only when used, so `gpuplan estimate`
stays free of the database and web stack."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from pydantic import ValidationError
from sqlalchemy.exc import OperationalError

from services.catalog.service import import_price_list_file
from services.core.db import make_engine, make_sessionmaker, unit_of_work
from services.core.migrate import upgrade
from services.core.settings import Settings
from services.orgs.repository import OrganizationRepository
from services.orgs.service import create_key, create_organization

LOCAL_ORG = "local"
LOCAL_KEY_FILE = Path(".gpuplan") / "local-key"


def _migrate(settings: Settings) -> None:
    try:
        upgrade(settings.sqlalchemy_url)
    except OperationalError as exc:
        reason = str(exc.orig).splitlines()[0] if exc.orig is not None else str(exc)
        raise SystemExit(f"gpuplan: error: cannot reach the database ({reason})") from None


def _local_key(settings: Settings) -> str | None:
    """Embedded default: create the 'local' organization and a key on first start, kept in a file
    readable only by this user so later starts can say where it is."""
    factory = make_sessionmaker(make_engine(settings.sqlalchemy_url))
    with unit_of_work(factory) as session:
        if OrganizationRepository(session).by_name(LOCAL_ORG) is not None:
            return None
        create_organization(session, LOCAL_ORG)
        key = create_key(session, LOCAL_ORG, admin=True)
    LOCAL_KEY_FILE.parent.mkdir(exist_ok=True)
    LOCAL_KEY_FILE.write_text(key + "\n", encoding="utf-8")
    os.chmod(LOCAL_KEY_FILE, 0o600)
    return key


def _serve(args: argparse.Namespace, settings: Settings) -> int:
    import uvicorn

    from services.api.app import create_app

    host = args.host or settings.host
    port = args.port or settings.port
    _migrate(settings)
    url = f"http://{host}:{port}"
    if settings.embedded:
        key = _local_key(settings)
        print(f"gpuplan: embedded mode (SQLite {settings.sqlalchemy_url.removeprefix('sqlite:///')}, in-process tasks)")
        if key is not None:
            print(f"gpuplan: created organization 'local' with API key {key} (saved in {LOCAL_KEY_FILE})")
        else:
            print(f"gpuplan: the 'local' organization's API key is in {LOCAL_KEY_FILE}")
        print(f'gpuplan: try  curl -H "Authorization: Bearer $(cat {LOCAL_KEY_FILE})" {url}/v1/plans')
    print(f"gpuplan: serving on {url}  (dashboard: {url}/dashboard, API docs: {url}/docs)", flush=True)
    uvicorn.run(create_app(settings), host=host, port=port, log_level="warning")
    return 0


def _celery(args: argparse.Namespace, settings: Settings) -> int:
    if settings.redis_url is None:
        raise SystemExit(
            f"gpuplan: error: {args.command} needs GPUPLAN_REDIS_URL (the embedded default runs tasks in process)"
        )
    _migrate(settings)
    import workers.tasks  # noqa: F401  (registers the tasks on the app)
    from workers.celery_app import QUEUES, app

    if args.command == "beat":
        app.start(["beat", "--loglevel", "INFO"])
        return 0
    queues = [q.strip() for q in args.queues.split(",") if q.strip()]
    unknown = sorted(set(queues) - set(QUEUES))
    if unknown:
        raise SystemExit(f"gpuplan: error: --queues: unknown {', '.join(unknown)}; allowed: {', '.join(QUEUES)}")
    app.worker_main(
        ["worker", "--loglevel", "INFO", "--queues", ",".join(queues), "--concurrency", str(args.concurrency)]
    )
    return 0


def _settings() -> Settings:
    try:
        return Settings()
    except ValidationError as exc:
        err = exc.errors()[0]
        name = "GPUPLAN_" + str(err["loc"][0]).upper() if err["loc"] else "GPUPLAN_*"
        raise SystemExit(f"gpuplan: error: {name}: {err['msg']} (got {err.get('input')!r})") from None


def run(args: argparse.Namespace) -> int:
    settings = _settings()
    if args.command == "serve":
        return _serve(args, settings)
    if args.command in ("worker", "beat"):
        return _celery(args, settings)
    _migrate(settings)
    if args.command == "migrate":
        print("gpuplan: database is at the latest migration")
        return 0
    factory = make_sessionmaker(make_engine(settings.sqlalchemy_url))
    with unit_of_work(factory) as session:
        if args.admin_command == "create-org":
            org = create_organization(session, args.name)
            print(f"created organization {org.name!r}", file=sys.stderr)
        elif args.admin_command == "create-key":
            print(create_key(session, args.org, admin=args.admin))
        elif args.admin_command == "import-offers":
            path = Path(args.file)
            if not path.is_file():
                raise SystemExit(f"gpuplan: error: import-offers: no file {args.file}")
            version = import_price_list_file(session, path)
            print(f"imported {version.rows} offers as catalog version {version.id}", file=sys.stderr)
    return 0
