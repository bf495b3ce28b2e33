"""Write the public accuracy cases the dashboard's benchmarks page plots (package data, so the page
works from an installed gpuplan, where benchmarks/ is not shipped).

Source: benchmarks/results/accuracy.json, written by ``python -m benchmarks.accuracy.run``. After that
report changes, run ``python -m benchmarks.dashboard.accuracy_data``; a test checks the copy is current.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
REPORT = ROOT / "benchmarks" / "results" / "accuracy.json"
TARGET = ROOT / "services" / "dashboard" / "data" / "accuracy_cases.json"
FIELDS = (
    "id",
    "source",
    "confidence",
    "gpu",
    "metric",
    "measured_gib",
    "predicted_gib",
    "measured_tokens_per_s",
    "predicted_tokens_per_s",
)


def project(report: dict[str, Any]) -> dict[str, Any]:
    """The fields the page needs, from the accuracy report."""
    cases = [
        {k: case.get(k) for k in FIELDS} for group in ("medium_high", "low") for case in report["cases"].get(group, [])
    ]
    return {
        "generated_from": "benchmarks/results/accuracy.json (python -m benchmarks.accuracy.run)",
        "summary": report["summary"],
        "cases": cases,
    }


def render(report: dict[str, Any]) -> str:
    return json.dumps(project(report), indent=1, sort_keys=True) + "\n"


def main() -> int:
    text = render(json.loads(REPORT.read_text(encoding="utf-8")))
    TARGET.parent.mkdir(parents=True, exist_ok=True)
    TARGET.write_text(text, encoding="utf-8")
    print(f"wrote {TARGET.relative_to(ROOT)} ({len(json.loads(text)['cases'])} cases)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
