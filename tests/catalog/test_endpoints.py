"""The price-list import endpoints through the real app over a migrated SQLite file: a bad row answers 422
naming its row and field, and nothing is imported."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from services.api.app import create_app
from services.catalog.service import record_feed_success
from services.core.db import make_engine, make_sessionmaker, unit_of_work
from services.core.settings import Settings
from services.orgs.service import create_key, create_organization
from tests.conftest import bounded_test_client
from tests.databases import migrate

JSON = {"Content-Type": "application/json"}


@dataclass
class Client:
    http: TestClient
    admin: dict[str, str]
    platform: dict[str, str]

    def offers(self, provider: str) -> list[dict[str, Any]]:
        response = self.http.get(f"/v1/catalog/offers?provider={provider}", headers=self.admin)
        assert response.status_code == 200, response.text
        items: list[dict[str, Any]] = response.json()["items"]
        return items


@pytest.fixture
def client(tmp_path: Path) -> Iterator[Client]:
    url = f"sqlite:///{tmp_path / 'gpuplan.db'}"
    migrate(url)
    with unit_of_work(make_sessionmaker(make_engine(url))) as session:
        create_organization(session, "alpha")
        admin = create_key(session, "alpha", admin=True)
        platform = create_key(session, "alpha", platform_admin=True)
    with bounded_test_client(create_app(Settings(database_url=url))) as http:
        yield Client(http, {"Authorization": f"Bearer {admin}"}, {"Authorization": f"Bearer {platform}"})


@pytest.mark.parametrize("path", ["/v1/admin/catalog/offers", "/v1/platform/catalog/offers"])
def test_a_spot_price_above_on_demand_is_a_422_naming_its_row(client: Client, path: str) -> None:
    headers = client.platform if "platform" in path else client.admin
    csv = (
        "provider,gpu,on_demand_usd_per_hour,spot_usd_per_hour,region\n"
        "newco,H100,3.50,2.10,eu\n"  # row 1: fine
        "newco,L4,0.50,0.65,eu\n"  # row 2: spot above on demand
    )
    response = client.http.post(path, content=csv, headers=headers)
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["field"] == "price_list" and "nothing was imported" in body["message"]
    assert [d for d in body["details"] if d.startswith("row 2: spot_usd_per_hour: 0.65 is above")] == body["details"]
    as_json = '[{"provider": "newco", "gpu": "L4", "on_demand_usd_per_hour": 0.5, "spot_usd_per_hour": 0.51}]'
    response = client.http.post(path, content=as_json, headers={**headers, **JSON})
    assert response.status_code == 422 and response.json()["details"][0].startswith("row 1: spot_usd_per_hour:")
    assert client.offers("newco") == []

    good = "provider,gpu,on_demand_usd_per_hour,spot_usd_per_hour,region\nnewco,L4,0.50,0.50,eu\n"
    assert client.http.post(path, content=good, headers=headers).status_code == 201
    assert [(o["on_demand_usd_per_hour"], o["spot_usd_per_hour"]) for o in client.offers("newco")] == [(0.5, 0.5)]


def test_the_feed_state_shows_its_note(client: Client, tmp_path: Path) -> None:
    """docs/catalog.md: GET /v1/catalog/feeds gives a `note` naming the offers a refresh skipped; it was not in the
    answer, so an operator could not see which cards or spot prices a feed left out."""
    note = "skipped offers of cards gpuplan has no spec for: GTX 1070"
    rows = [{"provider": "vast", "gpu": "RTX 4090", "on_demand_usd_per_hour": 0.35, "fetched_at": "2026-12-01"}]
    with unit_of_work(make_sessionmaker(make_engine(f"sqlite:///{tmp_path / 'gpuplan.db'}"))) as session:
        record_feed_success(session, "vast", rows, datetime(2026, 12, 1, tzinfo=UTC), note)
    response = client.http.get("/v1/catalog/feeds", headers=client.admin)
    assert response.status_code == 200, response.text
    assert [(f["provider"], f["ok"], f["offers"], f["note"]) for f in response.json()["items"]] == [
        ("vast", True, 1, note)
    ]


def test_a_region_in_another_case_updates_the_offer_instead_of_adding_a_twin(client: Client) -> None:
    """Re-importing 'tw,L4,1,0.40,EU' over 'eu' at $0.50 added a second offer: the planner and the quote read regions
    in any case, so the plan ranked both and its own recommendation's quote answered 409 ("$0.5000 then, $0.4000
    now") with no price changed since the plan."""
    header = "provider,gpu,gpus_per_node,on_demand_usd_per_hour,region\n"
    first = client.http.post(
        "/v1/platform/catalog/offers", content=header + "tw,L4,1,0.50,eu\n", headers=client.platform
    )
    assert first.status_code == 201, first.text
    again = client.http.post(
        "/v1/platform/catalog/offers", content=header + "tw,L4,1,0.40,EU\n", headers=client.platform
    )
    assert again.status_code == 201, again.text
    assert (again.json()["added"], again.json()["updated"]) == (0, 1)
    assert [(o["region"], o["on_demand_usd_per_hour"]) for o in client.offers("tw")] == [("EU", 0.4)]

    twins = header + "tw,L4,1,0.30,us\ntw,L4,1,0.35,US\n"
    response = client.http.post("/v1/platform/catalog/offers", content=twins, headers=client.platform)
    assert response.status_code == 422, response.text
    assert response.json()["details"][0].startswith("row 2: duplicate offer for tw L4 x1 region 'US'")
    assert [(o["region"], o["on_demand_usd_per_hour"]) for o in client.offers("tw")] == [("EU", 0.4)]
