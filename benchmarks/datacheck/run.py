"""Speed and memory of the data set check on a 1 GB JSON Lines file.

Writes a synthetic Alpaca-style set (rows of 120-260 words from a 30,000-word vocabulary; 0.5% exact
and 0.5% near duplicates, 0.1% broken lines, 0.2% rows with personal data) to a temporary directory
as a stream, checks it with `check_dataset` (the same streaming core the worker runs on an uploaded
object), and samples the process's resident memory every 0.2 s: at 10%, 50% and 100% of the rows and
its peak, and the size of its scratch file. Memory must stay flat: the check keeps a chunk of rows and
bounded state (the duplicate indexes spill to a temporary SQLite file), never the file.
Run: ``python -m benchmarks.datacheck.run [--size-mb 1000]`` (writes benchmarks/results/datacheck.json).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from services.datacheck import check_dataset
from services.datacheck.spill import SCRATCH_PREFIX

RESULTS = Path(__file__).resolve().parents[1] / "results"
_SYLLABLES = (
    "ka",
    "lo",
    "mi",
    "ne",
    "ru",
    "si",
    "ta",
    "vo",
    "ze",
    "pu",
    "da",
    "fe",
    "gi",
    "ho",
    "ju",
    "be",
    "ar",
    "en",
)


def _rss_mib() -> float:
    """Resident set size of this process from /proc (Linux), in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _scratch_mib() -> float:
    """Size of the check's scratch files (spilled duplicate indexes) in the temporary directory, in MiB."""
    total = 0
    for folder in Path(tempfile.gettempdir()).glob(SCRATCH_PREFIX + "*"):
        total += sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
    return total / 2**20


def _tc_kimlik(rng: random.Random) -> str:
    d = [rng.randint(1, 9)] + [rng.randint(0, 9) for _ in range(8)]
    d.append((7 * (d[0] + d[2] + d[4] + d[6] + d[8]) - (d[1] + d[3] + d[5] + d[7])) % 10)
    d.append(sum(d) % 10)
    return "".join(map(str, d))


def write_dataset(path: Path, size_bytes: int, seed: int = 2026) -> dict[str, int]:
    """Write rows until the file reaches `size_bytes`; returns what was planted."""
    rng = random.Random(seed)
    vocab = sorted({"".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 5))) for _ in range(60_000)})[:30_000]
    recent: deque[dict[str, str]] = deque(maxlen=2000)
    planted = {"rows": 0, "exact": 0, "near": 0, "broken": 0, "pii": 0}
    written = 0
    with path.open("w", encoding="utf-8", buffering=1 << 20) as out:
        while written < size_bytes:
            draw = rng.random()
            if draw < 0.005 and recent:
                row = dict(rng.choice(recent))
                planted["exact"] += 1
            elif draw < 0.010 and recent:
                source = rng.choice(recent)
                words = source["output"].split()
                words[len(words) // 2] = "changed"
                row = dict(source, output=" ".join(words))
                planted["near"] += 1
            elif draw < 0.011:
                line = '{"instruction": "cut off", "output": \n'
                out.write(line)
                written += len(line)
                planted["rows"] += 1
                planted["broken"] += 1
                continue
            else:
                row = {
                    "instruction": " ".join(rng.choices(vocab, k=rng.randint(10, 20))),
                    "input": "",
                    "output": " ".join(rng.choices(vocab, k=rng.randint(120, 260))) + ".",
                }
                if draw < 0.013:
                    row["input"] = f"TC {_tc_kimlik(rng)}, e-posta user{planted['pii']}@example.com"
                    planted["pii"] += 1
                recent.append(row)
            line = json.dumps(row, ensure_ascii=False) + "\n"
            out.write(line)
            written += len(line.encode("utf-8"))
            planted["rows"] += 1
    return planted


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1000, help="file size in MB (10^6 bytes); default 1000")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gpuplan-datacheck-") as tmp:
        path = Path(tmp) / "train.jsonl"
        start = time.perf_counter()
        planted = write_dataset(path, args.size_mb * 10**6)
        generated_s = time.perf_counter() - start
        size = path.stat().st_size
        samples: list[float] = []
        scratch: list[float] = [0.0]
        marks: dict[str, float] = {"before": _rss_mib()}
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.2):
                samples.append(_rss_mib())
                with contextlib.suppress(OSError):  # removed while listed
                    scratch.append(_scratch_mib())

        def progress(done: int, total: int) -> None:
            for label, share in (("at_10pct", 0.10), ("at_50pct", 0.50)):
                if label not in marks and done >= share * total:
                    marks[label] = _rss_mib()

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        start = time.perf_counter()
        report = check_dataset(path, progress=progress, max_listed=100)
        seconds = time.perf_counter() - start
        marks["at_100pct"] = _rss_mib()
        stop.set()
        sampler.join()
    counts = report.counts
    result: dict[str, Any] = {
        "file_bytes": size,
        "rows": report.rows_total,
        "check_seconds": round(seconds, 1),
        "rows_per_s": round(report.rows_total / seconds),
        "mb_per_s": round(size / 1e6 / seconds, 2),
        "rss_mib": {k: round(v, 1) for k, v in marks.items()} | {"peak": round(max([*samples, marks["at_100pct"]]), 1)},
        "scratch_disk_mib_peak": round(max(scratch), 1),
        "cpu_count": os.cpu_count(),
        "processes": 1,
        "generation_seconds": round(generated_s, 1),
        "planted": planted,
        "found": {
            "exact_duplicates": counts["exact_duplicates"],
            "near_duplicates": counts["near_duplicates"],
            "broken_rows": counts["broken_rows"],
            "pii_findings": report.pii_findings_total,
        },
        "recommended_seq_len_tokens": report.tokens.recommended_seq_len_tokens,
        "token_method": report.tokens.method,
        "note": (
            "one process (the check is single-threaded Python plus numpy); memory is bounded: a histogram of "
            "token lengths, and duplicate indexes holding at most 32,768 rows in memory, the rest in a "
            "temporary SQLite file (scratch_disk_mib_peak), deleted at the end"
        ),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "datacheck.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
