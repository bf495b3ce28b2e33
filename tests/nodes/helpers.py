"""Helpers shared by the node lifecycle tests (tests/nodes and tests/api/test_node_stops.py)."""

from __future__ import annotations

from sqlalchemy.orm import Session, sessionmaker

from services.core.db import unit_of_work
from services.nodes.tables import NodeRow


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
