"""Migrated test databases, copied from one database per test process that the migrations built.

Running every migration for each test cost 0.3-0.6 s of its setup (measured on the 2-core CI machine), most of
the suite's fixture time; a copy is a file copy (SQLite) or a CREATE DATABASE ... TEMPLATE (PostgreSQL). The
migrations themselves still run from scratch in tests/api/test_migrations.py and in .ci/run.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import uuid
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from services.core.migrate import upgrade

_templates: dict[str, str] = {}  # "sqlite" -> a migrated file; a server's admin URL -> a migrated database's name


def migrate(url: str) -> None:
    """Bring the empty database at ``url`` to the latest migration, as ``upgrade(url)`` would."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database and not Path(parsed.database).exists():
        shutil.copyfile(_sqlite_template(), parsed.database)
    elif parsed.get_backend_name() == "postgresql" and parsed.database:
        _copy_postgres_template(url, parsed.database)
    else:
        upgrade(url)


def _sqlite_template() -> str:
    if "sqlite" not in _templates:
        path = Path(tempfile.mkdtemp(prefix="gpuplan-template-")) / "template.db"
        upgrade(f"sqlite:///{path}")
        atexit.register(shutil.rmtree, path.parent, True)
        _templates["sqlite"] = str(path)
    return _templates["sqlite"]


def _copy_postgres_template(url: str, name: str) -> None:
    """Replace the (empty) database ``name`` with a copy of this server's migrated template."""
    admin_url = make_url(url).set(database="postgres").render_as_string(hide_password=False)
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        template = _templates.get(admin_url)
        if template is None:
            template = f"gpuplan_template_{uuid.uuid4().hex[:10]}"
            with admin.connect() as conn:
                conn.execute(text(f'CREATE DATABASE "{template}"'))
            template_url = make_url(url).set(database=template).render_as_string(hide_password=False)
            upgrade(template_url)  # migrations/env.py connects through a NullPool: no session stays on the template
            atexit.register(_drop, admin_url, template)
            _templates[admin_url] = template
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{template}"'))
    finally:
        admin.dispose()


def _drop(admin_url: str, name: str) -> None:
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()
