"""The price-list parser (pure): whole-file rejection naming row and field, the v2 columns, export."""

from __future__ import annotations

import pytest

from services.catalog.offers import bundled_offers
from services.catalog.pricelist import PriceListError, export_csv, parse_price_list

HEADER = "provider,gpu,on_demand_usd_per_hour,spot_usd_per_hour,region,gpus_per_node\n"


def _problems(text: str, fmt: str = "csv") -> list[str]:
    with pytest.raises(PriceListError) as info:
        parse_price_list(text, fmt)
    return info.value.problems


def test_every_bad_row_is_named_with_its_field() -> None:
    problems = _problems(
        HEADER
        + "acme,H100,3.5,,eu,1\n"
        + "acme,Voodoo 5,1.0,,eu,1\n"
        + "acme,A100 80GB,-2,,eu,1\n"
        + "acme,H100 SXM5,3.4,,eu,1\n"
        + "acme,L4,0.5,-0.1,eu,1\n"
        + "acme,L4,0.5,,eu,0\n"
    )
    assert problems[0].startswith("row 2: gpu: unknown GPU 'Voodoo 5'")
    assert problems[1].startswith("row 3: on_demand_usd_per_hour: input should be greater than 0")
    assert problems[2].startswith("row 4: duplicate offer for acme H100 SXM x1 region 'eu'") and "row 1" in problems[2]
    assert problems[3].startswith("row 5: spot_usd_per_hour:")
    assert problems[4].startswith("row 6: gpus_per_node:")
    assert len(problems) == 5


@pytest.mark.parametrize("cell", ["=1+2", "+1", "@SUM(A1)", "-cmd", '=HYPERLINK("http://x")'])
def test_formula_looking_cells_are_refused(cell: str) -> None:
    problems = _problems(HEADER + f"acme,L4,0.5,,{cell},1\n")
    assert problems == [problems[0]] and problems[0].startswith("row 1: region: looks like a spreadsheet formula")


def test_formula_in_json_and_a_nul_byte_are_refused() -> None:
    problems = _problems('[{"provider": "=cmd", "gpu": "L4", "on_demand_usd_per_hour": 1}]', "json")
    assert problems[0].startswith("row 1: provider: looks like a spreadsheet formula")
    problems = _problems('[{"provider": "a\\u0000b", "gpu": "L4", "on_demand_usd_per_hour": 1}]', "json")
    assert problems == ["row 1: provider: contains a NUL byte"]


def test_control_characters_extra_cells_and_a_future_date_are_refused() -> None:
    """What a fuzzing pass (stop 49) saw imported: an escape in a provider's name, a row longer than its header (the
    extra cells silently dropped), and a price read in 9999 (never stale)."""
    assert _problems(HEADER + "a\x01b,L4,0.5,,eu,1\n") == ["row 1: provider: contains the control character '\\x01'"]
    problems = _problems(HEADER + "acme,L4,0.5,,eu,1,x,y,z\n")
    assert problems == ["row 1: 3 more cell(s) than the header has columns (['x', 'y', 'z'])"]
    future = '[{"provider": "acme", "gpu": "L4", "on_demand_usd_per_hour": 1, "fetched_at": "9999-12-31"}]'
    assert _problems(future, "json")[0].startswith("row 1: fetched_at: 9999-12-31 is in the future")
    old = '[{"provider": "acme", "gpu": "L4", "on_demand_usd_per_hour": 1, "fetched_at": "2001-01-01"}]'
    assert parse_price_list(old, "json")[0].fetched_at == "2001-01-01"


def test_a_negative_number_is_reported_as_a_number_not_a_formula() -> None:
    problems = _problems(HEADER + "acme,L4,-0.5,,eu,1\n")
    assert problems[0].startswith("row 1: on_demand_usd_per_hour: input should be greater than 0")


def test_v2_columns_are_read_and_empty_cells_keep_defaults() -> None:
    text = (
        "provider,gpu,on_demand_usd_per_hour,gpus_per_node,whole_nodes_only,inter_node_gbit_per_s,"
        "billing_increment_s,billing_minimum_s,startup_s,download_gbit_per_s,preemption_per_hour,fetched_at\n"
        "acme,H100,3.0,8,true,3200,3600,3600,420,25,0.08,2026-11-30T10:15:00+01:00\n"
        "acme,L4,0.5,,,,,,,,,\n"
    )
    big, small = parse_price_list(text, "csv")
    assert (big.whole_nodes_only, big.inter_node_gbit_per_s, big.billing_increment_s, big.billing_minimum_s) == (
        True,
        3200,
        3600,
        3600,
    )
    assert (big.startup_s, big.download_gbit_per_s, big.preemption_per_hour) == (420, 25, 0.08)
    assert big.fetched_at == "2026-11-30T09:15:00Z"
    assert (small.gpus_per_node, small.whole_nodes_only, small.billing_increment_s, small.startup_s) == (
        1,
        False,
        1,
        None,
    )
    assert len(small.fetched_at) == 10


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("billing_increment_s", "0"),
        ("billing_minimum_s", "-60"),
        ("inter_node_gbit_per_s", "0"),
        ("preemption_per_hour", "500"),
        ("whole_nodes_only", "maybe"),
        ("fetched_at", "2026-11-30T10:00:00"),
        ("fetched_at", "yesterday"),
        ("host_ram_gib_per_node", "0"),
        ("host_ram_gib_per_node", "-16"),
        ("host_ram_gib_per_node", "nan"),
        ("host_ram_gib_per_node", "inf"),
        ("host_ram_gib_per_node", "lots"),
        ("host_ram_gib_per_node", "2097152"),  # 2 TiB written in MiB: more than any server
        ("host_ram_gib_per_node", "=2048"),
        ("host_ram_gib_per_node", "@SUM(A1)"),
    ],
)
def test_bad_v2_values_name_the_column(column: str, value: str) -> None:
    problems = _problems(f"provider,gpu,on_demand_usd_per_hour,{column}\nacme,L4,0.5,{value}\n")
    assert problems[0].startswith(f"row 1: {column}:"), problems


