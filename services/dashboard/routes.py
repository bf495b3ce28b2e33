"""The dashboard's pages: a thin router over the domain services, rendering Jinja2 templates.

Signing in takes an organization API key once and keeps a signed session cookie (session.py); every
form carries the session's CSRF token and a POST without it is refused with a 403 page. Pages read
through the same service functions as the JSON API, so another organization's ids are 404 pages.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.routing import APIRoute
from fastapi.staticfiles import StaticFiles
from jinja2 import ChoiceLoader, Environment, PackageLoader, StrictUndefined, select_autoescape
from pydantic import ValidationError

from services.api.deps import Database, get_db
from services.api.limits import check_failures, check_rate, record_failure
from services.catalog import service as catalog_service
from services.catalog.models import catalog_models
from services.core.errors import Conflict, Forbidden, GpuplanError, NotFound, TooManyRequests, Unprocessable
from services.core.settings import Settings
from services.dashboard import forms, lists, loaders, session, views
from services.datasets import service as datasets_service
from services.estimator.errors import EstimatorError
from services.estimator.estimate import estimate
from services.estimator.plan import SERVING_PRECISIONS
from services.hub.service import FactoryCache, with_model_config
from services.nodes import service as nodes_service
from services.nodes.calibration import calibrated_utilisation
from services.nodes.schemas import BenchmarkOut, CalibrationOut, CalibrationRequest, NodeOut
from services.orgs import audit
from services.orgs.service import Principal, end_session, hash_key, session_principal, start_session
from services.plans import service as plans_service
from services.plans.schemas import PlanRequest
from services.plans.stored import STORED_PLANS
from services.quotes import service as quotes_service
from services.quotes.document import quote_document, render_pdf
from services.quotes.schemas import QuoteRequest
from services.runs import service as runs_service

PREFIX = "/dashboard"
PAGE_SIZE = 50

_templates = Environment(
    # The quote's body is the document's own template (services/quotes/templates), so page and PDF agree.
    loader=ChoiceLoader(
        [PackageLoader("services.dashboard", "templates"), PackageLoader("services.quotes", "templates")]
    ),
    autoescape=select_autoescape(["html"]),
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
_templates.filters["usd"] = views.usd
_templates.filters["duration"] = views.duration
_templates.filters["gib"] = views.gib
_templates.filters["percent"] = views.percent

# Only this origin's own files: no inline scripts or styles, no CDN, no framing.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


class SignInRequired(Exception):
    pass


class CsrfFailed(Exception):
    pass


@dataclass(frozen=True)
class Viewer:
    principal: Principal
    session: session.SessionData


def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def _read_session(request: Request) -> session.SessionData | None:
    settings = _settings(request)
    return session.decode(
        request.cookies.get(session.COOKIE_NAME),
        settings.session_secret.get_secret_value(),
        time.time(),
        settings.session_max_age_s,
    )


def _set_cookie(response: Response, request: Request, data: session.SessionData) -> None:
    settings = _settings(request)
    flags = session.cookie_flags(request.url.scheme == "https")
    response.set_cookie(
        session.COOKIE_NAME,
        session.encode(data, settings.session_secret.get_secret_value()),
        max_age=settings.session_max_age_s,
        path="/",
        httponly=bool(flags["httponly"]),
        samesite="lax",
        secure=bool(flags["secure"]),
    )


def render(
    request: Request,
    template: str,
    context: Mapping[str, Any],
    *,
    status_code: int = 200,
    viewer: Viewer | None = None,
    anonymous: session.SessionData | None = None,
) -> HTMLResponse:
    """A page; ``anonymous`` is a not-signed-in session whose cookie is set with it (for its CSRF token)."""
    current = viewer.session if viewer is not None else anonymous
    html = _templates.get_template(template).render(
        {
            "prefix": PREFIX,
            "path": request.url.path,
            "org": viewer.principal.organization_name if viewer else None,
            "csrf_field": session.CSRF_FIELD,
            "csrf_token": current.csrf_token if current else "",
            **context,
        }
    )
    response = HTMLResponse(html, status_code=status_code, headers=SECURITY_HEADERS)
    if anonymous is not None:
        _set_cookie(response, request, anonymous)
    return response


def _error_page(request: Request, status_code: int, title: str, message: str) -> HTMLResponse:
    viewer = getattr(request.state, "dashboard_viewer", None)
    context = {"title": title, "message": views.readable(message)}
    return render(request, "error.html", context, status_code=status_code, viewer=viewer)


def _limit_message(exc: TooManyRequests, viewer: Viewer | None) -> str:
    """A limit's refusal with the organization it applies to (and the key, for a per-key limit), where known."""
    if viewer is None:
        return exc.message
    principal = viewer.principal
    key = f", key {principal.key_prefix}" if principal.key_prefix and "per key" in exc.message else ""
    return f"{exc.message} (organization {principal.organization_name!r}{key})"


