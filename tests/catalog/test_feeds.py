"""Live price feeds: each provider's parser on generated responses shaped as its API documents them, and
the refresh end to end against a loopback fake (RunPod, Lambda, Vast) and moto's server plus a Price List
fake (AWS), over a migrated database. Nothing reaches the internet."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from services.catalog.feeds import aws, lambda_cloud, runpod, vast
from services.catalog.feeds.base import FeedError
from services.catalog.feeds.refresh import refresh
from services.catalog.offers import bundled_offers
from services.catalog.service import catalog_offers, feed_states
from services.core.db import make_engine, make_sessionmaker, unit_of_work
from services.core.settings import Settings
from tests.catalog.fakes import FakeProviders, aws_product, fake_providers, response
from tests.databases import migrate

WHEN = "2026-12-01T01:00:00Z"
TOKEN = "rp-SECRET-token-0123456789"


def test_runpod_rows_per_card_and_cloud() -> None:
    out = runpod.parse_gpu_types(response("runpod_gpu_types.json"), WHEN)
    rows = {(r["gpu"], r["region"]): r for r in out.rows}
    assert set(rows) == {
        ("H100 SXM", "secure-cloud"),
        ("H100 SXM", "community-cloud"),
        ("A40", "secure-cloud"),
        ("RTX 4090", "secure-cloud"),
        ("RTX 4090", "community-cloud"),
    }
    h100 = rows[("H100 SXM", "secure-cloud")]
    assert (h100["on_demand_usd_per_hour"], h100["spot_usd_per_hour"], h100["gpus_per_node"]) == (2.99, 1.75, 8)
    assert rows[("H100 SXM", "community-cloud")]["spot_usd_per_hour"] is None
    assert rows[("A40", "secure-cloud")]["gpus_per_node"] == 10
    assert all(r["fetched_at"] == WHEN and r["billing_increment_s"] == 1 for r in out.rows)
    assert out.skipped == {"NVIDIA GeForce GTX 1080 Ti", "unknown"}


def test_runpod_graphql_errors_are_a_feed_error() -> None:
    with pytest.raises(FeedError, match="answered with errors: not authorized"):
        runpod.parse_gpu_types({"errors": [{"message": "not authorized"}]}, WHEN)
    with pytest.raises(FeedError, match=r"no data\.gpuTypes"):
        runpod.parse_gpu_types({"data": {}}, WHEN)


def test_lambda_rows_are_per_gpu_whole_instances_billed_per_minute() -> None:
    out = lambda_cloud.parse_instance_types(response("lambda_instance_types.json"), WHEN)
    rows = {(r["gpu"], r["gpus_per_node"]): r for r in out.rows}
    assert set(rows) == {("H100 SXM", 8), ("A10", 1), ("A100 40GB", 1)}
    h100 = rows[("H100 SXM", 8)]
    assert h100["on_demand_usd_per_hour"] == 2.99 and h100["whole_nodes_only"] is True
    assert h100["billing_increment_s"] == 60 and h100["interconnect"] == "NVSwitch"
    assert "capacity now in us-east-1" in h100["source"]
    assert rows[("A100 40GB", 1)]["on_demand_usd_per_hour"] == 1.29  # two instance types, one offer key
    # specs.memory_gib is the instance's host RAM.
    assert (h100["host_ram_gib_per_node"], rows[("A10", 1)]["host_ram_gib_per_node"]) == (1800.0, 200.0)
    assert out.skipped == {"gpu_1x_rtx6000"}


def test_vast_keeps_the_cheapest_per_card_count_and_country() -> None:
    out = vast.parse_bundles(response("vast_bundles.json"), WHEN)
    rows = {(r["gpu"], r["gpus_per_node"], r["country"]): r for r in out.rows}
    assert set(rows) == {
        ("RTX 4090", 1, "US"),
        ("RTX 4090", 1, "CA"),
        ("H100 SXM", 8, "SE"),
        ("A100 40GB", 2, "CA"),
        ("A100 80GB", 1, ""),
    }
    us = rows[("RTX 4090", 1, "US")]
    assert (us["on_demand_usd_per_hour"], us["spot_usd_per_hour"], us["download_gbit_per_s"]) == (0.38, 0.22, 2.0)
    h100 = rows[("H100 SXM", 8, "SE")]
    assert (h100["on_demand_usd_per_hour"], h100["spot_usd_per_hour"], h100["interconnect"]) == (2.2, 1.2, "NVLink")
    assert rows[("A100 40GB", 2, "CA")]["spot_usd_per_hour"] is None
    # cpu_ram is MB (read as 10^6 bytes); 0 or absent is unknown, not a failed refresh.
    assert us["host_ram_gib_per_node"] == 120.0 and h100["host_ram_gib_per_node"] == 1922.2
    assert rows[("A100 80GB", 1, "")]["host_ram_gib_per_node"] is None
    assert out.skipped == {"GTX 1070"}


def test_vast_tells_memory_variants_apart_and_skips_an_offer_with_less_memory_than_its_card() -> None:
    """Vast names the 16 and 32 GB V100 alike, as it does the A100s: a 32 GB V100 was planned as the 16 GB card.
    And an offer reporting less memory than the card its name maps to (an "H100 NVL" with 80 GB) is not planned
    on 93.6 GiB it does not have."""

    def offer(offer_id: int, name: str, gpu_ram: int) -> dict[str, Any]:
        return {"id": offer_id, "gpu_name": name, "num_gpus": 1, "gpu_ram": gpu_ram, "dph_total": 0.5}

    payload = {
        "offers": [
            offer(1, "Tesla V100", 32510),
            offer(2, "Tesla V100", 16160),
            offer(3, "A100 SXM4", 40960),
            offer(4, "H100 NVL", 81559),
            offer(5, "H100 NVL", 95830),
        ]
    }
    out = vast.parse_bundles(payload, WHEN)
    assert sorted(r["gpu"] for r in out.rows) == ["A100 40GB", "H100 NVL", "V100 16GB", "V100 32GB"]
    assert out.skipped == {"H100 NVL (80 GiB)"}
    assert out.note() == "skipped offers of cards gpuplan has no spec for: H100 NVL (80 GiB)"


def test_aws_rows_join_on_demand_and_spot_per_instance_type() -> None:
    products = [
        aws_product("p5.48xlarge", "us-east-1", 98.32, memory="2048 GiB"),
        aws_product("p5.48xlarge", "us-east-1", 120.0, os="Windows"),
        aws_product("g5.xlarge", "us-east-1", 1.006, memory="not listed"),
        aws_product("g5.2xlarge", "us-east-1", 1.212),  # also one A10G, not in the table: ignored
        aws_product("m7i.large", "us-east-1", 0.1),
    ]
    spot = aws.lowest_spot(
        [
            {"InstanceType": "p5.48xlarge", "AvailabilityZone": "us-east-1a", "SpotPrice": "40.0", "Timestamp": "1"},
            {"InstanceType": "p5.48xlarge", "AvailabilityZone": "us-east-1a", "SpotPrice": "30.0", "Timestamp": "2"},
            {"InstanceType": "p5.48xlarge", "AvailabilityZone": "us-east-1b", "SpotPrice": "35.0", "Timestamp": "2"},
        ],
        "us-east-1",
    )
    assert spot == {("us-east-1", "p5.48xlarge"): 30.0}
    out = aws.parse_prices(products, spot, WHEN)
    rows = {r["gpu"]: r for r in out.rows}
    assert set(rows) == {"H100 SXM", "A10G"}
    p5 = rows["H100 SXM"]
    assert (p5["on_demand_usd_per_hour"], p5["spot_usd_per_hour"], p5["gpus_per_node"]) == (12.29, 3.75, 8)
    assert (p5["whole_nodes_only"], p5["inter_node_gbit_per_s"], p5["billing_minimum_s"]) == (True, 3200, 60)
    assert (p5["region"], p5["country"]) == ("us-east-1", "US")
    assert rows["A10G"]["spot_usd_per_hour"] is None
    # The product's memory attribute is the instance's host RAM; a value that is no "N GiB" is unknown.
    assert (p5["host_ram_gib_per_node"], rows["A10G"]["host_ram_gib_per_node"]) == (2048.0, None)


@pytest.mark.parametrize(
    ("price", "shown"),
    [(float("nan"), "nan"), (0, "0"), (-75, "-75"), (None, "not reported"), ("75", "'75'")],
)
def test_lambda_names_an_instance_type_without_a_usable_price(price: Any, shown: str) -> None:
    """An instance type whose price is NaN, zero, negative, missing or not a number was dropped without a word."""
    payload = response("lambda_instance_types.json")
    kind = payload["data"]["gpu_1x_a10"]["instance_type"]
    if price is None:
        del kind["price_cents_per_hour"]
    else:
        kind["price_cents_per_hour"] = price
    out = lambda_cloud.parse_instance_types(payload, WHEN)
    assert {(r["gpu"], r["gpus_per_node"]) for r in out.rows} == {("H100 SXM", 8), ("A100 40GB", 1)}
    assert out.note() == (
        "skipped offers of cards gpuplan has no spec for: gpu_1x_rtx6000; "
        f"skipped 1 offer with a value gpuplan refuses: gpu_1x_a10 (price_cents_per_hour {shown})"
    )


def test_a_row_the_price_list_checks_refuse_is_skipped_with_a_note_in_every_feed() -> None:
    """A price under $0.001 per GPU-hour (a price per second read as one per hour) failed the whole refresh of the
    provider (record_feed_success refuses the rows as a file); the feed skips that offer and names it instead."""
    runpod_payload = response("runpod_gpu_types.json")
    runpod_payload["data"]["gpuTypes"][0]["securePrice"] = 0.0004  # H100 SXM
    out = runpod.parse_gpu_types(runpod_payload, WHEN)
    assert ("H100 SXM", "secure-cloud") not in {(r["gpu"], r["region"]) for r in out.rows}
    assert len(out.rows) == 4 and out.invalid == [
        "H100 SXM secure-cloud (on_demand_usd_per_hour: below $0.001 per GPU-hour: prices are per GPU-hour, "
        "not per second or minute (got 0.0004))"
    ]

    products = [aws_product("p5.48xlarge", "us-east-1", 98.32), aws_product("g5.xlarge", "us-east-1", 0.0005)]
    out = aws.parse_prices(products, {}, WHEN)
    assert [r["gpu"] for r in out.rows] == ["H100 SXM"]
    assert out.invalid[0].startswith("A10G us-east-1 (on_demand_usd_per_hour: below $0.001 per GPU-hour")

    lambda_payload = response("lambda_instance_types.json")
    lambda_payload["data"]["gpu_1x_a10"]["instance_type"]["price_cents_per_hour"] = 0.05
    out = lambda_cloud.parse_instance_types(lambda_payload, WHEN)
    assert len(out.rows) == 2 and out.invalid[0].startswith("A10 - (on_demand_usd_per_hour: below $0.001")


def test_runpod_and_aws_name_an_offer_without_a_usable_price() -> None:
    payload = response("runpod_gpu_types.json")
    payload["data"]["gpuTypes"][2]["communityPrice"] = None  # RTX 4090, listed on the community cloud
    out = runpod.parse_gpu_types(payload, WHEN)
    assert len(out.rows) == 4 and out.invalid == ["NVIDIA GeForce RTX 4090 (communityPrice not reported)"]

    product = aws_product("g5.xlarge", "us-east-1", 1.006)
    (term,) = product["terms"]["OnDemand"].values()
    (dimension,) = term["priceDimensions"].values()
    dimension["pricePerUnit"]["USD"] = "0.0000000000"
    out = aws.parse_prices([aws_product("p5.48xlarge", "us-east-1", 98.32), product], {}, WHEN)
    assert [r["gpu"] for r in out.rows] == ["H100 SXM"]
    assert out.invalid == ["g5.xlarge us-east-1 (no positive USD price per hour)"]


def test_vast_names_an_offer_without_a_usable_price() -> None:
    payload = {
        "offers": [
            {"id": 1, "gpu_name": "RTX 4090", "num_gpus": 1, "dph_total": 0.4},
            {"id": 2, "gpu_name": "RTX 4090", "num_gpus": 1, "dph_total": 0},
            {"id": 3, "gpu_name": "RTX 4090", "num_gpus": 1},
            {"id": 4, "gpu_name": "RTX 4090", "num_gpus": 0, "dph_total": 0.4},
        ]
    }
    out = vast.parse_bundles(payload, WHEN)
    assert [r["on_demand_usd_per_hour"] for r in out.rows] == [0.4]
    assert out.invalid == [
        "RTX 4090 offer 2 (dph_total 0)",
        "RTX 4090 offer 3 (dph_total not reported)",
        "RTX 4090 offer 4 (num_gpus 0)",
    ]


@pytest.mark.parametrize(
    ("value", "gib"),
    [("2048 GiB", 2048.0), ("1,152 GiB", 1152.0), ("0.5 GiB", 0.5), ("16 GB", None), ("0 GiB", None), ("", None)],
)
def test_aws_memory_attribute(value: str, gib: float | None) -> None:
    out = aws.parse_prices([aws_product("p5.48xlarge", "us-east-1", 98.32, memory=value)], {}, WHEN)
    assert out.rows[0]["host_ram_gib_per_node"] == gib


# --- refresh end to end -------------------------------------------------------------------------------


@pytest.fixture
def factory(tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    url = f"sqlite:///{tmp_path / 'gpuplan.db'}"
    migrate(url)
    yield make_sessionmaker(make_engine(url))


@pytest.fixture
def fake() -> Iterator[FakeProviders]:
    with fake_providers() as state:
        yield state


def _settings(fake: FakeProviders, **extra: Any) -> Settings:
    values: dict[str, Any] = {
        "runpod_api_url": fake.url + "/graphql",
        "runpod_api_key": TOKEN,
        "lambda_api_url": fake.url + "/api/v1",
        "lambda_api_key": "lambda-SECRET-key",
        "vast_api_url": fake.url + "/api/v0",
    }
    return Settings(**{**values, **extra})


def _offers(factory: sessionmaker[Session], provider: str) -> list[Any]:
    with unit_of_work(factory) as session:
        return [o for o in catalog_offers(session) if o.provider == provider]


def test_refresh_stores_offers_keeps_other_providers_and_sends_the_key_in_a_header(
    factory: sessionmaker[Session], fake: FakeProviders
) -> None:
    fake.routes[("POST", "/graphql")] = (200, response("runpod_gpu_types.json"))
    fake.routes[("GET", "/api/v1/instance-types")] = (200, response("lambda_instance_types.json"))
    fake.routes[("POST", "/api/v0/bundles/")] = (200, response("vast_bundles.json"))
    outcomes = refresh(factory, _settings(fake), ["runpod", "lambda", "vast"])
    assert [(o.provider, o.ok, o.offers) for o in outcomes] == [
        ("runpod", True, 5),
        ("lambda", True, 3),
        ("vast", True, 5),
    ]
    with unit_of_work(factory) as session:
        providers = {o.provider for o in catalog_offers(session)}
        states = {f.provider: f for f in feed_states(session)}
    assert providers == {o.provider for o in bundled_offers()} | {"runpod", "lambda", "vast"}
    assert states["runpod"].last_error is None and "GTX 1080 Ti" in (states["runpod"].note or "")
    assert all(len(o.fetched_at) == 20 and o.fetched_at.endswith("Z") for o in _offers(factory, "runpod"))

    graphql = next(c for c in fake.calls if c.path == "/graphql")
    assert graphql.headers["Authorization"] == f"Bearer {TOKEN}" and TOKEN not in graphql.path
    assert "gpuTypes" in graphql.body["query"] and "securePrice" in graphql.body["query"]
    bundles = next(c for c in fake.calls if c.path == "/api/v0/bundles/")
    assert bundles.body["rentable"] == {"eq": True} and bundles.body["type"] == "on-demand"


def test_a_feeds_spot_price_above_on_demand_is_dropped_with_a_note_and_the_rest_is_stored(
    factory: sessionmaker[Session], fake: FakeProviders
) -> None:
    """One bad spot price does not cost the provider its fresh on-demand prices (the refresh would otherwise
    fail whole and keep older ones): that offer is stored without a spot price, and the feed's note says so."""
    payload = response("runpod_gpu_types.json")
    a40 = next(t for t in payload["data"]["gpuTypes"] if t["id"] == "NVIDIA A40")
    a40["secureSpotPrice"] = 0.55  # above its securePrice, 0.44
    fake.routes[("POST", "/graphql")] = (200, payload)
    (outcome,) = refresh(factory, _settings(fake), ["runpod"])
    assert outcome.ok and outcome.offers == 5, outcome
    offers = {(o.gpu, o.region): o for o in _offers(factory, "runpod")}
    assert len(offers) == 5
    assert offers[("A40", "secure-cloud")].on_demand_usd_per_hour == 0.44
    assert offers[("A40", "secure-cloud")].spot_usd_per_hour is None
    assert offers[("H100 SXM", "secure-cloud")].spot_usd_per_hour == 1.75  # the sound ones are kept
    note = "dropped the spot price of 1 offer above its on-demand price: A40 secure-cloud (spot 0.55 > 0.44)"
    assert outcome.note is not None and note in outcome.note
    with unit_of_work(factory) as session:
        (state,) = feed_states(session)
    assert state.last_error is None and note in (state.note or "")


