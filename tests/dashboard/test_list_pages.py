"""The dashboard's list pages (catalog, quotes, runs, data sets) through a signed-in client: each shows the
organization's own rows, the catalog filters by card, provider, memory, price and spot, and bad filters
are a 422 page."""

from __future__ import annotations

from fastapi.testclient import TestClient

from services.core.db import make_engine, make_sessionmaker, unit_of_work
from services.datasets.tables import DatasetRow
from services.orgs.repository import OrganizationRepository
from tests.api.conftest import Api
from tests.dashboard.conftest import submit_done_plan


def test_the_catalog_lists_offers_by_card_with_their_price_age_and_source(api: Api, alpha: TestClient) -> None:
    page = alpha.get("/dashboard/catalog")
    assert page.status_code == 200
    offers = api.client.get("/v1/catalog/offers", headers=api.headers()).json()["items"]
    assert f"{len(offers)} offer(s)" in page.text
    for offer in offers[:5]:
        assert offer["provider"] in page.text and offer["fetched_at"] in page.text
    assert "stale" in page.text  # the bundled prices are older than a day
    h100 = alpha.get("/dashboard/catalog", params={"gpu": "H100 SXM"}).text
    wanted = [o for o in offers if o["gpu"] == "H100 SXM"]
    assert f"{len(wanted)} offer(s) of 1 card(s)" in h100
    spot = alpha.get("/dashboard/catalog", params={"spot": "true", "max_usd_per_hour": "2"}).text
    cheap_spot = [o for o in offers if o["spot_usd_per_hour"] is not None and o["on_demand_usd_per_hour"] <= 2]
    assert f"{len(cheap_spot)} offer(s)" in spot
    bad = alpha.get("/dashboard/catalog", params={"max_usd_per_hour": "-1"})
    assert bad.status_code == 422 and "<html" in bad.text


def test_quotes_runs_and_data_sets_list_the_organizations_own(api: Api, alpha: TestClient, beta: TestClient) -> None:
    plan = submit_done_plan(api)
    quote = api.client.post(
        f"/v1/plans/{plan['id']}/quotes",
        json={"gpu": "A40", "gpus": 1, "customer_name": "Acme Labs"},
        headers=api.headers(),
    )
    assert quote.status_code == 201, quote.text
    node = api.client.post("/v1/nodes", json={"name": "g1", "gpu": "A40"}, headers=api.headers()).json()["id"]
    run = api.client.post(
        f"/v1/plans/{plan['id']}/runs",
        json={"node_ids": [node], "checkpoint_dir": "/data/out", "bucket": "runs-bucket"},
        headers=api.headers(),
    )
    assert run.status_code == 201, run.text
    # A checked data set, stored as the check leaves it (the upload route needs a bucket this app has not).
    with unit_of_work(make_sessionmaker(make_engine(api.url))) as session:
        org = OrganizationRepository(session).by_name("alpha")
        assert org is not None
        session.add(
            DatasetRow(
                organization_id=org.id,
                name="train.jsonl",
                file_format="jsonl",
                size_bytes=1_234_567,
                status="done",
                bucket="b",
                object_key="k",
                part_size_bytes=8 * 2**20,
                report={"rows_total": 4321, "tokens": {"p50_tokens": 180, "p90_tokens": 410}, "pii_findings_total": 0},
            )
        )
    quotes = alpha.get("/dashboard/quotes").text
    assert quote.json()["number"] in quotes and "Acme Labs" in quotes and "1 x A40" in quotes
    runs = alpha.get("/dashboard/runs").text
    assert run.json()["id"][:8] in runs and "s3://runs-bucket/" in runs and "none yet" in runs
    datasets = alpha.get("/dashboard/datasets").text
    assert "train.jsonl" in datasets and "4,321" in datasets and "median 180, p90 410" in datasets
    assert "1.2 MB" in datasets and "none found" in datasets
    for path in ("/dashboard/quotes", "/dashboard/runs", "/dashboard/datasets"):
        other = beta.get(path).text
        assert quote.json()["number"] not in other and run.json()["id"][:8] not in other and "train.jsonl" not in other
    assert alpha.get("/dashboard/runs", params={"before": "nope"}).status_code == 422


def test_a_bad_filter_or_cursor_is_a_page_naming_the_parameter_and_what_was_sent(alpha: TestClient) -> None:
    for path, params, name in (
        ("/dashboard/catalog", {"min_memory_gib": "lots"}, "min_memory_gib"),
        ("/dashboard/catalog", {"spot": "maybe"}, "spot"),
        ("/dashboard/quotes", {"before": "<b>x</b>"}, "before"),
        ("/dashboard/plans", {"before": "nope"}, "before"),
    ):
        page = alpha.get(path, params=params)
        assert page.status_code == 422 and page.headers["content-type"].startswith("text/html")
        message = page.text.split('role="alert">', 1)[1].split("</p>", 1)[0]
        sent = params[name].replace("<", "&lt;").replace(">", "&gt;")
        assert message.startswith(f"{name}: ") and sent in message, message
        assert "<title>Invalid request" in page.text
