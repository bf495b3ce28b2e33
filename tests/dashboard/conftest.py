"""Dashboard fixtures: signed-in TestClients over the API fixture, and a real server for the browser."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.api import conftest as api_fixtures
from tests.api.conftest import QLORA_PLAN, Api
from tests.conftest import require_service, served_on_loopback

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"
# The API tests' fixtures (the app over SQLite, and PostgreSQL when reachable), reused here.
database_url = api_fixtures.database_url
api = api_fixtures.api
_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


def csrf_token(html: str) -> str:
    found = _CSRF.search(html)
    if found is None:
        raise AssertionError("no CSRF token in the page")
    return found.group(1)


def sign_in(client: TestClient, key: str) -> None:
    page = client.get("/dashboard/login")
    response = client.post(
        "/dashboard/login",
        data={"csrf_token": csrf_token(page.text), "api_key": key, "next": "/dashboard/plans"},
        follow_redirects=False,
    )
    assert response.status_code == 303, response.text


@pytest.fixture
def alpha(api: Api) -> TestClient:
    """The API fixture's client, signed in to the dashboard as organization alpha."""
    sign_in(api.client, api.keys["alpha"])
    return api.client


@pytest.fixture
def beta(api: Api) -> Iterator[TestClient]:
    """A second browser-like client on the same app, signed in as organization beta."""
    client = TestClient(api.client.app)
    sign_in(client, api.keys["beta"])
    yield client
    client.close()


def submit_done_plan(api: Api, org: str = "alpha", plan: dict[str, Any] | None = None) -> dict[str, Any]:
    """Submit through the JSON API and wait for the estimate."""
    created = api.client.post("/v1/plans", json=plan or QLORA_PLAN, headers=api.headers(org))
    assert created.status_code == 202, created.text
    body = api.wait_for_plan(created.json()["id"], org)
    assert body["status"] == "done", body
    return body


@dataclass
class LiveServer:
    url: str
    keys: dict[str, str]
    database_url: str


def _live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:

    from services.api.app import create_app
    from services.core.db import make_engine, make_sessionmaker, unit_of_work
    from services.core.settings import Settings
    from services.orgs.service import create_key, create_organization
    from tests.databases import migrate

    url = f"sqlite:///{tmp_path_factory.mktemp('dashboard') / 'gpuplan.db'}"
    migrate(url)
    engine = make_engine(url)
    keys = {}
    with unit_of_work(make_sessionmaker(engine)) as session:
        for org in ("alpha", "beta"):
            create_organization(session, org)
            keys[org] = create_key(session, org)
    engine.dispose()
    app = create_app(Settings(database_url=url))
    with served_on_loopback(app, "dashboard-uvicorn") as base:
        yield LiveServer(url=base, keys=keys, database_url=url)


live_server = pytest.fixture(scope="module")(_live_server)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's headless Chromium driven by Playwright (never `playwright install`)."""
    import importlib.util

    have_playwright = importlib.util.find_spec("playwright") is not None
    require_service("Playwright for Python", have_playwright, "pip install playwright (the dev extra)")
    require_service("Chromium at /usr/bin/chromium", CHROMIUM.exists(), "apt-get install -y chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


def screenshot(page: Any, name: str, full_page: bool = True) -> Path:
    """Save a screenshot under artifacts/screenshots/ (git-ignored; CI keeps it as an artifact)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=full_page)
    return path