def test_one_vast_listing_under_a_tenth_of_a_cent_is_skipped_and_the_rest_imported(
    factory: sessionmaker[Session], fake: FakeProviders
) -> None:
    """One listing priced under $0.001 per GPU-hour failed the whole refresh, keeping every older Vast price. It is
    skipped and named in the note; the next cheapest listing of its card, count and country takes its place."""
    payload = response("vast_bundles.json")
    payload["offers"].append(
        {"id": 108, "gpu_name": "RTX 4090", "num_gpus": 1, "gpu_ram": 24564, "dph_total": 0.0005, "geolocation": "US"}
    )
    fake.routes[("POST", "/api/v0/bundles/")] = (200, payload)
    (outcome,) = refresh(factory, _settings(fake), ["vast"])
    assert outcome.ok and outcome.offers == 5, outcome
    offers = {(o.gpu, o.gpus_per_node, o.country): o for o in _offers(factory, "vast")}
    assert len(offers) == 5 and offers[("RTX 4090", 1, "US")].on_demand_usd_per_hour == 0.38
    note = "skipped 1 offer with a value gpuplan refuses: RTX 4090 US (on_demand_usd_per_hour: below $0.001 per"
    with unit_of_work(factory) as session:
        (state,) = feed_states(session)
    assert state.last_error is None and note in (state.note or "") and note in (outcome.note or "")


