from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Response

from services.api.deps import DbDep, PageCursor, PageLimit, PrincipalDep, SettingsDep
from services.api.routing import OffLoopRoute
from services.core.idempotency import MAX_KEY_CHARS
from services.core.pages import DEFAULT_LIMIT
from services.quotes import service
from services.quotes.document import quote_document, render_html, render_pdf
from services.quotes.schemas import QuoteList, QuoteOut, QuoteRequest

# Bodies are validated off the event loop (services/api/routing.py).
router = APIRouter(prefix="/v1", tags=["quotes"], route_class=OffLoopRoute)


@router.post("/plans/{plan_id}/quotes", operation_id="quotes-create", status_code=201, response_model=QuoteOut)
def create_quote(
    plan_id: str,
    body: QuoteRequest,
    db: DbDep,
    principal: PrincipalDep,
    settings: SettingsDep,
    response: Response,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key", max_length=MAX_KEY_CHARS)] = None,
) -> QuoteOut:
    """Issue a quote of a setup of a done plan (201); a retry with the same Idempotency-Key and body answers with
    the quote it issued (200), or 409 once that quote has expired (a new key issues a new one)."""
    out, created = service.issue(
        db.transaction,
        principal,
        plan_id,
        body,
        settings.safety_margin,
        settings.quote_validity_days,
        idempotency_key,
    )
    response.headers["Location"] = f"/v1/quotes/{out.id}"
    if not created:
        response.status_code = 200
    return out


@router.get("/quotes", operation_id="quotes-list", response_model=QuoteList)
def list_quotes(
    db: DbDep, principal: PrincipalDep, limit: PageLimit = DEFAULT_LIMIT, before: PageCursor = None
) -> QuoteList:
    """The organization's quotes, newest first, a page at a time (``next_cursor`` names the next page)."""
    with db.transaction() as (session, _pending):
        rows, cursor = service.quotes_page(session, principal, limit, before)
        return QuoteList(items=[service.to_out(r) for r in rows], next_cursor=cursor)


@router.get("/quotes/{quote_id}", operation_id="quotes-get", response_model=QuoteOut)
def get_quote(quote_id: str, db: DbDep, principal: PrincipalDep) -> QuoteOut:
    with db.transaction() as (session, _pending):
        return service.to_out(service.get_quote(session, principal, quote_id))


@router.get(
    "/quotes/{quote_id}/pdf",
    operation_id="quotes-pdf",
    response_class=Response,
    responses={200: {"content": {"application/pdf": {"schema": {"type": "string", "format": "binary"}}}}},
)
def get_quote_pdf(quote_id: str, db: DbDep, principal: PrincipalDep) -> Response:
    """The quote as a PDF document, addressed to its customer."""
    with db.transaction() as (session, _pending):
        doc = quote_document(service.to_out(service.get_quote(session, principal, quote_id)))
    return Response(
        render_pdf(doc),
        media_type="application/pdf",
        headers={"Content-Disposition": f'attachment; filename="quote-{doc.number}.pdf"'},
    )


@router.get(
    "/quotes/{quote_id}/html",
    operation_id="quotes-html",
    response_class=Response,
    responses={200: {"content": {"text/html": {"schema": {"type": "string"}}}}},
)
def get_quote_html(quote_id: str, db: DbDep, principal: PrincipalDep) -> Response:
    """The quote as a standalone HTML document (the same content as the PDF)."""
    with db.transaction() as (session, _pending):
        doc = quote_document(service.to_out(service.get_quote(session, principal, quote_id)))
    return Response(
        render_html(doc),
        media_type="text/html; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="quote-{doc.number}.html"'},
    )
