"""Stored plans as the nodes' calibration reads them (services.nodes.service.PlanSource). Plans sit above
nodes (a plan's estimate reads the nodes' calibrated utilisation), so nodes does not import this: the edges
hand ``STORED_PLANS`` in."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from services.estimator.plan import Plan
from services.hub.service import stored_request
from services.orgs.service import Principal
from services.plans.schemas import PlanRequest
from services.plans.service import get_plan


class StoredPlans:
    def request(self, session: Session, principal: Principal, plan_id: str) -> dict[str, Any]:
        """The plan's stored request body (404 when the organization has no such plan)."""
        return get_plan(session, principal, plan_id).request

    def filled(self, session: Session, principal: Principal, plan_id: str) -> tuple[dict[str, Any], Plan]:
        """The request with its model's config filled in from the catalog or the Hub cache (as JSON, without
        the unset fields) and the plan it describes."""
        request = stored_request(session, PlanRequest.model_validate(self.request(session, principal, plan_id)))
        return request.model_dump(mode="json", exclude_none=True), request.to_plan()


STORED_PLANS = StoredPlans()
