"""The service commands: serve, migrate, worker and beat (and their --check health probes). The database
and web stack are imported inside the handlers, so `gpuplan estimate` stays free of them."""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import logging
import os
import re
import socket
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from services.cli.common import LOCAL_KEY_FILE, CliError, Subparsers, command_log, examples, int_arg

if TYPE_CHECKING:
    from celery import Celery
    from fastapi import FastAPI
    from pydantic import ValidationError

    from services.core.settings import Settings

LOCAL_ORG = "local"


def register(sub: Subparsers) -> None:
    serve = sub.add_parser("serve", help="run the planning service (migrates the database first)")
    examples(
        serve,
        "gpuplan serve",
        "gpuplan serve --port 8080",
        "GPUPLAN_DATABASE_URL=postgresql+psycopg://... gpuplan serve --workers 2",
    )
    serve.add_argument("--host", type=_host_arg, help="bind address (default 127.0.0.1, or GPUPLAN_HOST)")
    serve.add_argument("--port", type=int_arg("--port", 1, 65535), help="port (default 8000, or GPUPLAN_PORT)")
    serve.add_argument(
        "--workers",
        type=int_arg("--workers", 1, 64),
        help="API processes (default 1, or GPUPLAN_API_WORKERS); 1-64",
    )
    serve.set_defaults(handler=cmd_serve)
    sub.add_parser("migrate", help="apply the database migrations and exit").set_defaults(handler=cmd_migrate)
    worker = sub.add_parser("worker", help="run a Celery worker (needs GPUPLAN_REDIS_URL)")
    worker.add_argument("--queues", help="comma list (default: every queue)")
    # As --workers: -1 was Celery's traceback, 0 silently one process per CPU, and 100000 forked until the open files
    # ran out (then exited 0).
    worker.add_argument("--concurrency", type=int_arg("--concurrency", 1, 64), default=2, help="worker processes; 1-64")
    worker.add_argument(
        "--check", action="store_true", help="health probe: exit 0 when this host's worker answers a ping"
    )
    # log_level None: Celery configures logging itself (its root handler would print each gpuplan record again).
    worker.set_defaults(handler=cmd_celery, log_level=None)
    beat = sub.add_parser("beat", help="run the Celery beat scheduler (needs GPUPLAN_REDIS_URL)")
    beat.add_argument(
        "--schedule",
        metavar="FILE",
        help="beat's record of when each entry last ran (default: $XDG_STATE_HOME/gpuplan/celerybeat-schedule)",
    )
    beat.add_argument(
        "--check", action="store_true", help="health probe: exit 0 when beat has written its schedule lately"
    )
    beat.set_defaults(handler=cmd_celery, log_level=None)


# A host name as RFC 1123 allows one: dot-separated labels of letters, digits and inner hyphens.
_HOST_NAME = re.compile(r"(?=.{1,253}$)(?!-)[A-Za-z0-9-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9-]{1,63}(?<!-))*\.?")


def _host_problem(value: str) -> str | None:
    """Why ``value`` is no address to bind (None: an IP address or a host name). An empty one bound 127.0.0.1
    silently, and a malformed one printed "serving on" before uvicorn's error."""
    try:
        ipaddress.ip_address(value)
        return None
    except ValueError:
        pass
    if _HOST_NAME.fullmatch(value) is None:
        return f"not an IP address or host name (got {value!r})"
    return None


def _host_arg(value: str) -> str:
    problem = _host_problem(value)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return value


