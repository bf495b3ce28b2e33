"""The precise trace against the analytic estimate (and the measurement, where one exists).

Traces the public cases that ran transformers/PEFT code (the trace runs that code), plus Llama-3.1-8B
plans for the timing, on 2 CPU threads. Run: ``python -m benchmarks.trace.run`` (needs the trace
extra); writes benchmarks/results/trace.json.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from typing import Any

from benchmarks.accuracy.run import load_cases
from services.estimator.plan import Plan

RESULTS = Path(__file__).resolve().parents[1] / "results"
PUBLIC_CASES = ("peft-101", "peft-102", "peft-103", "peft-104", "peft-105", "peft-107")
LLAMA_8B: dict[str, Any] = {
    "model": {"name": "meta-llama/Llama-3.1-8B"},
    "framework": "hf-trainer",
    "micro_batch_size": 2,
    "seq_len": 2048,
    "gradient_checkpointing": True,
}
SYNTHETIC = {
    "llama-3.1-8b-full": {**LLAMA_8B, "method": "full"},
    "llama-3.1-8b-lora": {**LLAMA_8B, "method": "lora", "lora": {"rank": 16}},
    "llama-3.1-8b-qlora": {**LLAMA_8B, "method": "qlora", "lora": {"rank": 16}},
}


def main() -> int:
    try:
        from services.trace.tracer import trace_plan
    except ImportError:
        print("needs the trace extra", file=sys.stderr)
        return 2
    warnings.filterwarnings("ignore")
    cases = {c["id"]: c for c in load_cases()}
    rows = []
    plans = [(cid, cases[cid]["plan"], cases[cid]["measured"]) for cid in PUBLIC_CASES]
    plans += [(name, plan, None) for name, plan in SYNTHETIC.items()]
    for name, data, measured in plans:
        result = trace_plan(Plan.model_validate(data))
        row = {
            "case": name,
            "trace_peak_allocated_gib": result.peak_allocated_gib,
            "analytic_peak_allocated_gib": result.analytic_peak_allocated_gib,
            "disagreement_pct": result.disagreement_pct,
            "measured_gib": None if measured is None else measured["peak_gib"],
            "measured_metric": None if measured is None else measured["metric"],
            "seconds": result.seconds,
            "notes": result.notes,
        }
        rows.append(row)
        line = f"{name:22} trace {row['trace_peak_allocated_gib']:7.2f} GiB"
        line += f"  analytic {row['analytic_peak_allocated_gib']:7.2f} ({row['disagreement_pct']:+.1f}%)"
        line += f"  measured {row['measured_gib']} {row['measured_metric'] or ''}  {row['seconds']:.1f} s"
        print(line)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "trace.json").write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