def test_a_feed_whose_every_listing_is_refused_fails_naming_them(
    factory: sessionmaker[Session], fake: FakeProviders
) -> None:
    offers = [{"id": 1, "gpu_name": "RTX 4090", "num_gpus": 1, "gpu_ram": 24564, "dph_total": 0.0005}]
    fake.routes[("POST", "/api/v0/bundles/")] = (200, {"offers": offers})
    (outcome,) = refresh(factory, _settings(fake), ["vast"])
    assert not outcome.ok and "no offer of a known card (skipped 1 offer with a value" in (outcome.error or "")


def test_a_lambda_instance_type_priced_nan_is_named_in_the_feeds_note(
    factory: sessionmaker[Session], fake: FakeProviders
) -> None:
    payload = response("lambda_instance_types.json")
    payload["data"]["gpu_1x_a10"]["instance_type"]["price_cents_per_hour"] = float("nan")  # sent as JSON NaN
    fake.routes[("GET", "/api/v1/instance-types")] = (200, payload)
    (outcome,) = refresh(factory, _settings(fake), ["lambda"])
    assert outcome.ok and outcome.offers == 2, outcome
    with unit_of_work(factory) as session:
        (state,) = feed_states(session)
    assert "gpu_1x_a10 (price_cents_per_hour nan)" in (state.note or "")