def _check_listen(host: str, port: int) -> None:
    """Refuse, in one line, an address this machine cannot listen on (a name that does not resolve, an address of
    another machine, a port in use), before anything says it is serving there. uvicorn binds again right after
    (with SO_REUSEADDR, as here), so only a port taken in between goes unnoticed."""
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, address = found[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as exc:
        raise CliError(f"cannot listen on {host} port {port}: {exc.strerror or exc}") from None


def default_beat_schedule() -> Path:
    """Beat's schedule file in the user's state directory (XDG base directories), never the working
    directory: that is a checkout's work tree, or the image's /app, which its user cannot write."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "gpuplan" / "celerybeat-schedule"


def load_settings() -> Settings:
    """The settings from the environment; a bad GPUPLAN_* value is one line naming the variable."""
    from pydantic import ValidationError

    from services.core.settings import Settings

    try:
        return Settings()
    except ValidationError as exc:
        raise SystemExit(f"gpuplan: error: {settings_problem(exc)}") from None


def settings_problem(exc: ValidationError) -> str:
    """A bad GPUPLAN_* value as one line naming the variable (its value cut short: it may be long)."""
    err = exc.errors()[0]
    name = "GPUPLAN_" + str(err["loc"][0]).upper() if err["loc"] else "GPUPLAN_*"
    return f"{name}: {err['msg']} (got {str(err.get('input'))[:100]!r})"


def migrate_database(settings: Settings) -> None:
    """Bring the database to the latest migration, or exit with one line when it is unreachable."""
    from sqlalchemy.exc import ArgumentError, DatabaseError, OperationalError

    from services.core.migrate import upgrade

    try:
        upgrade(settings.sqlalchemy_url)
    except ArgumentError as exc:  # no such dialect or driver, or not a URL at all
        raise SystemExit(f"gpuplan: error: GPUPLAN_DATABASE_URL: not a database gpuplan can open ({exc})") from None
    except ImportError as exc:  # a dialect whose driver is not installed (mysql:// wants MySQLdb): was a traceback
        raise SystemExit(
            f"gpuplan: error: GPUPLAN_DATABASE_URL: not a database gpuplan can open (no driver: {exc})"
        ) from None
    except OperationalError as exc:
        reason = str(exc.orig).splitlines()[0] if exc.orig is not None else str(exc)
        raise SystemExit(f"gpuplan: error: cannot reach the database ({reason})") from None
    except DatabaseError as exc:  # reached, but not a database (a SQLite URL naming a text file): was a traceback
        reason = str(exc.orig).splitlines()[0] if exc.orig is not None else str(exc)
        raise SystemExit(f"gpuplan: error: GPUPLAN_DATABASE_URL: not a database gpuplan can use ({reason})") from None


def _local_key(settings: Settings) -> str | None:
    """Embedded default: create the 'local' organization and a key on first start, kept in a file
    readable only by this user so later starts can say where it is."""
    from services.core.db import make_engine, make_sessionmaker, unit_of_work
    from services.orgs.repository import OrganizationRepository
    from services.orgs.service import create_key, create_organization

    factory = make_sessionmaker(make_engine(settings.sqlalchemy_url))
    with unit_of_work(factory) as session:
        if OrganizationRepository(session).by_name(LOCAL_ORG) is not None:
            return None
        create_organization(session, LOCAL_ORG)
        # An organization admin (its own prices), never a platform admin: the public catalog stays with
        # `gpuplan admin` on the server (issue 15 item 7).
        key = create_key(session, LOCAL_ORG, admin=True, platform_admin=False)
    LOCAL_KEY_FILE.parent.mkdir(exist_ok=True)
    # Created readable by this user only (never briefly by others, as a write and then a chmod would be).
    descriptor = os.open(LOCAL_KEY_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as fh:
        fh.write(key + "\n")
    os.chmod(LOCAL_KEY_FILE, 0o600)  # a file left from an earlier install keeps its old mode otherwise
    return key


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    settings = load_settings()
    host = args.host if args.host is not None else settings.host
    problem = _host_problem(host)
    if problem is not None:  # GPUPLAN_HOST: --host is checked by its parser
        raise CliError(f"GPUPLAN_HOST: {problem}")
    port = args.port if args.port is not None else settings.port
    _check_listen(host, port)
    migrate_database(settings)
    url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    if settings.embedded:
        key = _local_key(settings)
        print(f"gpuplan: embedded mode (SQLite {settings.sqlalchemy_url.removeprefix('sqlite:///')}, in-process tasks)")
        if key is not None:
            # The key goes to the file only: stdout ends up in terminals' scrollback, CI logs and journald.
            print(f"gpuplan: created organization 'local'; its admin API key is in {LOCAL_KEY_FILE} (mode 0600)")
        else:
            print(f"gpuplan: the 'local' organization's API key is in {LOCAL_KEY_FILE}")
        print(f'gpuplan: try  curl -H "Authorization: Bearer $(cat {LOCAL_KEY_FILE})" {url}/v1/plans')
    workers = args.workers if args.workers is not None else settings.api_workers
    if not 1 <= workers <= 64:
        raise CliError(f"--workers: 1 to 64 API processes (got {workers})")
    # Built here also when worker processes will build their own: a factory that fails (a missing
    # package, say workers/ for GPUPLAN_REDIS_URL) then stops this command, where uvicorn would restart
    # each crashing worker process for ever and /healthz would never answer.
    app = _build_app(settings)
    print(f"gpuplan: serving on {url}  (dashboard: {url}/dashboard, API docs: {url}/docs)", flush=True)
    from services.api.server import uvicorn_options

    options = uvicorn_options(settings)
    if workers == 1:
        uvicorn.run(app, host=host, port=port, log_level="warning", **options)
        return 0
    app.state.engine.dispose()
    del app
    # Several processes share the dashboard's cookie secret and one metrics directory; each builds its
    # app from the environment (uvicorn starts them fresh).
    os.environ.setdefault("GPUPLAN_SESSION_SECRET", settings.session_secret.get_secret_value())
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="gpuplan-metrics-")
    print(f"gpuplan: {workers} API processes", flush=True)
    uvicorn.run(
        "services.cli.server:worker_app",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_level="warning",
        **options,
    )
    return 0


# The log of a worker process of `serve --workers N`: uvicorn starts each fresh, outside the command's own log.
_WORKER_LOG = contextlib.ExitStack()


def worker_app() -> FastAPI:
    """uvicorn's factory in each process of `serve --workers N`: the served app, with the "gpuplan" logger's records
    one line each on stderr as the command's own are (without it a worker printed bare messages, WARNING only)."""
    from services.api.app import create_served_app

    _WORKER_LOG.enter_context(command_log("serve", logging.WARNING))
    return create_served_app()


def _build_app(settings: Settings) -> FastAPI:
    """The served app, or one line saying which module is missing."""
    from services.api.app import create_served_app

    try:
        return create_served_app(settings)
    except ImportError as exc:
        hint = " (GPUPLAN_REDIS_URL is set: the workers package must be installed)" if exc.name == "workers" else ""
        raise SystemExit(f"gpuplan: error: the API cannot start: {exc}{hint}") from None


def cmd_migrate(_args: argparse.Namespace) -> int:
    migrate_database(load_settings())
    print("gpuplan: database is at the latest migration")
    return 0


def cmd_celery(args: argparse.Namespace) -> int:
    settings = load_settings()
    if settings.redis_url is None:
        raise SystemExit(
            f"gpuplan: error: {args.command} needs GPUPLAN_REDIS_URL (the embedded default runs tasks in process)"
        )
    if args.check:
        from workers.celery_app import app as celery_app

        return _check_worker(celery_app) if args.command == "worker" else _check_beat(celery_app, args.schedule)
    if args.command == "worker" and settings.worker_metrics_port:
        # Before prometheus_client is first imported: the pool's processes write their samples here.
        if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="gpuplan-worker-metrics-")
        from services.core.metrics import serve_multiprocess_metrics

        serve_multiprocess_metrics(settings.host, settings.worker_metrics_port)
    migrate_database(settings)
    import workers.tasks  # noqa: F401  (registers the tasks on the app)
    from workers.celery_app import QUEUES, app

    if args.command == "beat":
        schedule = Path(args.schedule) if args.schedule else default_beat_schedule()
        schedule.parent.mkdir(parents=True, exist_ok=True)
        app.start(["beat", "--loglevel", "INFO", "--schedule", str(schedule)])
        return 0
    queues = [q.strip() for q in args.queues.split(",") if q.strip()] if args.queues is not None else list(QUEUES)
    if not queues:  # "--queues ''" or ",,": named none, which Celery took as every queue
        raise SystemExit(f"gpuplan: error: --queues: no queue named; allowed: {', '.join(QUEUES)}")
    unknown = sorted(set(queues) - set(QUEUES))
    if unknown:
        raise SystemExit(f"gpuplan: error: --queues: unknown {', '.join(unknown)}; allowed: {', '.join(QUEUES)}")
    app.worker_main(
        ["worker", "--loglevel", "INFO", "--queues", ",".join(queues), "--concurrency", str(args.concurrency)]
    )
    return 0


