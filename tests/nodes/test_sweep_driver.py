"""The idle sweep with a provider driver its settings cannot build (a key or URL missing), on a real SQLite file."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from services.core.db import make_engine, make_sessionmaker, unit_of_work
from services.core.settings import Settings
from services.nodes.lifecycle import run_sweep
from services.nodes.schemas import NodeRegistration
from services.nodes.service import register_node
from services.nodes.tables import NodeEventRow
from services.orgs.service import Principal, create_organization
from tests.databases import migrate
from tests.nodes.helpers import beat, load_node

T0 = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)


def _node(factory: sessionmaker[Session], principal: Principal, name: str, at: datetime, **signals: object) -> str:
    with unit_of_work(factory) as session:
        node, token = register_node(session, principal, NodeRegistration(name=name, gpu="A100 80GB"))
    beat(factory, Settings(node_lost_after_s=1200), principal, node.id, token, at, **signals)
    return node.id


def test_a_driver_the_settings_cannot_build_is_reported_on_each_node_and_the_sweep_still_decides(
    tmp_path: Path,
) -> None:
    """GPUPLAN_PROVIDER_DRIVER=runpod without its key made every sweep raise before deciding anything: no node was
    marked lost, no final sync was asked for, and nothing but a server log line said why no idle node ever stopped."""
    db_url = f"sqlite:///{tmp_path / 'gpuplan.db'}"
    migrate(db_url)
    factory = make_sessionmaker(make_engine(db_url))
    with unit_of_work(factory) as session:
        org = create_organization(session, "sweeps")
        principal = Principal(org.id, org.name, False)
    idle = _node(factory, principal, "idle", T0)
    unsynced = _node(factory, principal, "unsynced", T0, unsynced_checkpoints=1)
    silent = _node(factory, principal, "silent", T0 - timedelta(minutes=20))
    settings = Settings(database_url=db_url, provider_driver="runpod", node_lost_after_s=1200)
    summary = run_sweep(factory, settings, now=T0 + timedelta(minutes=16))
    assert summary.decided == 3 and summary.lost == [silent] and not summary.stopped
    assert load_node(factory, silent).status == "lost"
    assert load_node(factory, unsynced).commands == ["sync"]
    row = load_node(factory, idle)
    assert row.status == "active" and row.stop_attempts == 0
    assert row.last_reason is not None and "GPUPLAN_PROVIDER_API_KEY" in row.last_reason
    with unit_of_work(factory) as session:
        kinds = session.scalars(select(NodeEventRow.kind).where(NodeEventRow.node_id == idle)).all()
    assert kinds.count("stop_failed") == 1
