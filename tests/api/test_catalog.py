"""The catalog through the real app: the public price list, organizations' own prices over it, additive
imports, whole-file rejection, export, and who may change what (issue 12 item 6, issue 15 item 7)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from services.catalog.offers import bundled_offers
from services.catalog.service import record_feed_failure
from services.core.db import make_engine, make_sessionmaker, unit_of_work
from services.orgs.service import create_key
from tests.api.conftest import QLORA_PLAN, Api

JSON = {"Content-Type": "application/json"}


def _offers(api: Api, org: str = "alpha", query: str = "") -> list[dict[str, Any]]:
    response = api.client.get(f"/v1/catalog/offers{query}", headers=api.headers(org))
    assert response.status_code == 200, response.text
    items: list[dict[str, Any]] = response.json()["items"]
    return items


def _key(api: Api, org: str, **kind: bool) -> str:
    factory = make_sessionmaker(make_engine(api.url))
    with unit_of_work(factory) as session:
        return create_key(session, org, **kind)


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_offers_are_seeded_from_both_price_lists(api: Api) -> None:
    items = _offers(api)
    providers = {i["provider"] for i in items}
    assert providers == {o.provider for o in bundled_offers()}
    assert {"cloudrux", "aws", "gcp", "azure", "lambda", "runpod", "vast"} <= providers
    assert len(items) == len(bundled_offers())
    assert len([i for i in items if i["provider"] == "cloudrux"]) == 9
    a40 = next(i for i in items if (i["provider"], i["gpu"]) == ("cloudrux", "A40"))
    assert a40["on_demand_usd_per_hour"] == 0.74 and a40["gpu_memory_gib"] > 40
    assert {i["catalog"] for i in items} == {"public"}
    assert all(i["billing_increment_s"] >= 1 and i["billing_minimum_s"] >= 0 for i in items)
    # Host RAM per node: AWS's nodes have it (p5.48xlarge: 2048 GiB); cloudrux's is unknown.
    ram = {(i["provider"], i["gpu"]): i["host_ram_gib_per_node"] for i in items}
    assert ram[("aws", "H100 SXM")] == 2048 and ram[("cloudrux", "H100 SXM")] is None


def test_offer_filters(api: Api) -> None:
    spot = _offers(api, query="?spot=true")
    assert spot and all(i["spot_usd_per_hour"] for i in spot)
    big = _offers(api, query="?min_memory_gib=100")
    assert {i["gpu"] for i in big} == {"H200", "B200"}
    cheap = _offers(api, query="?max_usd_per_hour=1")
    assert all(i["on_demand_usd_per_hour"] <= 1 for i in cheap)
    assert api.client.get("/v1/catalog/offers?min_memory_gib=-1", headers=api.headers()).status_code == 422
    assert api.client.get("/v1/catalog/offers?format=xml", headers=api.headers()).status_code == 422


def test_import_needs_an_admin_key(api: Api) -> None:
    csv = "provider,gpu,on_demand_usd_per_hour\nnewco,H100,3.5\n"
    response = api.client.post("/v1/admin/catalog/offers", content=csv, headers=api.headers("alpha"))
    assert response.status_code == 403


def test_import_rejects_the_whole_file_naming_row_and_field(api: Api) -> None:
    before = _offers(api)
    csv = (
        "provider,gpu,on_demand_usd_per_hour,spot_usd_per_hour,region\n"
        "newco,H100,3.5,,eu\n"  # row 1: fine on its own
        "newco,Voodoo 5,1.0,,eu\n"  # row 2: unknown card
        "newco,A100 80GB,-2,,eu\n"  # row 3: negative price
        "newco,h100-sxm5-80gb,3.6,,eu\n"  # row 4: the same offer as row 1
        'newco,L4,0.5,,=HYPERLINK("http://x")\n'  # row 5: a formula cell
        "@cmd,L4,0.5,,eu\n"  # row 6: a formula cell
        "newco,L40S,1.2,+1,eu\n"  # row 7: a formula-looking number
    )
    for path in ("/v1/admin/catalog/offers", "/v1/platform/catalog/offers"):
        key = api.keys["admin"] if path.startswith("/v1/admin") else _key(api, "alpha", platform_admin=True)
        response = api.client.post(path, content=csv, headers=_bearer(key))
        assert response.status_code == 422, response.text
        body = response.json()
        assert body["field"] == "price_list" and "nothing was imported" in body["message"]
        details = body["details"]
        assert any(d.startswith("row 2: gpu: unknown GPU") for d in details), details
        assert any(d.startswith("row 3: on_demand_usd_per_hour:") for d in details), details
        assert any(d.startswith("row 4: duplicate offer") and "row 1" in d for d in details), details
        assert any(d.startswith("row 5: region: looks like a spreadsheet formula") for d in details), details
        assert any(d.startswith("row 6: provider: looks like a spreadsheet formula") for d in details), details
        assert any(d.startswith("row 7: spot_usd_per_hour: looks like a spreadsheet formula") for d in details)
        assert not any(d.startswith("row 1") for d in details)

    def by_key(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return sorted(items, key=lambda i: (i["provider"], i["gpu"], i["region"]))

    assert by_key(_offers(api)) == by_key(before)


def test_host_ram_imports_and_a_bad_value_rejects_the_whole_file(api: Api) -> None:
    before = _offers(api)
    bad = (
        "provider,gpu,on_demand_usd_per_hour,host_ram_gib_per_node\n"
        "newco,H100,3.5,2048\n"  # row 1: fine
        "newco,L4,0.5,-64\n"  # row 2: not positive
        "newco,A40,0.7,=64*2\n"  # row 3: a formula
        "newco,L40S,1.2,1e9\n"  # row 4: more than any server
    )
    response = api.client.post("/v1/admin/catalog/offers", content=bad, headers=_bearer(api.keys["admin"]))
    assert response.status_code == 422, response.text
    details = response.json()["details"]
    assert any(d.startswith("row 2: host_ram_gib_per_node: input should be greater than 0") for d in details)
    assert any(d.startswith("row 3: host_ram_gib_per_node: looks like a spreadsheet formula") for d in details)
    assert any(d.startswith("row 4: host_ram_gib_per_node: input should be less than or equal to") for d in details)
    assert not any(d.startswith("row 1") for d in details)
    assert len(_offers(api)) == len(before)  # nothing half-imported

    good = "provider,gpu,on_demand_usd_per_hour,host_ram_gib_per_node\nnewco,H100,3.5,2048\nnewco,L4,0.5,\n"
    response = api.client.post("/v1/admin/catalog/offers", content=good, headers=_bearer(api.keys["admin"]))
    assert response.status_code == 201, response.text
    ram = {i["gpu"]: i["host_ram_gib_per_node"] for i in _offers(api, query="?provider=newco")}
    assert ram == {"H100 SXM": 2048.0, "L4": None}
    exported = api.client.get("/v1/catalog/offers?format=csv&provider=newco", headers=api.headers()).text
    assert exported.splitlines()[0].endswith(",host_ram_gib_per_node")


def test_public_import_is_additive_and_replace_provider_is_explicit(api: Api) -> None:
    platform = _bearer(_key(api, "alpha", platform_admin=True))
    payload = (
        '[{"provider": "newco", "gpu": "h100", "on_demand_usd_per_hour": 3.5, "spot_usd_per_hour": 1.5,'
        ' "gpus_per_node": 8, "whole_nodes_only": true, "inter_node_gbit_per_s": 3200, "billing_increment_s": 60,'
        ' "billing_minimum_s": 600, "startup_s": 300, "download_gbit_per_s": 10, "preemption_per_hour": 0.05,'
        ' "fetched_at": "2026-11-30T10:00:00Z"}]'
    )
    response = api.client.post("/v1/platform/catalog/offers", content=payload, headers={**platform, **JSON})
    assert response.status_code == 201, response.text
    bundled = bundled_offers()
    assert response.json()["added"] == 1 and response.json()["kept"] == len(bundled)
    items = _offers(api, "beta")
    assert {i["provider"] for i in items} == {o.provider for o in bundled} | {"newco"}
    newco = next(i for i in items if i["provider"] == "newco")
    assert newco["gpu"] == "H100 SXM" and newco["whole_nodes_only"] is True and newco["billing_minimum_s"] == 600
    assert newco["inter_node_gbit_per_s"] == 3200 and newco["fetched_at"] == "2026-11-30T10:00:00Z"

    # One provider's row again: its price is updated, every other offer stays.
    csv = "provider,gpu,on_demand_usd_per_hour,region,gpus_per_node\ncloudrux,A40,0.70,partner-dc,8\n"
    body = api.client.post("/v1/platform/catalog/offers", content=csv, headers=platform).json()
    assert (body["updated"], body["added"], body["kept"]) == (1, 0, len(bundled))
    items = _offers(api)
    assert len(items) == len(bundled) + 1
    assert next(i for i in items if (i["provider"], i["gpu"]) == ("cloudrux", "A40"))["on_demand_usd_per_hour"] == 0.70

    # --replace-provider drops the provider's other rows.
    response = api.client.post("/v1/platform/catalog/offers?replace_provider=cloudrux", content=csv, headers=platform)
    assert response.status_code == 201 and response.json()["removed"] == 8
    assert [i["gpu"] for i in _offers(api) if i["provider"] == "cloudrux"] == ["A40"]
    assert len([i for i in _offers(api) if i["provider"] == "aws"]) == len([o for o in bundled if o.provider == "aws"])

    unknown = api.client.post("/v1/platform/catalog/offers?replace_provider=nobody", content=csv, headers=platform)
    assert unknown.status_code == 422 and unknown.json()["field"] == "replace_provider"


def test_an_organization_admin_cannot_change_the_public_catalog(api: Api) -> None:
    csv = "provider,gpu,on_demand_usd_per_hour\nnewco,H100,0.01\n"
    for key in (api.keys["admin"], api.keys["alpha"]):
        response = api.client.post("/v1/platform/catalog/offers", content=csv, headers=_bearer(key))
        assert response.status_code == 403, response.text
    assert "newco" not in {i["provider"] for i in _offers(api, "beta")}


def test_the_embedded_defaults_local_key_has_no_platform_rights(
    api: Api, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from services.cli.server import _local_key
    from services.core.settings import Settings

    monkeypatch.chdir(tmp_path)
    key = _local_key(Settings(database_url=api.url))
    assert key is not None
    csv = "provider,gpu,on_demand_usd_per_hour\nlocal-dc,L4,0.2\n"
    assert api.client.post("/v1/platform/catalog/offers", content=csv, headers=_bearer(key)).status_code == 403
    own = api.client.post("/v1/admin/catalog/offers", content=csv, headers=_bearer(key))
    assert own.status_code == 201 and own.json()["catalog"] == "organization"
    assert "local-dc" not in {i["provider"] for i in _offers(api, "beta")}


def _top_setup(api: Api, org: str) -> dict[str, Any]:
    plan_id = api.client.post("/v1/plans", json=QLORA_PLAN, headers=api.headers(org)).json()["id"]
    body = api.wait_for_plan(plan_id, org)
    assert body["status"] == "done", body
    rec: dict[str, Any] = body["recommendations"][0]
    return rec


def test_an_organizations_own_prices_are_invisible_to_others_and_do_not_change_their_plans(api: Api) -> None:
    beta_before = _top_setup(api, "beta")
    beta_offers = _offers(api, "beta")
    # Alpha negotiated a very low price for H100 at cloudrux and has a private provider.
    csv = (
        "provider,gpu,on_demand_usd_per_hour,region,source,gpus_per_node\n"
        "cloudrux,H100 SXM,0.05,partner-dc,contract 2026-17,8\n"
        "alpha-dc,A100 80GB,0.04,basement,own cluster,1\n"
    )
    response = api.client.post("/v1/admin/catalog/offers", content=csv, headers=api.headers("admin"))
    assert response.status_code == 201, response.text
    assert response.json()["catalog"] == "organization"

    alpha = _offers(api, "alpha")
    own = {(i["provider"], i["gpu"]): i for i in alpha if i["catalog"] == "organization"}
    assert set(own) == {("cloudrux", "H100 SXM"), ("alpha-dc", "A100 80GB")}
    # The own H100 price replaces the public one for alpha: one cloudrux H100 offer, at the own price.
    assert [i["on_demand_usd_per_hour"] for i in alpha if (i["provider"], i["gpu"]) == ("cloudrux", "H100 SXM")] == [
        0.05
    ]
    assert len(alpha) == len(bundled_offers()) + 1

    assert _offers(api, "beta") == beta_offers
    beta_after = _top_setup(api, "beta")
    assert (beta_after["provider"], beta_after["gpu"], beta_after["cost_usd"]) == (
        beta_before["provider"],
        beta_before["gpu"],
        beta_before["cost_usd"],
    )
    alpha_top = _top_setup(api, "alpha")
    assert alpha_top["provider"] in {"cloudrux", "alpha-dc"} and alpha_top["cost_usd"] < beta_after["cost_usd"]


def test_offers_export_as_a_price_list_that_imports_back(api: Api) -> None:
    response = api.client.get("/v1/catalog/offers?format=csv", headers=api.headers())
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/csv")
    text = response.text
    assert text.splitlines()[0].startswith("provider,gpu,gpus_per_node,on_demand_usd_per_hour")
    platform = _bearer(_key(api, "beta", platform_admin=True))
    before = _offers(api)
    again = api.client.post("/v1/platform/catalog/offers", content=text, headers=platform)
    assert again.status_code == 201, again.text
    assert (again.json()["updated"], again.json()["added"], again.json()["kept"]) == (len(bundled_offers()), 0, 0)

    def by_key(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return sorted(items, key=lambda i: (i["provider"], i["gpu"], i["region"]))

    assert by_key(_offers(api)) == by_key(before)


def test_feed_state_shows_the_last_error(api: Api) -> None:
    assert api.client.get("/v1/catalog/feeds", headers=api.headers()).json() == {"items": []}
    factory = make_sessionmaker(make_engine(api.url))
    with unit_of_work(factory) as session:
        record_feed_failure(session, "runpod", "HTTP 503 from the RunPod API", datetime.now(UTC))
    items = api.client.get("/v1/catalog/feeds", headers=api.headers("beta")).json()["items"]
    assert [(i["provider"], i["ok"], i["last_error"]) for i in items] == [
        ("runpod", False, "HTTP 503 from the RunPod API")
    ]
    assert api.client.get("/v1/catalog/feeds").status_code == 401


def test_import_of_malformed_csv_is_422_not_500(api: Api) -> None:
    bad = 'provider,gpu,on_demand_usd_per_hour\n"newco,H100,3.5\rstill quoted\n'
    response = api.client.post("/v1/admin/catalog/offers", content=bad, headers=api.headers("admin"))
    assert response.status_code == 422, response.text


def test_removing_a_providers_offers(api: Api) -> None:
    csv = "provider,gpu,on_demand_usd_per_hour,region\ncloudrux,A40,0.01,partner-dc\nown,L4,0.02,lab\n"
    assert api.client.post("/v1/admin/catalog/offers", content=csv, headers=api.headers("admin")).status_code == 201
    removed = api.client.delete("/v1/admin/catalog/offers?provider=cloudrux", headers=api.headers("admin"))
    assert removed.status_code == 200 and removed.json()["removed"] == 1, removed.text
    alpha = {(i["provider"], i["gpu"]): i for i in _offers(api)}
    assert alpha[("cloudrux", "A40")]["on_demand_usd_per_hour"] == 0.74  # the public offer again
    assert alpha[("own", "L4")]["catalog"] == "organization"
    assert api.client.delete("/v1/admin/catalog/offers?provider=own", headers=api.headers("alpha")).status_code == 403
    unknown = api.client.delete("/v1/admin/catalog/offers?provider=nobody", headers=api.headers("admin"))
    assert unknown.status_code == 422 and unknown.json()["field"] == "provider"
    assert api.client.delete("/v1/admin/catalog/offers", headers=api.headers("admin")).status_code == 422

    for key in (api.keys["admin"], api.keys["beta"]):
        denied = api.client.delete("/v1/platform/catalog/offers?provider=cloudrux", headers=_bearer(key))
        assert denied.status_code == 403
    platform = _bearer(_key(api, "beta", platform_admin=True))
    gone = api.client.delete("/v1/platform/catalog/offers?provider=aws", headers=platform)
    aws = [o for o in bundled_offers() if o.provider == "aws"]
    assert gone.status_code == 200 and gone.json()["removed"] == len(aws) > 0
    assert {i["provider"] for i in _offers(api, "beta")} == {o.provider for o in bundled_offers()} - {"aws"}


def test_concurrent_imports_never_lose_one_another(api: Api) -> None:
    """Two imports at once: the second waits for the first and builds on it (no lost provider)."""
    import threading
    import time

    from services.catalog.pricelist import parse_price_list
    from services.catalog.service import import_offers

    factory = make_sessionmaker(make_engine(api.url))
    first_has_read = threading.Event()
    errors: list[BaseException] = []

    def first() -> None:
        try:
            with unit_of_work(factory) as session:
                import_offers(
                    session, parse_price_list("provider,gpu,on_demand_usd_per_hour\none,L4,1\n", "csv"), source="a"
                )
                first_has_read.set()
                time.sleep(0.5)  # still uncommitted while the second import starts
        except Exception as exc:  # reported by the assertion below
            errors.append(exc)
            first_has_read.set()

    thread = threading.Thread(target=first)
    thread.start()
    first_has_read.wait(10)
    with unit_of_work(factory) as session:
        import_offers(session, parse_price_list("provider,gpu,on_demand_usd_per_hour\ntwo,L4,1\n", "csv"), source="b")
    thread.join(10)
    assert errors == []
    assert {"one", "two"} <= {i["provider"] for i in _offers(api)}


def test_a_card_gpuplan_has_no_spec_for_is_refused_not_taken_for_a_similar_name(api: Api) -> None:
    """A probe of stop 53: a price list row for an "H20" (96 GB, a sixth of an H200's compute) was stored and planned
    as an H200 (141 GB), its prefix; a node reporting "NVIDIA H20" registered as one. Both are refused, naming the
    field, and a card the name does mean (a form factor written after it) is still taken."""
    header = "provider,gpu,gpus_per_node,on_demand_usd_per_hour,region,source\n"
    response = api.client.post(
        "/v1/admin/catalog/offers", content=header + "cn-cloud,H20,8,0.90,bj,t\n", headers=api.headers("admin")
    )
    assert response.status_code == 422, response.text
    assert "row 1: gpu: unknown GPU 'H20'" in response.text, response.text
    assert not any(o["provider"] == "cn-cloud" for o in _offers(api))
    ok = api.client.post(
        "/v1/admin/catalog/offers",
        content=header + "cn-cloud,H100 (80 GB PCIe),1,2.10,bj,t\n",
        headers=api.headers("admin"),
    )
    assert ok.status_code == 201, ok.text
    assert [o["gpu"] for o in _offers(api) if o["provider"] == "cn-cloud"] == ["H100 PCIe"]
    node = api.client.post("/v1/nodes", json={"name": "box-h20", "gpu": "NVIDIA H20"}, headers=api.headers())
    assert node.status_code == 422, node.text
    assert "gpu" in node.text and "unknown GPU 'NVIDIA H20'" in node.text, node.text


def test_a_price_list_row_naming_a_card_without_the_memory_that_tells_it_apart_is_refused(api: Api) -> None:
    """A probe of stop 53: a row for an "A100" was planned as the A100 80GB, so a provider's 40 GB A100s were
    recommended for plans that need more than 40 GB. Where the name's card is not the smallest of its model, the row
    is refused naming both; where it is (a "V100" is the 16 GB one) or the memory is named, it is taken."""
    header = "provider,gpu,gpus_per_node,on_demand_usd_per_hour,region,source\n"
    for gpu in ("A100", "Tesla A100"):
        response = api.client.post(
            "/v1/admin/catalog/offers", content=header + f"dc,{gpu},8,1.10,eu,t\n", headers=api.headers("admin")
        )
        assert response.status_code == 422, response.text
        assert "could be the A100 40GB or the A100 80GB" in response.text, response.text
    rows = "dc,A100 40G,8,1.10,eu,t\ndc,A100-80GB,8,1.60,eu,t\ndc,V100,8,0.40,eu,t\n"
    ok = api.client.post("/v1/admin/catalog/offers", content=header + rows, headers=api.headers("admin"))
    assert ok.status_code == 201, ok.text
    assert sorted(o["gpu"] for o in _offers(api) if o["provider"] == "dc") == ["A100 40GB", "A100 80GB", "V100 16GB"]


def test_a_time_before_year_one_in_utc_is_a_422_naming_the_row_not_a_500(api: Api) -> None:
    """An input probe of stop 53: fetched_at 0001-01-01T00:00:00+14:00 is before year 1 once in UTC, and the
    conversion's OverflowError answered 500."""
    csv = "provider,gpu,on_demand_usd_per_hour,fetched_at\nnewco,L4,0.5,0001-01-01T00:00:00+14:00\n"
    response = api.client.post("/v1/admin/catalog/offers", content=csv, headers=api.headers("admin"))
    assert response.status_code == 422, response.text
    assert "row 1: fetched_at" in response.text
