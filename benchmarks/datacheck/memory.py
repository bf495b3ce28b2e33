"""Peak memory of the API process while it checks data set bombs and a 1 GB honest file (issue 21).

Starts `gpuplan serve` (embedded: SQLite, in-process tasks, the check in its memory-capped child) with
moto's S3 server, uploads each file through the datasets routes, waits for its check, and reads the API
process's peak RSS growth (VmHWM after a reset, served.py). Files are written to a temporary directory.
Run: ``python -m benchmarks.datacheck.memory [--honest-mb 1000]`` (writes benchmarks/results/datacheck_memory.json;
docs/security.md quotes it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.datacheck import served

RESULTS = Path(__file__).resolve().parents[1] / "results" / "datacheck_memory.json"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--honest-mb", type=int, default=1000, help="size of the honest JSON Lines file (MB)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpuplan-datacheck-memory-") as tmp:
        work = Path(tmp)
        (work / "api").mkdir()
        with contextlib.contextmanager(served.serve)(work / "api") as api:
            warm = served.honest_jsonl(work / "warm.jsonl", 200_000)
            api.upload_file(warm, "warm.jsonl")
            files: list[tuple[Callable[[Path], Path], str]] = [
                (served.gzip_line_bomb, "data.jsonl.gz"),
                (served.bz2_line_bomb, "data.jsonl.bz2"),
                (served.parquet_dictionary_bomb, "data.parquet"),
                (served.csv_with_a_long_cell, "long-cell.csv"),
                (served.csv_with_a_bom, "bom.csv"),
                (lambda p: served.honest_jsonl(p, args.honest_mb * 10**6), "honest.jsonl"),
            ]
            for make, name in files:
                path = make(work / name)
                started = time.monotonic()
                growth_mib, body = api.peak_growth_mib(path, name)
                row = {
                    "file": name,
                    "size_bytes": path.stat().st_size,
                    "status": body["status"],
                    "error": body["error"],
                    "rows_total": (body["report"] or {}).get("rows_total"),
                    "api_peak_rss_growth_mib": round(growth_mib, 1),
                    "seconds": round(time.monotonic() - started, 1),
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
                path.unlink()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
