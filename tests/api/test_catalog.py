from __future__ import annotations

from tests.api.conftest import Api


def test_offers_are_seeded_from_both_price_lists(api: Api) -> None:
    items = api.client.get("/v1/catalog/offers", headers=api.headers()).json()["items"]
    providers = {i["provider"] for i in items}
    assert providers == {"cloudrux", "example-cloud"}
    assert len([i for i in items if i["provider"] == "cloudrux"]) == 9
    a40 = next(i for i in items if i["gpu"] == "A40")
    assert a40["on_demand_usd_per_hour"] == 0.74 and a40["gpu_memory_gib"] > 40


def test_offer_filters(api: Api) -> None:
    spot = api.client.get("/v1/catalog/offers?spot=true", headers=api.headers()).json()["items"]
    assert spot and all(i["spot_usd_per_hour"] for i in spot)
    big = api.client.get("/v1/catalog/offers?min_memory_gib=100", headers=api.headers()).json()["items"]
    assert {i["gpu"] for i in big} == {"H200", "B200"}
    cheap = api.client.get("/v1/catalog/offers?max_usd_per_hour=1", headers=api.headers()).json()["items"]
    assert all(i["on_demand_usd_per_hour"] <= 1 for i in cheap)
    assert api.client.get("/v1/catalog/offers?min_memory_gib=-1", headers=api.headers()).status_code == 422


def test_import_needs_an_admin_key(api: Api) -> None:
    csv = "provider,gpu,on_demand_usd_per_hour\nnewco,H100,3.5\n"
    response = api.client.post("/v1/admin/catalog/offers", content=csv, headers=api.headers("alpha"))
    assert response.status_code == 403


def test_import_rejects_the_whole_file_with_row_numbers(api: Api) -> None:
    before = api.client.get("/v1/catalog/offers", headers=api.headers()).json()["items"]
    csv = (
        "provider,gpu,on_demand_usd_per_hour,spot_usd_per_hour\n"
        "newco,H100,3.5,\nnewco,Voodoo 5,1.0,\nnewco,A100 80GB,-2,\n"
    )
    response = api.client.post("/v1/admin/catalog/offers", content=csv, headers=api.headers("admin"))
    assert response.status_code == 422
    details = response.json()["details"]
    assert any(d.startswith("row 2: gpu:") for d in details)
    assert any(d.startswith("row 3: on_demand_usd_per_hour:") for d in details)
    after = api.client.get("/v1/catalog/offers", headers=api.headers()).json()["items"]
    assert after == before


def test_import_replaces_the_active_price_list(api: Api) -> None:
    payload = '[{"provider": "newco", "gpu": "h100", "on_demand_usd_per_hour": 3.5, "spot_usd_per_hour": 1.5}]'
    response = api.client.post(
        "/v1/admin/catalog/offers",
        content=payload,
        headers={**api.headers("admin"), "Content-Type": "application/json"},
    )
    assert response.status_code == 201, response.text
    items = api.client.get("/v1/catalog/offers", headers=api.headers()).json()["items"]
    assert [(i["provider"], i["gpu"]) for i in items] == [("newco", "H100 SXM")]


def test_import_of_malformed_csv_is_422_not_500(api: Api) -> None:
    bad = 'provider,gpu,on_demand_usd_per_hour\n"newco,H100,3.5\rstill quoted\n'
    response = api.client.post("/v1/admin/catalog/offers", content=bad, headers=api.headers("admin"))
    assert response.status_code == 422, response.text
