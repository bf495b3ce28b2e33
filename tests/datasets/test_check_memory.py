"""Issue 21: data set checks in bounded memory. The real API (`gpuplan serve`, embedded: SQLite and
in-process tasks) gets each bomb through the datasets routes; its peak RSS (VmHWM) stays within 64 MiB of
where it was, and each refusal names the limit and its value."""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from benchmarks.datacheck import served

GROWTH_LIMIT_MIB = 64

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("moto") is None or importlib.util.find_spec("pyarrow") is None,
    reason="needs moto[server] and pyarrow",
)


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[served.Served]:
    with contextlib.contextmanager(served.serve)(tmp_path_factory.mktemp("served")) as running:
        # Warm up: the first upload and check load what the API loads lazily (boto3, the check's modules).
        warm = served.honest_jsonl(tmp_path_factory.mktemp("warm") / "warm.jsonl", 200_000)
        assert running.upload_file(warm, "warm.jsonl")["status"] == "done"
        yield running


@pytest.mark.parametrize(
    ("make", "name", "refusal"),
    [
        (served.gzip_line_bomb, "data.jsonl.gz", "line 1 of data.jsonl.gz is over the 64 MiB record limit"),
        (served.bz2_line_bomb, "data.jsonl.bz2", "line 1 of data.jsonl.bz2 is over the 64 MiB record limit"),
        (served.parquet_dictionary_bomb, "data.parquet", "data.parquet decodes to more than 256 MiB"),
    ],
)
def test_a_bomb_is_refused_naming_the_limit_and_the_api_stays_small(
    api: served.Served, tmp_path: Path, make: Callable[[Path], Path], name: str, refusal: str
) -> None:
    path = make(tmp_path / name)
    assert path.stat().st_size < 2 * 2**20  # a bomb: small on disk
    growth_mib, body = api.peak_growth_mib(path, name)
    assert body["status"] == "failed"
    assert refusal in body["error"] and "GPUPLAN_DATACHECK_" in body["error"], body["error"]
    assert "internal error" not in body["error"]
    assert growth_mib < GROWTH_LIMIT_MIB, f"{name}: the API's peak RSS grew {growth_mib:.0f} MiB"


def test_a_200_kib_csv_cell_is_checked(api: served.Served, tmp_path: Path) -> None:
    # Python's csv module alone stops at 128 KiB ("field larger than field limit"); the cell limit is 16 MiB.
    path = served.csv_with_a_long_cell(tmp_path / "long.csv")
    growth_mib, body = api.peak_growth_mib(path, "long.csv")
    assert body["status"] == "done", body["error"]
    assert body["report"]["rows_total"] == 2 and body["report"]["detected_format"] == "prompt_completion"
    assert growth_mib < GROWTH_LIMIT_MIB


def test_a_csv_with_a_bom_is_accepted(api: served.Served, tmp_path: Path) -> None:
    path = served.csv_with_a_bom(tmp_path / "bom.csv")
    _, body = api.peak_growth_mib(path, "bom.csv")
    assert body["status"] == "done", body["error"]
    report = body["report"]
    assert report["rows_total"] == 2 and report["detected_format"] == "prompt_completion"
    assert report["counts"]["mismatched_rows"] == 0


def test_an_honest_file_is_checked_in_bounded_memory(api: served.Served, tmp_path: Path) -> None:
    # 10 MB here; benchmarks/datacheck/memory.py runs 1 GB (docs/security.md has its figure).
    path = served.honest_jsonl(tmp_path / "honest.jsonl", 10 * 10**6)
    growth_mib, body = api.peak_growth_mib(path, "honest.jsonl")
    assert body["status"] == "done", body["error"]
    assert body["report"]["detected_format"] == "chat" and body["report"]["counts"]["broken_rows"] == 0
    assert growth_mib < GROWTH_LIMIT_MIB


def test_a_check_that_runs_out_of_its_memory_limit_is_reported(tmp_path_factory: pytest.TempPathFactory) -> None:
    # The bombs are refused by the readers' limits; here the limits are raised past the child's memory
    # cap, so the cap is what stops the check: the API survives and says why.
    env = {
        "GPUPLAN_DATACHECK_MEMORY_LIMIT_BYTES": str(600 * 2**20),
        "GPUPLAN_DATACHECK_MAX_RECORD_BYTES": str(2**31),
        "GPUPLAN_DATACHECK_EXPANSION_RATIO": "1000000",
    }
    with contextlib.contextmanager(served.serve)(tmp_path_factory.mktemp("capped"), env) as running:
        path = served.gzip_line_bomb(tmp_path_factory.mktemp("bomb") / "data.jsonl.gz")
        body = running.upload_file(path, "data.jsonl.gz")
        assert body["status"] == "failed"
        assert "out of memory for the check" in body["error"] and "600 MiB memory limit" in body["error"], body["error"]
        assert "GPUPLAN_DATACHECK_MEMORY_LIMIT_BYTES" in body["error"]
        # Still serving.
        assert running.request("GET", "/v1/datasets")["items"]