def test_a_failed_fetch_keeps_the_last_good_prices_and_records_a_scrubbed_error(
    factory: sessionmaker[Session], fake: FakeProviders
) -> None:
    fake.routes[("POST", "/graphql")] = (200, response("runpod_gpu_types.json"))
    refresh(factory, _settings(fake), ["runpod"])
    good = _offers(factory, "runpod")
    assert len(good) == 5
    # The provider fails and echoes the credential back: it must not reach the stored error.
    fake.routes[("POST", "/graphql")] = (503, f"upstream down; you sent Bearer {TOKEN}")
    (outcome,) = refresh(factory, _settings(fake), ["runpod"])
    assert not outcome.ok and outcome.error is not None and "HTTP 503" in outcome.error
    assert TOKEN not in outcome.error and "***" in outcome.error
    assert _offers(factory, "runpod") == good
    with unit_of_work(factory) as session:
        (state,) = feed_states(session)
    assert state.last_error == outcome.error and state.last_success_at is not None
    assert state.last_attempt_at is not None and state.last_attempt_at >= state.last_success_at


def test_a_changed_answer_or_no_key_fails_without_touching_the_catalog(
    factory: sessionmaker[Session], fake: FakeProviders
) -> None:
    fake.routes[("GET", "/api/v1/instance-types")] = (200, {"instance_types": []})
    before = _offers(factory, "cloudrux")
    bundled = {p: _offers(factory, p) for p in ("lambda", "runpod")}
    assert all(bundled.values())  # the bundled snapshot lists both providers
    outcomes = refresh(factory, _settings(fake, runpod_api_key=None), ["lambda", "runpod"])
    assert [(o.provider, o.ok) for o in outcomes] == [("lambda", False), ("runpod", False)]
    assert "no 'data' object" in (outcomes[0].error or "") and "GPUPLAN_RUNPOD_API_KEY" in (outcomes[1].error or "")
    assert _offers(factory, "cloudrux") == before
    assert {p: _offers(factory, p) for p in ("lambda", "runpod")} == bundled


