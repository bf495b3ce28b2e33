"""Helpers shared by the node lifecycle tests (tests/nodes and tests/api/test_node_stops.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from services.core.db import make_engine, make_sessionmaker, unit_of_work
from services.core.settings import Settings
from services.nodes.drivers import NodeTarget
from services.nodes.lifecycle import stop_policy
from services.nodes.schemas import Heartbeat, NodeRegistration
from services.nodes.service import heartbeat, register_node
from services.nodes.tables import NodeRow
from services.orgs.service import Principal, create_key, create_organization
from services.runs.service import record_heartbeat_progress
from tests.databases import migrate

# A tiny Llama a CPU node calibrates in a second, and a LoRA plan over it.
TINY = {
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
    "tie_word_embeddings": False,
}
TINY_PLAN: dict[str, Any] = {
    "model": {"name": "tiny-llama-test", "config": TINY},
    "method": "lora",
    "lora": {"rank": 4},
    "framework": "pytorch",
    "micro_batch_size": 2,
    "seq_len": 64,
    "dataset": {"tokens": 1_000_000},
    "epochs": 1,
}


def alpha_database(path: Path) -> tuple[str, sessionmaker[Session], str]:
    """A migrated SQLite database at ``path`` with one organization, alpha: its URL, session factory and API key."""
    url = f"sqlite:///{path}"
    migrate(url)
    factory = make_sessionmaker(make_engine(url))
    with unit_of_work(factory) as session:
        create_organization(session, "alpha")
        key = create_key(session, "alpha")
    return url, factory, key


@dataclass
class AgentStack:
    """The test API over an alpha-only database (``alpha_database``), for tests that run the real agent against it."""

    client: TestClient
    factory: sessionmaker[Session]
    key: str
    settings: Settings

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}


Db = tuple[sessionmaker[Session], Principal, str, str]  # the factory, the organization, a node and its token


def node_database(path: Path, org_name: str, registration: NodeRegistration) -> Db:
    """A migrated SQLite database at ``path`` with one organization and one node registered in it."""
    url = f"sqlite:///{path}"
    migrate(url)
    factory = make_sessionmaker(make_engine(url))
    with unit_of_work(factory) as session:
        org = create_organization(session, org_name)
        principal = Principal(org.id, org.name, False)
        node, token = register_node(session, principal, registration)
    return factory, principal, node.id, token


def load_node(factory: sessionmaker[Session], node_id: str) -> NodeRow:
    """The node's row as committed, detached from its session (read it after the session closed)."""
    with unit_of_work(factory) as session:
        row = session.get(NodeRow, node_id)
        assert row is not None
        session.expunge(row)
        return row


# A heartbeat's declared interval at its longest: the gap across which idle time accrues is then the lost threshold
# (services/nodes/idle.py cadence_gap_s), for tests that sweep long after the last heartbeat and test something else.
SLOW_AGENT = {"heartbeat_interval_s": 86_400.0}


def beat(
    factory: sessionmaker[Session],
    settings: Settings,
    principal: Principal,
    node_id: str,
    token: str,
    at: datetime,
    **signals: object,
) -> None:
    """One heartbeat of the node at ``at`` (a slow agent's, with ``signals`` over it), as the API records it."""
    with unit_of_work(factory) as session:
        heartbeat(
            session,
            principal,
            node_id,
            Heartbeat.model_validate({**SLOW_AGENT, **signals}),
            settings.node_lost_after_s,
            at,
            token=token,
            stops=stop_policy(settings),
            record_progress=record_heartbeat_progress,
        )


@dataclass
class Recording:
    """A driver that records the nodes it was asked to stop, and always succeeds."""

    name: str = "recording"
    stopped: list[str] = field(default_factory=list)

    def stop(self, node: NodeTarget) -> str:
        self.stopped.append(node.id)
        return "stopped"

    def start(self, node: NodeTarget) -> str:
        return "started"
