"""Whether an agent key's request is for its own node and run (the edges call this). It reads the
nodes and runs tables, so it lives in runs, above both, rather than in orgs beside the pure scope rules."""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy import select
from sqlalchemy.orm import Session

from services.core.errors import Forbidden, Unprocessable
from services.nodes.tables import CalibrationRow, NodeRow
from services.orgs.service import Principal
from services.runs.tables import RunRow


def check_binding_target(session: Session, organization_id: str, node_id: str | None, run_id: str | None) -> None:
    """At key creation: the node and run an agent key is bound to exist in the organization."""
    if node_id is not None:
        node = session.get(NodeRow, node_id)
        if node is None or node.organization_id != organization_id:
            raise Unprocessable(f"node_id: no node {node_id!r} in this organization", field="node_id")
    if run_id is not None:
        run = session.get(RunRow, run_id)
        if run is None or run.organization_id != organization_id:
            raise Unprocessable(f"run_id: no run {run_id!r} in this organization", field="run_id")


def check_agent_request(session: Session, principal: Principal, path_params: Mapping[str, str]) -> None:
    """An agent key acts only for its node, and for its run (or, unbound to a run, a run its node is in)."""
    refused = Forbidden(
        f"this agent key acts for node {principal.node_id} only"
        + (f" and run {principal.run_id}" if principal.run_id else ""),
        field="authorization",
    )
    node_id = path_params.get("node_id")
    if node_id is not None and node_id != principal.node_id:
        raise refused
    calibration_id = path_params.get("calibration_id")
    if calibration_id is not None:
        owner = session.scalar(select(CalibrationRow.node_id).where(CalibrationRow.id == calibration_id))
        if owner is not None and owner != principal.node_id:
            raise refused
    run_id = path_params.get("run_id")
    if run_id is not None:
        if principal.run_id is not None:
            if run_id != principal.run_id:
                raise refused
        else:
            node_ids = session.scalar(select(RunRow.node_ids).where(RunRow.id == run_id))
            if node_ids is not None and principal.node_id not in node_ids:
                raise refused