def _check_worker(app: Celery) -> int:
    """The worker of this host (Celery's default node name, celery@hostname) answers a ping over the broker."""
    from celery.utils.nodenames import default_nodename

    node = default_nodename(None)
    replies = app.control.ping(destination=[node], timeout=5.0)
    if not replies:
        raise SystemExit(f"gpuplan: error: worker {node} did not answer a ping within 5 s")
    print(f"gpuplan: worker {node} answers")
    return 0


def _check_beat(app: Celery, schedule_arg: str | None) -> int:
    """Beat writes its schedule file after every task it sends (beat_sync_every=1), so the file is never
    older than the shortest entry's interval while beat runs; three intervals (plus 30 s) is stale."""
    import time
    from datetime import timedelta

    schedule = Path(schedule_arg) if schedule_arg else default_beat_schedule()
    # The dbm behind shelve decides the names: FILE (gdbm, ndbm: FILE.db) or FILE.dat/.dir/.bak (dumb).
    try:
        files = [p for p in (schedule, *schedule.parent.glob(schedule.name + ".*")) if p.is_file()]
    except OSError as exc:  # a name too long for the file system: was a traceback
        raise CliError(f"--schedule {str(schedule)[:200]}: {exc.strerror or exc}") from None
    if not files:
        raise SystemExit(f"gpuplan: error: beat has not written {schedule} yet")
    intervals = [
        e["schedule"].total_seconds() for e in app.conf.beat_schedule.values() if isinstance(e["schedule"], timedelta)
    ]
    max_age_s = 3 * min(intervals, default=60.0) + 30
    age_s = time.time() - max(p.stat().st_mtime for p in files)
    if age_s > max_age_s:
        raise SystemExit(
            f"gpuplan: error: beat last wrote {schedule} {age_s:.0f} s ago (stale after {max_age_s:.0f} s)"
        )
    print(f"gpuplan: beat wrote its schedule {age_s:.0f} s ago")
    return 0
