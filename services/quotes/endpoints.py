from __future__ import annotations

from fastapi import APIRouter, Response

from services.api.deps import DbDep, PrincipalDep, SettingsDep
from services.api.routing import OffLoopRoute
from services.quotes import service
from services.quotes.schemas import QuoteOut, QuoteRequest

# Bodies are validated off the event loop (services/api/routing.py).
router = APIRouter(prefix="/v1", tags=["quotes"], route_class=OffLoopRoute)


@router.post("/plans/{plan_id}/quotes", operation_id="quotes-create", status_code=201, response_model=QuoteOut)
def create_quote(
    plan_id: str, body: QuoteRequest, db: DbDep, principal: PrincipalDep, settings: SettingsDep, response: Response
) -> QuoteOut:
    with db.transaction() as (session, _pending):
        out = service.to_out(
            service.create_quote(
                session, principal, plan_id, body, settings.safety_margin, settings.quote_validity_days
            )
        )
    response.headers["Location"] = f"/v1/quotes/{out.id}"
    return out


@router.get("/quotes/{quote_id}", operation_id="quotes-get", response_model=QuoteOut)
def get_quote(quote_id: str, db: DbDep, principal: PrincipalDep) -> QuoteOut:
    with db.transaction() as (session, _pending):
        return service.to_out(service.get_quote(session, principal, quote_id))
