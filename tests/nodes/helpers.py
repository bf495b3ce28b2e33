"""Helpers shared by the node lifecycle tests (tests/nodes and tests/api/test_node_stops.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy.orm import Session, sessionmaker

from services.core.db import unit_of_work
from services.core.settings import Settings
from services.nodes.drivers import NodeTarget
from services.nodes.lifecycle import stop_policy
from services.nodes.schemas import Heartbeat
from services.nodes.service import heartbeat
from services.nodes.tables import NodeRow
from services.orgs.service import Principal
from services.runs.service import record_heartbeat_progress


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
