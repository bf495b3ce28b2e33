"""What the pages read, through the same domain services as the JSON API (so an organization sees
only its own rows, by the same queries), plus the few reads the API has no endpoint for."""

from __future__ import annotations

import functools
import json
from datetime import UTC, datetime
from importlib import resources
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from services.catalog.service import catalog_offers
from services.dashboard.views import NodeLifecycle
from services.estimator.errors import EstimatorError
from services.hub.service import stored_request
from services.nodes.calibration import calibrated_utilisation
from services.nodes.tables import NodeEventRow, NodeRow
from services.orgs.service import Principal, principal_for_hash
from services.plans.recommend import recommend
from services.plans.schemas import PlanRequest
from services.plans.tables import PlanRow
from services.quotes.tables import QuoteRow
from services.runs.tables import RunRow

# Every setup the planner keeps, for the cost-versus-time chart and the quote picker (a plan has a
# few dozen: card x GPU count, fastest configuration of each).
MAX_CANDIDATES = 500


def principal_for_key_hash(session: Session, key_hash: str) -> Principal | None:
    """The organization behind a key's hash; None once the key is revoked or expired."""
    return principal_for_hash(session, key_hash)


def candidate_setups(session: Session, row: PlanRow, safety_margin: float) -> list[dict[str, Any]]:
    """Every fitting setup for a done plan, cheapest first: the planner over today's catalog with the
    organization's calibration, as the plan's estimation and quotes run it (``row`` is already
    scoped to the caller's organization)."""
    if row.status != "done":
        return []
    request = stored_request(session, PlanRequest.model_validate(row.request))
    plan = request.to_plan()
    offers = catalog_offers(session, row.organization_id)
    utilisation = calibrated_utilisation(session, row.organization_id, plan.method)
    try:
        recs, _rejections, _warnings = recommend(
            plan, request.constraints, offers, safety_margin, top_n=MAX_CANDIDATES, utilisation=utilisation
        )
    except EstimatorError:
        # The stored estimate still shows; only the chart of today's candidates is left out.
        return []
    return recs


def quotes_for_plan(session: Session, principal: Principal, plan_id: str, limit: int = 20) -> list[QuoteRow]:
    """The latest quotes issued for one of the organization's plans."""
    return list(
        session.scalars(
            select(QuoteRow)
            .where(QuoteRow.plan_id == plan_id, QuoteRow.organization_id == principal.organization_id)
            .order_by(QuoteRow.created_at.desc())
            .limit(limit)
        ).all()
    )


def node_lifecycle(session: Session, organization_id: str, node_id: str) -> NodeLifecycle:
    """A node's current run, last durable checkpoint, idle timer and its latest shutdown decisions."""
    node = session.get(NodeRow, node_id)
    if node is None or node.organization_id != organization_id:
        return NodeLifecycle()
    run = session.get(RunRow, node.run_id) if node.run_id else None
    current = durable = None
    if run is not None and run.organization_id == organization_id:
        current = f"{run.id[:8]}" + (f" · step {run.progress_step}" if run.progress_step is not None else "")
        durable = f"step {run.last_durable_step}" if run.last_durable_step is not None else "none yet"
    idle: str | None
    if node.status != "active":
        idle = None  # a stopped, lost or replaced node has no running idle timer; its status says what it is
    elif node.idle_since is not None:
        minutes = (datetime.now(UTC) - node.idle_since).total_seconds() / 60
        idle = f"idle {minutes:.0f} of {node.idle_minutes:g} min"
    else:
        idle = "busy" if node.last_decision and node.last_decision.startswith("busy") else None
    events = session.scalars(
        select(NodeEventRow)
        .where(NodeEventRow.node_id == node.id, NodeEventRow.organization_id == organization_id)
        .order_by(NodeEventRow.created_at.desc())
        .limit(10)
    ).all()
    decisions = tuple(
        (e.created_at.strftime("%Y-%m-%d %H:%M UTC"), f"{node.name}: {e.kind} ({e.reason})") for e in events
    )
    return NodeLifecycle(current_run=current, last_durable_checkpoint=durable, idle_for=idle, decisions=decisions)


@functools.cache
def public_accuracy() -> dict[str, Any]:
    """The public measured cases with gpuplan's predictions (package data written by
    ``python -m benchmarks.dashboard.accuracy_data`` from the accuracy report)."""
    text = resources.files("services.dashboard").joinpath("data/accuracy_cases.json").read_text(encoding="utf-8")
    data: dict[str, Any] = json.loads(text)
    return data
