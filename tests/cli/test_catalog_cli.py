"""`gpuplan admin import-offers`, `gpuplan admin create-key --platform-admin` and `gpuplan catalog refresh`,
run as the user runs them (the console script in a subprocess), on the embedded default's SQLite file."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from services.catalog.offers import bundled_offers
from tests.catalog.fakes import FakeProviders, fake_providers, response

ROOT = Path(__file__).resolve().parents[2]
Gpuplan = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def gpuplan(tmp_path: Path) -> Gpuplan:
    script = shutil.which("gpuplan", path=str(Path(sys.executable).parent))
    command = [script] if script else [sys.executable, "-m", "services.cli.main"]
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPUPLAN_")}
    base["PYTHONPATH"] = str(ROOT)

    def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*command, *args], capture_output=True, text=True, cwd=tmp_path, env={**base, **(env or {})}, timeout=120
        )

    return run


@pytest.fixture
def fake() -> Iterator[FakeProviders]:
    with fake_providers() as state:
        yield state


def _costs(gpuplan: Gpuplan) -> dict[tuple[str, str], float]:
    out = gpuplan(
        "estimate", "--model", "meta-llama/Llama-3.1-8B", "--method", "qlora", "--examples", "1000",
        "--avg-tokens", "512", "--epochs", "1", "--json",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    costs: list[dict[str, Any]] = json.loads(out.stdout)["costs"]
    return {(c["provider"], c["gpu"]): c["on_demand_usd_per_hour"] for c in costs}


def _one_line_error(out: subprocess.CompletedProcess[str]) -> str:
    assert out.returncode == 2, (out.returncode, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuplan: error:"), out.stderr
    return lines[0]


def test_importing_one_provider_keeps_the_others_and_estimate_uses_the_database(
    gpuplan: Gpuplan, tmp_path: Path
) -> None:
    bundled = _costs(gpuplan)  # no database yet: the bundled price lists
    assert not (tmp_path / "gpuplan.db").exists() and bundled[("cloudrux", "A40")] == 0.74
    (tmp_path / "prices.csv").write_text(
        "provider,gpu,on_demand_usd_per_hour,region,gpus_per_node\ncloudrux,A40,0.61,partner-dc,8\n"
    )
    out = gpuplan("admin", "import-offers", "prices.csv")
    assert out.returncode == 0, out.stderr
    assert "1 updated" in out.stderr and f"{len(bundled_offers()) - 1} kept" in out.stderr
    after = _costs(gpuplan)  # the embedded default's SQLite file is there now: the service's catalog
    assert after[("cloudrux", "A40")] == 0.61
    assert {k: v for k, v in after.items() if k != ("cloudrux", "A40")} == {
        k: v for k, v in bundled.items() if k != ("cloudrux", "A40")
    }

    out = gpuplan("admin", "import-offers", "prices.csv", "--replace-provider", "cloudrux")
    assert out.returncode == 0 and "8 removed" in out.stderr
    providers = {p for p, _ in _costs(gpuplan)}
    assert providers == {o.provider for o in bundled_offers()}
    assert [g for p, g in _costs(gpuplan) if p == "cloudrux"] == ["A40"]


@pytest.mark.parametrize(
    ("row", "needle"),
    [
        ("newco,Voodoo 5,1.0,eu", "row 2: gpu: unknown GPU"),
        ("newco,L4,-1,eu", "row 2: on_demand_usd_per_hour:"),
        ("newco,H100,3.0,eu", "row 2: duplicate offer"),
        ("newco,L4,1.0,=cmd|' /C calc'!A0", "row 2: region: looks like a spreadsheet formula"),
    ],
)
def test_a_bad_row_rejects_the_file_in_one_line(gpuplan: Gpuplan, tmp_path: Path, row: str, needle: str) -> None:
    assert gpuplan("migrate").returncode == 0
    before = _costs(gpuplan)
    (tmp_path / "prices.csv").write_text(f"provider,gpu,on_demand_usd_per_hour,region\nnewco,H100 SXM,3.5,eu\n{row}\n")
    line = _one_line_error(gpuplan("admin", "import-offers", "prices.csv"))
    assert needle in line and "nothing was imported" in line
    assert _costs(gpuplan) == before


ROW_JSON = '[{"provider": "a", "gpu": "L4", "on_demand_usd_per_hour": PRICE}]'


@pytest.mark.parametrize(
    ("name", "text", "needle"),
    [
        # Probes of stop 53: each was a traceback or a silently wrong price list.
        ("deep.json", "[" * 100_000 + "]" * 100_000, "JSON price list: nested too deeply"),
        ("long.json", ROW_JSON.replace("PRICE", "1" + "0" * 5000), "4,300 digits"),
        ("bool.json", ROW_JSON.replace("PRICE", "true"), "not true or false"),
        ("flag.json", ROW_JSON.replace("PRICE", '1, "whole_nodes_only": 1'), "true or false"),
        (
            "zone.json",
            '[{"provider": "a", "gpu": "L4", "on_demand_usd_per_hour": 1, "fetched_at": "0001-01-01T00:00:00+14:00"}]',
            "row 1: fetched_at: expected an ISO date",
        ),
        ("twice.csv", "provider,gpu,on_demand_usd_per_hour,provider\na,L4,1,b\n", "the header names 'provider' twice"),
        ("bidi.csv", "provider,gpu,on_demand_usd_per_hour\na\u202eb,L4,1\n", "invisible character U+202E"),
        ("second.csv", "provider,gpu,on_demand_usd_per_hour\na,L4,0.0002\n", "not per second or minute"),
    ],
)
def test_a_price_list_the_checks_refuse_is_one_line_and_imports_nothing(
    gpuplan: Gpuplan, tmp_path: Path, name: str, text: str, needle: str
) -> None:
    assert gpuplan("migrate").returncode == 0
    before = _costs(gpuplan)
    (tmp_path / name).write_text(text, encoding="utf-8")
    line = _one_line_error(gpuplan("admin", "import-offers", name))
    assert needle in line and "nothing was imported" in line, line
    assert _costs(gpuplan) == before


def test_a_spot_price_above_on_demand_rejects_the_file_in_one_line(gpuplan: Gpuplan, tmp_path: Path) -> None:
    assert gpuplan("migrate").returncode == 0
    before = _costs(gpuplan)
    (tmp_path / "prices.csv").write_text(
        "provider,gpu,on_demand_usd_per_hour,spot_usd_per_hour,region\nnewco,H100 SXM,3.5,2.0,eu\nnewco,L4,0.5,0.8,eu\n"
    )
    line = _one_line_error(gpuplan("admin", "import-offers", "prices.csv"))
    assert "row 2: spot_usd_per_hour: 0.8 is above on_demand_usd_per_hour (0.5)" in line, line
    assert "nothing was imported" in line
    assert _costs(gpuplan) == before


def test_import_input_errors_are_one_line(gpuplan: Gpuplan, tmp_path: Path) -> None:
    assert "no file" in _one_line_error(gpuplan("admin", "import-offers", "missing.csv"))
    (tmp_path / "p.csv").write_text("provider,gpu,on_demand_usd_per_hour\nnewco,L4,1\n")
    assert "no organization named 'ghost'" in _one_line_error(
        gpuplan("admin", "import-offers", "p.csv", "--org", "ghost")
    )
    line = _one_line_error(gpuplan("admin", "import-offers", "p.csv", "--replace-provider", "nobody"))
    assert "replace_provider" in line and "cloudrux" in line


def test_an_organizations_import_does_not_change_the_public_catalog(gpuplan: Gpuplan, tmp_path: Path) -> None:
    assert gpuplan("admin", "create-org", "acme").returncode == 0
    public = _costs(gpuplan)
    (tmp_path / "ours.csv").write_text(
        "provider,gpu,on_demand_usd_per_hour,region,gpus_per_node\ncloudrux,A40,0.01,partner-dc,8\n"
    )
    out = gpuplan("admin", "import-offers", "ours.csv", "--org", "acme")
    assert out.returncode == 0 and "organization 'acme'" in out.stderr
    assert _costs(gpuplan) == public
    key = gpuplan("admin", "create-key", "--org", "acme", "--platform-admin")
    assert key.returncode == 0 and key.stdout.startswith("gp_")


def test_catalog_refresh_from_a_feed_and_a_failed_one(gpuplan: Gpuplan, fake: FakeProviders) -> None:
    env = {"GPUPLAN_RUNPOD_API_URL": fake.url + "/graphql", "GPUPLAN_RUNPOD_API_KEY": "rp-cli-SECRET"}
    # A first fetch that fails has no earlier prices to keep, and says so.
    fake.routes[("POST", "/graphql")] = (500, "boom")
    first = gpuplan("catalog", "refresh", "--provider", "runpod", env=env)
    assert first.returncode == 1 and "no earlier fetch of it succeeded (no fetched prices to keep)" in first.stderr
    assert "prices kept" not in first.stderr
    assert first.stderr.count("no earlier fetch") == 1, first.stderr  # the log record said it a second time
    fake.routes[("POST", "/graphql")] = (200, response("runpod_gpu_types.json"))
    out = gpuplan("catalog", "refresh", "--provider", "runpod", env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("runpod: 5 offers")
    assert ("runpod", "H100 SXM") in _costs(gpuplan)

    fake.routes[("POST", "/graphql")] = (500, "boom rp-cli-SECRET")
    failed = gpuplan("catalog", "refresh", "--provider", "runpod", env=env)
    assert failed.returncode == 1 and "runpod: failed, last good prices (fetched " in failed.stderr
    assert "UTC) kept: runpod: HTTP 500" in failed.stderr
    assert "rp-cli-SECRET" not in failed.stderr + failed.stdout
    assert ("runpod", "H100 SXM") in _costs(gpuplan)


def test_catalog_refresh_needs_a_feed(gpuplan: Gpuplan) -> None:
    assert "GPUPLAN_CATALOG_FEEDS" in _one_line_error(gpuplan("catalog", "refresh"))
    assert "invalid choice" in _one_line_error(gpuplan("catalog", "refresh", "--provider", "azure"))


def test_remove_provider(gpuplan: Gpuplan) -> None:
    aws = [o for o in bundled_offers() if o.provider == "aws"]
    out = gpuplan("admin", "remove-provider", "aws")
    assert out.returncode == 0 and f"removed {len(aws)} offers" in out.stderr, out.stderr
    assert {p for p, _ in _costs(gpuplan)} == {o.provider for o in bundled_offers()} - {"aws"}
    assert "provider: no offers of aws" in _one_line_error(gpuplan("admin", "remove-provider", "aws"))


def test_estimate_prices_only_the_counts_an_offer_rents(gpuplan: Gpuplan) -> None:
    """The cost table priced the plan's GPU count on every offer: 1 x H100 SXM at aws for $12.29/h, where AWS rents the
    card only as the 8-GPU p5.48xlarge (whole nodes). An offer that does not rent the count is left out, and said so;
    at 8 GPUs it is priced for the node."""
    whole = [o for o in bundled_offers() if o.whole_nodes_only and o.gpus_per_node > 1]
    assert ("aws", "H100 SXM") in {(o.provider, o.gpu) for o in whole}

    def estimate(gpus: str) -> dict[str, Any]:
        out = gpuplan(
            "estimate", "--model", "meta-llama/Llama-3.1-8B", "--method", "qlora", "--examples", "1000",
            "--avg-tokens", "512", "--epochs", "1", "--gpus", gpus, "--json",
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        answer: dict[str, Any] = json.loads(out.stdout)
        return answer

    one = estimate("1")
    priced = {(c["provider"], c["gpu"]) for c in one["costs"]}
    single = {(o.provider, o.gpu) for o in bundled_offers() if not o.whole_nodes_only or o.gpus_per_node == 1}
    assert not priced & ({(o.provider, o.gpu) for o in whole} - single), priced
    assert len(one["costs"]) == len([o for o in bundled_offers() if not o.whole_nodes_only or o.gpus_per_node == 1])
    assert any(f"{len(whole)} offer(s) rent no 1 GPU(s)" in w for w in one["warnings"]), one["warnings"]
    eight = {(c["provider"], c["gpu"]): c for c in estimate("8")["costs"]}
    assert eight[("aws", "H100 SXM")]["on_demand_usd_per_hour"] == round(8 * 12.29, 4)