_TITLES = {
    400: "Bad request",
    401: "Not signed in",
    403: "Forbidden",
    404: "Not found",
    409: "Not yet",
    413: "Too large",
    422: "Invalid request",
    429: "Too many requests",
}


def refusal_page(path: str, status_code: int, message: str) -> HTMLResponse | None:
    """A refusal of the request limits (services.api.middleware: a NUL in the URL, a form over the body limit)
    on a dashboard page, as a page a browser shows; None elsewhere (the API and the static files keep JSON)."""
    if not (path == PREFIX or path.startswith(f"{PREFIX}/")) or path.startswith(f"{PREFIX}/static/"):
        return None
    html = _templates.get_template("error.html").render(
        {
            "prefix": PREFIX,
            "path": "",
            "org": None,
            "csrf_field": session.CSRF_FIELD,
            "csrf_token": "",
            "title": _TITLES.get(status_code, "Something is wrong"),
            "message": views.readable(message),
        }
    )
    return HTMLResponse(html, status_code=status_code, headers=SECURITY_HEADERS)


class DashboardRoute(APIRoute):
    """Errors become HTML pages (or a redirect to the sign-in page) instead of the API's JSON bodies."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def run(request: Request) -> Response:
            try:
                return await handler(request)
            except SignInRequired:
                target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                return RedirectResponse(f"{PREFIX}/login?next={quote(target, safe='/')}", status_code=303)
            except CsrfFailed:
                return _error_page(
                    request,
                    403,
                    "Forbidden",
                    "The form's security token is missing or out of date (the page may be older than your "
                    "sign-in). Go back, reload the page and submit again.",
                )
            except GpuplanError as exc:
                title = _TITLES.get(exc.status_code, "Something is wrong")
                if not isinstance(exc, TooManyRequests):
                    return _error_page(request, exc.status_code, title, exc.message)
                viewer = getattr(request.state, "dashboard_viewer", None)
                page = _error_page(request, exc.status_code, title, _limit_message(exc, viewer))
                page.headers["Retry-After"] = str(exc.retry_after_s)  # as the API says it: when to come back
                return page
            except RequestValidationError as exc:
                problems = "; ".join(_validation_problem(e) for e in exc.errors()) or "invalid request"
                return _error_page(request, 422, "Invalid request", problems)

        return run


def _validation_problem(error: Mapping[str, Any]) -> str:
    """One bad query or path parameter as the page says it: its name, the rule and what was sent
    ("min_memory_gib: Input should be a valid number ... (got 'abc')"), not the rule alone."""
    where = ".".join(str(p) for p in error.get("loc", ()) if p not in ("query", "path", "body"))
    message = str(error.get("msg", "invalid"))
    sent = error.get("input")
    got = f" (got {views.echo(sent)})" if isinstance(sent, str) else ""
    return f"{where}: {message}{got}" if where else f"{message}{got}"


# The longest page to return to after signing in; a longer one (a made-up URL) goes to the plans instead.
MAX_NEXT_CHARS = 2000


def _safe_next(target: str | None) -> str:
    """Only paths of this dashboard: never another site (open redirect) or a scheme-relative URL."""
    if (
        target
        and len(target) <= MAX_NEXT_CHARS
        and target.startswith(PREFIX)
        and not target.startswith("//")
        and "\\" not in target
    ):
        return target
    return f"{PREFIX}/plans"


def get_viewer(request: Request, db: Annotated[Database, Depends(get_db)]) -> Viewer:
    data = _read_session(request)
    if data is None or data.session_id is None:
        raise SignInRequired
    with db.transaction() as (s, _pending):
        principal = session_principal(s, data.session_id)
    if principal is None or "read" not in principal.scopes:
        raise SignInRequired
    # Known before the limits are checked, so a refusal's page says whose limit it is.
    viewer = Viewer(principal=principal, session=data)
    request.state.dashboard_viewer = viewer
    # The key's rate limit holds on its dashboard session as on the API (issue 21).
    check_rate(db.counters, principal.key_id or principal.organization_id, db.settings.rate_limit_per_minute)
    if request.method not in ("GET", "HEAD") and "plan" not in principal.scopes:
        raise Forbidden("this key may only read: planning and quoting need a key with the 'plan' scope")
    return viewer


ViewerDep = Annotated[Viewer, Depends(get_viewer)]
DbDep = Annotated[Database, Depends(get_db)]


def _check_csrf(data: session.SessionData | None, submitted: Any) -> None:
    if not session.csrf_ok(data, submitted if isinstance(submitted, str) else None):
        raise CsrfFailed


router = APIRouter(prefix=PREFIX, include_in_schema=False, route_class=DashboardRoute)


@router.get("")
@router.get("/")
def home() -> RedirectResponse:
    return RedirectResponse(f"{PREFIX}/plans", status_code=303)


# --- signing in and out --------------------------------------------------------------------------


@router.get("/login")
def login_page(request: Request, next: str | None = None) -> HTMLResponse:
    # No length limit on ``next`` (a 422 page here was a dead end for a signed-out visit to a long but valid
    # URL, such as the catalog with its filters): _safe_next drops a page too long to return to.
    anonymous = _read_session(request) or session.new_session(time.time())
    return render(request, "login.html", {"next": _safe_next(next), "message": None}, anonymous=anonymous)


@router.post("/login")
async def login(request: Request, db: DbDep) -> Response:
    form = await request.form()
    data = _read_session(request)
    _check_csrf(data, form.get(session.CSRF_FIELD))
    key = str(form.get("api_key") or "").strip()
    target = _safe_next(str(form.get("next") or ""))
    address = request.client.host if request.client else "unknown"
    check_failures(db.counters, address, db.settings.auth_failures_per_minute)

    def lookup() -> Principal | None:
        if not key:
            return None
        with db.transaction() as (s, _pending):
            found = loaders.principal_for_key_hash(s, hash_key(key))
            return found if found is not None and "read" in found.scopes else None

    principal = await run_in_threadpool(lookup)
    if principal is None:
        record_failure(db.counters, address, db.settings.auth_failures_per_minute)
        if key:
            await run_in_threadpool(_audit_sign_in, db, None, "dashboard.sign_in_failed", address)
        message = "Enter your organization's API key." if not key else "Unknown or revoked API key."
        return render(
            request,
            "login.html",
            {"next": target, "message": message},
            status_code=401,
            anonymous=data or session.new_session(time.time()),
        )

    def sign_in() -> str:
        with db.transaction() as (s, _pending):
            return start_session(s, hash_key(key), _settings(request).session_max_age_s)

    session_id = await run_in_threadpool(sign_in)
    await run_in_threadpool(_audit_sign_in, db, principal, "dashboard.sign_in", address)
    response = RedirectResponse(target, status_code=303)
    _set_cookie(response, request, session.new_session(time.time(), session_id=session_id))
    return response


def _audit_sign_in(db: Database, principal: Principal | None, action: str, address: str) -> None:
    """An audit row per dashboard sign-in, and per failed one (no organization, and nothing of the key
    typed: it may be a real key with a typo)."""
    with db.transaction() as (s, _pending):
        organization = principal.organization_id if principal is not None else None
        actor = f"key:{principal.key_prefix}" if principal is not None else "anonymous"
        audit.record(s, organization, actor, action, None, address)


@router.get("/logout")
def logout_page() -> RedirectResponse:
    """Signing out is a form (POST with the CSRF token); the address opened on its own goes to the plans."""
    return RedirectResponse(f"{PREFIX}/plans", status_code=303)


@router.post("/logout")
async def logout(request: Request, db: DbDep) -> Response:
    form = await request.form()
    data = _read_session(request)
    _check_csrf(data, form.get(session.CSRF_FIELD))
    if data is not None and data.session_id is not None:
        session_id = data.session_id

        def sign_out() -> None:
            with db.transaction() as (s, _pending):
                end_session(s, session_id)

        await run_in_threadpool(sign_out)
    response = RedirectResponse(f"{PREFIX}/login", status_code=303)
    _set_cookie(response, request, session.new_session(time.time()))
    return response


# --- plans ---------------------------------------------------------------------------------------


@router.get("/plans")
def plans_page(
    request: Request,
    viewer: ViewerDep,
    db: DbDep,
    before: Annotated[str | None, Query(max_length=64)] = None,
) -> HTMLResponse:
    with db.transaction() as (s, _pending):
        rows = plans_service.list_plans(s, viewer.principal, PAGE_SIZE + 1, before)
        items = [views.plan_list_item(plans_service.to_summary(r)) for r in rows[:PAGE_SIZE]]
    next_cursor = items[-1].id if len(rows) > PAGE_SIZE else None
    return render(
        request,
        "plans.html",
        {"items": items, "next_cursor": next_cursor, "first_page": before is None},
        viewer=viewer,
    )


def _form_context(form: forms.PlanForm) -> dict[str, Any]:
    return {
        "form": form,
        "models": [m.hf_id for m in catalog_models()],
        "methods": forms.METHODS,
        "modes": forms.MODES,
        "precisions": forms.PRECISIONS,
        "serving_precisions": SERVING_PRECISIONS,
        "serving_weights": [(w, forms.SERVING_WEIGHT_LABELS[w]) for w in forms.SERVING_WEIGHTS],
        "kv_cache_dtypes": forms.KV_CACHE_DTYPES,
    }


@router.get("/plans/new")
def new_plan_page(request: Request, viewer: ViewerDep) -> HTMLResponse:
    return render(request, "plan_new.html", _form_context(forms.blank_form()), viewer=viewer)


@router.post("/plans")
async def submit_plan(request: Request, viewer: ViewerDep, db: DbDep) -> Response:
    raw = await request.form()
    _check_csrf(viewer.session, raw.get(session.CSRF_FIELD))
    # A pasted config.json is parsed and validated on a worker thread, never on the event loop.
    form, plan_request = await run_in_threadpool(
        forms.parse_plan_form, {k: v for k, v in raw.items() if isinstance(v, str)}
    )
    if plan_request is not None and plan_request.mode == "inference":
        return await run_in_threadpool(_inference_page, request, viewer, form, plan_request)

    limited: list[TooManyRequests] = []

    def submit() -> str | None:
        if plan_request is None:
            return None
        try:
            # A model named by its Hub id is fetched (and cached) before the plan's transaction opens.
            with_model_config(plan_request.to_plan(), FactoryCache(db.factory))
            with db.transaction() as (s, pending):
                row, _created = plans_service.submit(
                    s, viewer.principal, plan_request, None, pending, db.settings.quota_plans_per_hour
                )
                return row.id
        except TooManyRequests as exc:  # no input to fix: the form is kept, to submit again later
            form.add("form", _limit_message(exc, viewer))
            limited.append(exc)
            return None
        except (Unprocessable, EstimatorError) as exc:
            form.add(forms.input_for(exc.field, form.values), exc.message)
            return None

    plan_id = await run_in_threadpool(submit)
    if plan_id is None and limited:
        # 429 with Retry-After, as the API answers the same refusal (the page said 422, an input to fix).
        page = render(request, "plan_new.html", _form_context(form), status_code=429, viewer=viewer)
        page.headers["Retry-After"] = str(limited[0].retry_after_s)
        return page
    if plan_id is None:
        return render(request, "plan_new.html", _form_context(form), status_code=422, viewer=viewer)
    return RedirectResponse(f"{PREFIX}/plans/{plan_id}", status_code=303)


def _inference_page(request: Request, viewer: Viewer, form: forms.PlanForm, plan_request: PlanRequest) -> Response:
    """Inference memory: the estimate of the model's serving footprint (weights, KV cache, activations of
    one forward pass), shown at once and not stored; plans are training runs."""
    try:
        report = estimate(plan_request.to_plan())
    except EstimatorError as exc:
        form.add(forms.input_for(exc.field, form.values), str(exc))
        return render(request, "plan_new.html", _form_context(form), status_code=422, viewer=viewer)
    page = views.inference_page(plan_request.model_dump(mode="json", exclude_none=True), report.model_dump(mode="json"))
    return render(request, "inference.html", {"page": page}, viewer=viewer)


def _plan_page(
    request: Request,
    viewer: Viewer,
    db: Database,
    plan_id: str,
    quote_error: str | None = None,
    status_code: int = 200,
    quote_form: QuoteForm | None = None,
) -> HTMLResponse:
    margin = _settings(request).safety_margin
    with db.transaction() as (s, _pending):
        row = plans_service.get_plan(s, viewer.principal, plan_id)
        out = plans_service.to_out(row)
        candidates = loaders.candidate_setups(s, row, margin)
        quotes = [
            (q.id, f"{views.usd(q.total_usd)} · {views.setup_label(q.setup)} · {views.when(q.created_at)}")
            for q in loaders.quotes_for_plan(s, viewer.principal, plan_id)
        ]
    page = views.plan_page(out, candidates, quotes)
    problem = views.readable(quote_error) if quote_error is not None else None
    context = {"page": page, "quote_error": problem, "quote_form": quote_form}
    return render(request, "plan.html", context, status_code=status_code, viewer=viewer)


@dataclass(frozen=True)
class QuoteForm:
    """A refused quote request as it was sent (shown again in the plan page's quote form) and the input the
    refusal is about ("setup", "spot", "customer_name" or "customer_email"), which the message is linked to."""

    setup: str
    spot: bool
    customer_name: str
    customer_email: str
    field: str


_QUOTE_INPUTS = ("customer_name", "customer_email", "spot")


def _quote_input(problem: str) -> str:
    """The quote form's input a refusal names before its colon ("customer_email: not an email address ..."); the
    setup for the rest (no offer, a price changed since the plan)."""
    named = problem.partition(":")[0].strip()
    return named if named in _QUOTE_INPUTS else "setup"


def _quote_problem(error: Mapping[str, Any]) -> str:
    """One invalid quote input as the page says it: "customer_name: at most 200 characters (got 100,000)" rather
    than pydantic's "Value should have at most 200 items after validation"."""
    where = ".".join(str(p) for p in error.get("loc", ()))
    sent = error.get("input")
    if error.get("type") == "too_long" and isinstance(sent, str):
        limit = (error.get("ctx") or {}).get("max_length")
        return f"{where}: at most {limit:,} characters (got {len(sent):,})"
    message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
    return message if message.startswith(where) else f"{where}: {message}"


@router.get("/plans/{plan_id}")
def plan_detail(request: Request, plan_id: str, viewer: ViewerDep, db: DbDep) -> HTMLResponse:
    return _plan_page(request, viewer, db, plan_id)


@router.get("/plans/{plan_id}/status")
def plan_status(plan_id: str, viewer: ViewerDep, db: DbDep) -> JSONResponse:
    """For the plan page's live status (polled by dashboard.js)."""
    with db.transaction() as (s, _pending):
        row = plans_service.get_plan(s, viewer.principal, plan_id)
        body = {"id": row.id, "status": row.status}
    return JSONResponse(body, headers={"Cache-Control": "no-store"})


@router.get("/plans/{plan_id}/quotes")
def quote_form_page(plan_id: str) -> RedirectResponse:
    """The address a refused quote request leaves in the browser (the plan page answered the POST), opened again:
    the plan's quote form, not a 404 (the plan page itself says 404 for another organization's plan)."""
    return RedirectResponse(f"{PREFIX}/plans/{quote(plan_id, safe='')}#quote-h", status_code=303)


@router.post("/plans/{plan_id}/quotes")
async def request_quote(request: Request, plan_id: str, viewer: ViewerDep, db: DbDep) -> Response:
    form = await request.form()
    _check_csrf(viewer.session, form.get(session.CSRF_FIELD))
    choice = views.parse_quote_value(str(form.get("setup") or ""))
    spot = form.get("spot") == "on"  # the checkbox sends "on"; "false" was read as checked
    sent = {k: str(form.get(k) or "") for k in ("setup", "customer_name", "customer_email")}
    customer_name = sent["customer_name"].strip() or None
    customer_email = sent["customer_email"].strip() or None
    settings = _settings(request)

    def create() -> tuple[str | None, str | None, int]:
        if choice is None:
            # Scoped like any other read: a foreign plan is still a 404, not a form error.
            with db.transaction() as (s, _pending):
                plans_service.get_plan(s, viewer.principal, plan_id)
            return None, "Pick a setup to quote.", 422
        try:
            body = QuoteRequest(
                gpu=choice.gpu,
                gpus=choice.gpus,
                provider=choice.provider,
                region=choice.region,
                nodes=choice.nodes,
                offer_gpus_per_node=choice.offer_gpus_per_node,
                spot=spot,
                customer_name=customer_name,
                customer_email=customer_email,
            )
        except ValidationError as exc:
            return None, _quote_problem(exc.errors()[0]), 422
        try:
            with db.transaction() as (s, _pending):
                row = quotes_service.create_quote(
                    s, viewer.principal, plan_id, body, settings.safety_margin, settings.quote_validity_days
                )
                return row.id, None, 303
        except (Unprocessable, Conflict) as exc:
            # A price changed since the plan is a 409, bad input a 422: the plan page says which.
            return None, exc.message, exc.status_code

    quote_id, problem, status = await run_in_threadpool(create)
    if quote_id is None:
        # The form comes back as it was sent (setup, spot, customer), its message linked to the input it names.
        kept = QuoteForm(spot=spot, field=_quote_input(problem or ""), **sent)
        return await run_in_threadpool(_plan_page, request, viewer, db, plan_id, problem, status, kept)
    return RedirectResponse(f"{PREFIX}/quotes/{quote_id}", status_code=303)


# --- quotes, nodes, benchmarks -------------------------------------------------------------------


@router.get("/quotes/{quote_id}")
def quote_detail(request: Request, quote_id: str, viewer: ViewerDep, db: DbDep) -> HTMLResponse:
    with db.transaction() as (s, _pending):
        out = quotes_service.to_out(quotes_service.get_quote(s, viewer.principal, quote_id))
    page = quote_document(out)
    return render(request, "quote.html", {"page": page, "doc": page}, viewer=viewer)


@router.get("/quotes/{quote_id}/pdf")
def quote_pdf(quote_id: str, viewer: ViewerDep, db: DbDep) -> Response:
    with db.transaction() as (s, _pending):
        out = quotes_service.to_out(quotes_service.get_quote(s, viewer.principal, quote_id))
    doc = quote_document(out)
    return Response(
        render_pdf(doc),
        media_type="application/pdf",
        headers={"Content-Disposition": f'attachment; filename="quote-{doc.number}.pdf"'},
    )


# --- lists: catalog, quotes, runs, data sets ------------------------------------------------------

PAGE = 50
Cursor = Annotated[str | None, Query(pattern="^[0-9a-f]{32}$")]


@router.get("/catalog")
def catalog_page(
    request: Request,
    viewer: ViewerDep,
    db: DbDep,
    gpu: Annotated[str | None, Query(max_length=100)] = None,
    provider: Annotated[str | None, Query(max_length=100)] = None,
    # NaN said "should be less than or equal to 10000" (got 'nan'): a finite number is what is missing.
    min_memory_gib: Annotated[float | None, Query(ge=0, le=10_000, allow_inf_nan=False)] = None,
    max_usd_per_hour: Annotated[float | None, Query(ge=0, le=100_000, allow_inf_nan=False)] = None,
    spot: Annotated[bool, Query()] = False,
) -> HTMLResponse:
    """The offers this organization plans on, by card, with each price's age and source."""
    now = datetime.now(UTC)
    filters: dict[str, Any] = {
        "gpu": gpu or None,
        "provider": provider or None,
        "min_memory_gib": min_memory_gib,
        "max_usd_per_hour": max_usd_per_hour,
        "spot": True if spot else None,
    }
    with db.transaction() as (s, _pending):
        org = viewer.principal.organization_id
        rows = catalog_service.active_offers(s, org, **filters)
        everything = catalog_service.active_offers(s, org)
        cards = lists.offers_by_card(rows, now, catalog_service.own_version_id(s, org))
    context = {
        "cards": cards,
        "offers": sum(len(c.offers) for c in cards),
        "filters": filters,
        "gpus": sorted({r.gpu for r in everything}),
        "providers": sorted({r.provider for r in everything}),
        "stale_days": lists.STALE_AFTER_DAYS,
    }
    return render(request, "catalog.html", context, viewer=viewer)


@router.get("/quotes")
def quotes_page(request: Request, viewer: ViewerDep, db: DbDep, before: Cursor = None) -> HTMLResponse:
    with db.transaction() as (s, _pending):
        rows, cursor = quotes_service.quotes_page(s, viewer.principal, PAGE, before)
        items = lists.quote_rows([quotes_service.to_out(r) for r in rows], datetime.now(UTC))
    context = {"items": items, "next_cursor": cursor, "first_page": before is None}
    return render(request, "quotes.html", context, viewer=viewer)


@router.get("/runs")
def runs_page(request: Request, viewer: ViewerDep, db: DbDep, before: Cursor = None) -> HTMLResponse:
    with db.transaction() as (s, _pending):
        rows, cursor = runs_service.runs_page(s, viewer.principal, None, PAGE, before)
        items = lists.run_rows([runs_service.to_out(s, r) for r in rows], datetime.now(UTC))
    context = {"items": items, "next_cursor": cursor, "first_page": before is None}
    return render(request, "runs.html", context, viewer=viewer)


@router.get("/datasets")
def datasets_page(request: Request, viewer: ViewerDep, db: DbDep, before: Cursor = None) -> HTMLResponse:
    with db.transaction() as (s, _pending):
        rows, cursor = datasets_service.datasets_page(s, viewer.principal, PAGE, before)
        items = lists.dataset_rows(rows, datetime.now(UTC))
    context = {"items": items, "next_cursor": cursor, "first_page": before is None}
    return render(request, "datasets.html", context, viewer=viewer)


@router.get("/nodes")
def nodes_page(request: Request, viewer: ViewerDep, db: DbDep) -> HTMLResponse:
    now = datetime.now(UTC)
    with db.transaction() as (s, _pending):
        rows = [
            views.node_row(
                NodeOut.model_validate(n, from_attributes=True),
                loaders.node_lifecycle(s, viewer.principal.organization_id, n.id),
                now,
            )
            for n in nodes_service.list_nodes(s, viewer.principal)
        ]
    return render(request, "nodes.html", {"nodes": rows}, viewer=viewer)


@dataclass(frozen=True)
class CalibrationForm:
    """A refused calibration request as it was sent (shown again) and the input its message is about."""

    node_id: str
    plan_id: str
    warmup_steps: str
    timed_steps: str
    field: str


_STEP_INPUTS = {"warmup_steps": "warm-up steps", "timed_steps": "timed steps"}


def _step_bounds(name: str) -> tuple[int, int, int]:
    """The lowest, highest and default count of a CalibrationRequest step field, as the API's schema has them."""
    field = CalibrationRequest.model_fields[name]
    bounds = {k: getattr(m, k) for m in field.metadata for k in ("ge", "le") if hasattr(m, k)}
    return int(bounds["ge"]), int(bounds["le"]), int(field.default)


def _steps(raw: str, name: str) -> tuple[int | None, str | None]:
    """A step count of the calibration form, or why it is not one (naming the input, as the plan form does)."""
    label = _STEP_INPUTS[name]
    lo, hi, default = _step_bounds(name)
    text = raw.strip()
    if not text:
        return default, None
    try:
        value = int(text)
    except ValueError:
        return None, f"{label}: a whole number from {lo} to {hi} (got {views.echo(text)})"
    if not lo <= value <= hi:
        return None, f"{label}: from {lo} to {hi} (got {value:,})"
    return value, None


def _benchmarks_page(
    request: Request,
    viewer: Viewer,
    db: Database,
    problem: str | None = None,
    status_code: int = 200,
    calibration_form: CalibrationForm | None = None,
) -> HTMLResponse:
    with db.transaction() as (s, _pending):
        results = [
            BenchmarkOut.model_validate(b, from_attributes=True)
            for b in nodes_service.list_benchmarks(s, viewer.principal, None, None, None)
        ]
        org = viewer.principal.organization_id
        # What the estimates use now, per card and method (services/nodes/calibration.py).
        in_use = [
            (gpu, method, value, source)
            for method in sorted({b.method for b in results if b.used})
            for gpu, (value, source) in sorted(calibrated_utilisation(s, org, method).items())
        ]
        nodes = [n for n in nodes_service.list_nodes(s, viewer.principal) if n.status == "active"]
        node_choices = [(n.id, f"{n.name} ({n.gpu_count} x {n.gpu})") for n in nodes]
        names = {n.id: n.name for n in nodes_service.list_nodes(s, viewer.principal)}
        plan_choices = [
            (p.id, f"{views.display_name(p.model_name)} {p.method} ({p.id[:8]})")
            for p in plans_service.list_plans(s, viewer.principal, 50, None)
            if p.status == "done"
        ]
        jobs = [
            (CalibrationOut.model_validate(c, from_attributes=True), names.get(c.node_id, c.node_id[:8]))
            for c in nodes_service.list_calibrations(s, viewer.principal)
        ]
    public = loaders.public_accuracy()
    summary = public["summary"]["medium_high"]
    caption = (
        f"{len(public['cases'])} public measured runs (torchtune, PEFT, torchao, torchtitan, LitGPT); on the "
        f"{summary['memory_cases']} medium- and high-confidence ones the median memory error is "
        f"{summary['median_abs_error_pct']:.1f}%. From {public['generated_from']}."
    )
    page = views.benchmark_page(results, public["cases"], caption)
    context = {
        "page": page,
        "results": results,
        "in_use": in_use,
        "node_choices": node_choices,
        "plan_choices": plan_choices,
        "jobs": jobs,
        "problem": views.readable(problem) if problem is not None else None,
        "cal_form": calibration_form,
    }
    return render(request, "benchmarks.html", context, status_code=status_code, viewer=viewer)


@router.get("/benchmarks")
def benchmarks_page(request: Request, viewer: ViewerDep, db: DbDep) -> HTMLResponse:
    return _benchmarks_page(request, viewer, db)


@router.get("/calibrations")
def calibration_form_page() -> RedirectResponse:
    """The address a refused calibration request leaves in the browser, opened again: the benchmarks page's form."""
    return RedirectResponse(f"{PREFIX}/benchmarks#bm-jobs-h", status_code=303)


@router.post("/calibrations")
async def start_calibration(request: Request, viewer: ViewerDep, db: DbDep) -> Response:
    """Queue a calibration on a node: what POST /v1/nodes/{id}/calibrations does (its agent claims it)."""
    form = await request.form()
    _check_csrf(viewer.session, form.get(session.CSRF_FIELD))
    fields = {k: str(form.get(k) or "") for k in ("node_id", "plan_id", "warmup_steps", "timed_steps")}

    def create() -> tuple[str, str] | None:
        """None, or the input at fault and the message (the page said "2 validation errors for
        CalibrationRequest" or "invalid literal for int() with base 10: 'nan'", and reset every input)."""
        if not fields["node_id"]:
            return "node_id", "Pick a node to calibrate on."
        if not fields["plan_id"]:
            return "plan_id", "Pick a finished plan to run."
        steps = {}
        for name in _STEP_INPUTS:
            value, problem = _steps(fields[name], name)
            if problem is not None:
                return name, problem
            steps[name] = value
        try:
            body = CalibrationRequest(plan_id=fields["plan_id"], **steps)
        except ValidationError as exc:
            first = exc.errors()[0]
            return "plan_id", f"plan: {first.get('msg', 'invalid')}"
        try:
            with db.transaction() as (s, _pending):
                nodes_service.request_calibration(s, viewer.principal, fields["node_id"], body, plans=STORED_PLANS)
        except NotFound as exc:
            return ("plan_id" if exc.message.startswith("no plan") else "node_id"), exc.message
        return None

    refused = await run_in_threadpool(create)
    if refused is not None:
        kept = CalibrationForm(field=refused[0], **fields)
        return await run_in_threadpool(_benchmarks_page, request, viewer, db, refused[1], 422, kept)
    return RedirectResponse(f"{PREFIX}/benchmarks#bm-jobs-h", status_code=303)


@router.get("/{rest:path}")
def not_found(rest: str) -> Response:
    raise NotFound(f"no dashboard page at {views.shorten(f'{PREFIX}/{rest}')}")


def install(app: FastAPI) -> None:
    """Mount the dashboard's pages and its static files (CSS, JS) on the API's app."""
    app.mount(f"{PREFIX}/static", StaticFiles(packages=[("services.dashboard", "static")]), name="dashboard-static")
    app.include_router(router)