def test_a_spot_price_above_the_on_demand_price_is_refused_naming_the_row() -> None:
    """Spot capacity is sold at or below the on-demand price (AWS caps the Spot price at the On-Demand price:
    docs.aws.amazon.com, "Spot Instance pricing"); a row above it is a data error (swapped columns, a price
    per node beside one per GPU)."""
    problems = _problems(HEADER + "acme,L4,0.5,0.4,eu,1\n" + "acme,A40,0.7,0.9,eu,1\n")
    assert len(problems) == 1 and problems[0].startswith("row 2: spot_usd_per_hour: 0.9 is above"), problems
    assert "on_demand_usd_per_hour (0.7)" in problems[0]
    as_json = '[{"provider": "acme", "gpu": "L4", "on_demand_usd_per_hour": 1, "spot_usd_per_hour": 1.5}]'
    assert _problems(as_json, "json")[0].startswith("row 1: spot_usd_per_hour:")
    (same,) = parse_price_list(HEADER + "acme,L4,0.5,0.5,eu,1\n", "csv")  # at the cap: allowed
    assert same.spot_usd_per_hour == same.on_demand_usd_per_hour == 0.5


def test_export_reads_back_unchanged() -> None:
    # The bundled lists pass every check a user's list must pass (no spot price above its on-demand one).
    offers = list(bundled_offers())
    assert parse_price_list(export_csv(offers), "csv") == offers


def test_host_ram_is_read_and_empty_is_unknown() -> None:
    text = "provider,gpu,on_demand_usd_per_hour,host_ram_gib_per_node\nacme,H100,3.0,2048\nacme,L4,0.5,\n"
    big, small = parse_price_list(text, "csv")
    assert (big.host_ram_gib_per_node, small.host_ram_gib_per_node) == (2048.0, None)
    (offer,) = parse_price_list(
        '[{"provider": "acme", "gpu": "A10G", "on_demand_usd_per_hour": 1.0, "host_ram_gib_per_node": 16}]', "json"
    )
    assert offer.host_ram_gib_per_node == 16.0
    assert "host_ram_gib_per_node" in export_csv([big]).splitlines()[0].split(",")


def test_a_row_in_another_currency_is_refused_naming_the_row() -> None:
    # Every price and cost is USD and gpuplan holds no exchange rate: a EUR row was ranked as dollars (stop 52).
    problems = _problems("provider,gpu,on_demand_usd_per_hour,currency\nacme,L4,0.5,USD\nacme,L4,0.4,EUR\n")
    assert len(problems) == 1 and problems[0].startswith("row 2: currency:") and "'EUR'" in problems[0], problems
    (offer,) = parse_price_list("provider,gpu,on_demand_usd_per_hour,currency\nacme,L4,0.5,usd\n", "csv")
    assert offer.currency == "USD"


@pytest.mark.parametrize("country", ["1", "U", "USA", "\u00c4\u00d6", "\uff24\uff25"])
def test_a_country_that_is_no_iso_code_is_refused_naming_the_row(country: str) -> None:
    # The region filters match an offer by its ISO 3166-1 alpha-2 code: "1" was stored and matched nothing.
    problems = _problems(
        f"provider,gpu,on_demand_usd_per_hour,region,country\nacme,L4,0.5,a,DE\nacme,L4,0.5,b,{country}\n"
    )
    assert len(problems) == 1 and problems[0].startswith("row 2: country: expected an ISO 3166-1 alpha-2"), problems
    as_json = f'[{{"provider": "acme", "gpu": "L4", "on_demand_usd_per_hour": 1, "country": "{country}"}}]'
    assert _problems(as_json, "json")[0].startswith("row 1: country:")


def test_a_country_is_upper_cased_and_may_be_empty() -> None:
    text = "provider,gpu,on_demand_usd_per_hour,region,country\nacme,L4,0.5,a, de \nacme,L4,0.5,b,\n"
    assert [o.country for o in parse_price_list(text, "csv")] == ["DE", ""]