def test_an_unreachable_provider_is_recorded(factory: sessionmaker[Session]) -> None:
    settings = Settings(vast_api_url="http://127.0.0.1:9/api/v0", catalog_feed_timeout_s=2)
    (outcome,) = refresh(factory, settings, ["vast"])
    assert not outcome.ok and "cannot reach the API" in (outcome.error or "")


def test_aws_refresh_through_boto3_against_moto_and_a_price_list_fake(
    factory: sessionmaker[Session], fake: FakeProviders, s3_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # moto serves EC2's DescribeSpotPriceHistory; it has no Price List API, so the loopback fake speaks
    # its JSON 1.1 protocol (X-Amz-Target: AWSPriceListService.GetProducts).
    fake.routes[("AWS", "price-list")] = (
        200,
        [
            aws_product("p5.48xlarge", "us-east-1", 98.32, memory="2048 GiB"),
            aws_product("g5.xlarge", "us-east-1", 1.006),
        ],
    )
    for name in ("AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(name, raising=False)
    settings = Settings(
        aws_feed_regions="us-east-1",
        aws_pricing_endpoint_url=fake.url,
        aws_ec2_endpoint_url=s3_server,
        aws_access_key_id="gpuplan-test",
        aws_secret_access_key="gpuplan-test-secret",
    )
    (outcome,) = refresh(factory, settings, ["aws"])
    assert outcome.ok, outcome.error
    offers = {o.gpu: o for o in _offers(factory, "aws")}
    assert set(offers) == {"H100 SXM", "A10G"}
    p5 = offers["H100 SXM"]
    assert p5.on_demand_usd_per_hour == 12.29 and p5.whole_nodes_only and p5.gpus_per_node == 8
    # moto answers every spot price as 0.00001 USD per instance-hour: next to nothing, dropped with a note (it
    # would rank first; a price list with it is refused).
    assert p5.spot_usd_per_hour is None and offers["A10G"].spot_usd_per_hour is None
    assert outcome.note is not None and "below $0.001 per GPU-hour: H100 SXM us-east-1 (spot 1.25e-06)" in outcome.note
    assert p5.billing_minimum_s == 60 and p5.inter_node_gbit_per_s == 3200
    assert p5.host_ram_gib_per_node == 2048.0 and offers["A10G"].host_ram_gib_per_node is None
    target = next(c for c in fake.calls if c.headers.get("X-Amz-Target"))
    filters = {f["Field"]: f["Value"] for f in target.body["Filters"]}
    assert target.body["ServiceCode"] == "AmazonEC2" and filters["regionCode"] == "us-east-1"
    assert "gpuplan-test-secret" not in str(target.headers)


def test_aws_failure_names_the_cause_without_the_secret(factory: sessionmaker[Session], fake: FakeProviders) -> None:
    settings = Settings(
        aws_feed_regions="us-east-1",
        aws_pricing_endpoint_url=fake.url + "/nothing-here",
        aws_ec2_endpoint_url=fake.url,
        aws_access_key_id="AKIAGPUPLANTEST",
        aws_secret_access_key="very-secret-aws-key",
    )
    (outcome,) = refresh(factory, settings, ["aws"])
    assert not outcome.ok and outcome.error is not None and outcome.error.startswith("aws: ")
    assert "very-secret-aws-key" not in outcome.error
