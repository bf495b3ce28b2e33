"""A grid of short real training steps on one GPU, recorded as measured cases (for a lent H200).

Each plan of ``GRID`` is a real transformers/PEFT model built from its catalog config (random weights: no
download, the machine has no network) and trained for a few steps by the node calibration's own step
(services/agent/calibrate.py ``run_calibration``: PEFT LoRA, bitsandbytes NF4, checkpointing, the plan's
autocast, torch AdamW), each in a process of its own so that no peak or cached block carries over. Per plan
it records ``torch.cuda.max_memory_allocated``, ``max_memory_reserved``, the process's peak in nvidia-smi
(sampled while the steps run) and tokens/s, or that the step ran out of memory.

The rows are written in the schema of benchmarks/accuracy/cases.jsonl (source: this project, the commit and
the GPU in the locator), so that ``--merge`` adds them to the cases as measured runs.

Run on the device: ``python -m benchmarks.device.grid --out DIR`` (about 5-8 minutes on one H200; each plan
is bounded by ``--plan-timeout-s``, the whole grid by ``--budget-s``). On a CPU, ``--smoke`` runs one tiny
plan for a step to check the path (no memory figures). ``--merge FILE`` appends a grid's rows to the cases.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "benchmarks" / "accuracy" / "cases.jsonl"
GIB = 2**30
WARMUP_STEPS = 1
TIMED_STEPS = 3
NVIDIA_SMI_INTERVAL_S = 0.05

# Plans that fit one 141 GB H200 with room to spare (the estimate of each is well under 100 GiB), spanning
# the mechanisms the estimator distinguishes: full fine-tuning in bf16 and with fp32 masters, LoRA with and
# without checkpointing, QLoRA on bitsandbytes NF4, short and long rows, tied and untied heads, GQA and MHA.
_TRAINER = {"framework": "hf-trainer", "padding": "max-length", "optimizer": "adamw"}
GRID: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b-full-mixed": {
        "model": "Qwen/Qwen2.5-0.5B",
        "method": "full",
        "precision": "bf16-mixed",
        "micro_batch_size": 8,
        "seq_len": 2048,
        "gradient_checkpointing": False,
    },
    "llama-3.2-1b-full-bf16": {
        "model": "meta-llama/Llama-3.2-1B",
        "method": "full",
        "precision": "bf16",
        "micro_batch_size": 4,
        "seq_len": 1024,
        "gradient_checkpointing": False,
    },
    "llama-3.2-1b-lora-long": {
        "model": "meta-llama/Llama-3.2-1B",
        "method": "lora",
        "lora": {"rank": 16, "targets": "all-linear"},
        "precision": "bf16",
        "micro_batch_size": 8,
        "seq_len": 2048,
        "gradient_checkpointing": False,
    },
    "llama-3.2-3b-full-mixed-ckpt": {
        "model": "meta-llama/Llama-3.2-3B",
        "method": "full",
        "precision": "bf16-mixed",
        "micro_batch_size": 2,
        "seq_len": 2048,
        "gradient_checkpointing": True,
    },
    "llama-3.2-3b-lora-ckpt": {
        "model": "meta-llama/Llama-3.2-3B",
        "method": "lora",
        "lora": {"rank": 16, "targets": "all-linear"},
        "precision": "bf16",
        "micro_batch_size": 4,
        "seq_len": 4096,
        "gradient_checkpointing": True,
    },
    "qwen2.5-7b-lora-ckpt": {
        "model": "Qwen/Qwen2.5-7B",
        "method": "lora",
        "lora": {"rank": 16, "targets": "all-linear"},
        "precision": "bf16",
        "micro_batch_size": 2,
        "seq_len": 2048,
        "gradient_checkpointing": True,
    },
    "qwen2.5-7b-qlora-ckpt": {
        "model": "Qwen/Qwen2.5-7B",
        "method": "qlora",
        "lora": {"rank": 16, "targets": "all-linear"},
        "precision": "bf16",
        "quantization": "nf4",
        "double_quant": True,
        "micro_batch_size": 4,
        "seq_len": 2048,
        "gradient_checkpointing": True,
    },
    "llama-3.1-8b-lora-8k": {
        "model": "meta-llama/Llama-3.1-8B",
        "method": "lora",
        "lora": {"rank": 16, "targets": "all-linear"},
        "precision": "bf16",
        "micro_batch_size": 1,
        "seq_len": 8192,
        "gradient_checkpointing": True,
    },
    "llama-3.1-8b-qlora-nockpt": {
        "model": "meta-llama/Llama-3.1-8B",
        "method": "qlora",
        "lora": {"rank": 16, "targets": "all-linear"},
        "precision": "bf16",
        "quantization": "nf4",
        "double_quant": True,
        "micro_batch_size": 2,
        "seq_len": 2048,
        "gradient_checkpointing": False,
    },
    "llama-3.1-8b-full-bf16-ckpt": {
        "model": "meta-llama/Llama-3.1-8B",
        "method": "full",
        "precision": "bf16",
        "micro_batch_size": 1,
        "seq_len": 2048,
        "gradient_checkpointing": True,
    },
}
# The smoke plan: a tiny Llama that any CPU trains in a second (it checks the path, not a figure).
SMOKE_CONFIG = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "tie_word_embeddings": False,
    "max_position_embeddings": 256,
}
SMOKE = {
    "model": "smoke-tiny-llama",
    "method": "lora",
    "lora": {"rank": 4},
    "precision": "bf16",
    "micro_batch_size": 2,
    "seq_len": 32,
    "gradient_checkpointing": True,
}


def plan_of(name: str) -> Any:
    """The grid entry as a validated plan, its model config from the bundled catalog (or the smoke config)."""
    from services.catalog.models import find_model
    from services.estimator.plan import Plan

    spec = SMOKE if name == "smoke" else GRID[name]
    model = str(spec["model"])
    config = SMOKE_CONFIG if name == "smoke" else find_model(model).config
    fields = {k: v for k, v in spec.items() if k != "model"}
    return Plan.model_validate({**_TRAINER, **fields, "model": {"name": model, "config": config}})


class NvidiaSmiPeak:
    """The largest memory nvidia-smi reports for this process while the block runs (MiB, sampled), or None
    where nvidia-smi is absent or lists no process (a CPU, or a container that hides the PIDs)."""

    def __init__(self, interval_s: float = NVIDIA_SMI_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.peak_mib: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> float | None:
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=5,
                check=True,
            ).stdout
        except (OSError, subprocess.SubprocessError):
            return None
        for line in out.splitlines():
            pid, _, used = line.partition(",")
            if pid.strip() == str(os.getpid()):
                try:
                    return float(used.strip())
                except ValueError:
                    return None
        return None

    def _run(self) -> None:
        while not self._stop.is_set():
            used = self._sample()
            if used is not None:
                self.peak_mib = used if self.peak_mib is None else max(self.peak_mib, used)
            self._stop.wait(self.interval_s)

    def __enter__(self) -> NvidiaSmiPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def measure(name: str, warmup_steps: int = WARMUP_STEPS, timed_steps: int = TIMED_STEPS) -> dict[str, Any]:
    """One grid plan, trained in this process: the calibration step's result, the nvidia-smi peak, or the OOM."""
    import torch

    from services.agent.calibrate import run_calibration

    plan = plan_of(name)
    config = plan.model.config or {}
    started = time.perf_counter()
    try:
        with NvidiaSmiPeak() as smi:
            result = run_calibration(plan, config, warmup_steps, timed_steps)
    except torch.OutOfMemoryError as exc:
        return {"name": name, "oom": True, "error": str(exc).splitlines()[0][:300], "device": _device_name()}
    result.update(
        name=name,
        oom=False,
        nvidia_smi_peak_gib=None if smi.peak_mib is None else round(smi.peak_mib * 2**20 / GIB, 3),
        wall_s=round(time.perf_counter() - started, 1),
        torch=torch.__version__,
        transformers=_version("transformers"),
        peft=_version("peft"),
        bitsandbytes=_version("bitsandbytes"),
    )
    return result


def _device_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def _commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def case_row(result: dict[str, Any], commit: str) -> dict[str, Any]:
    """A measured case in the schema of benchmarks/accuracy/cases.jsonl from one plan's result."""
    name = result["name"]
    plan = plan_of(name)
    device = result.get("device", "unknown")
    allocated = result.get("peak_allocated_gib")
    reserved = result.get("peak_reserved_gib")
    measured: dict[str, Any] = {
        "peak_gib": None if allocated is None else round(allocated, 3),
        "metric": "allocated",
        "oom": bool(result.get("oom")),
        "alt": None if reserved is None else {"metric": "reserved", "peak_gib": round(reserved, 3)},
        "tokens_per_s": None if result.get("oom") else round(result["tokens_per_s"], 1),
        "tokens_per_s_scope": "per_gpu",
        # Every counter of the run (the cases' scoring reads peak_gib and alt; the rest is kept for audits).
        "counters": {
            "allocated": allocated,
            "reserved": reserved,
            "device": result.get("nvidia_smi_peak_gib"),
        },
    }
    versions = ", ".join(f"{k} {result.get(k)}" for k in ("torch", "transformers", "peft", "bitsandbytes"))
    return {
        "id": f"gpuplan-grid-{name}",
        "source": "gpuplan (this project)",
        "locator": f"benchmarks/device/grid.py @{commit} on {device}",
        "plan": plan.model_dump(mode="json", exclude_none=True),
        "measured": measured,
        "gpu": device,
        "confidence": "high",
        "assumptions": (
            f"Measured by this project: {WARMUP_STEPS} warm-up and {TIMED_STEPS} timed steps of the node "
            "calibration's step (services/agent/calibrate.py: transformers model from the catalog config with "
            "random weights, SDPA attention, PEFT LoRA with the Trainer's defaults, bitsandbytes NF4 for QLoRA, "
            "non-reentrant checkpointing, the plan's autocast, torch AdamW), fixed rows of seq_len random "
            "tokens (padding max-length); the peaks are the timed steps' (reset after warm-up); nvidia-smi "
            f"sampled every {NVIDIA_SMI_INTERVAL_S} s for this process ('counters.device'). {versions}. "
            + ("" if not result.get("notes") else "Notes: " + "; ".join(result["notes"]) + ".")
        ),
    }


def run_grid(names: list[str], out: Path, plan_timeout_s: int, budget_s: int) -> list[dict[str, Any]]:
    """Each plan in its own process (a fresh CUDA context and allocator), within the time budget."""
    out.mkdir(parents=True, exist_ok=True)
    commit = _commit()
    rows: list[dict[str, Any]] = []
    deadline = time.monotonic() + budget_s
    raw_path, rows_path = out / "grid_raw.jsonl", out / "grid_rows.jsonl"
    for name in names:
        left = deadline - time.monotonic()
        if left < 20:
            print(f"{name}: skipped, the grid's budget is spent", flush=True)
            continue
        result_file = out / f"{name}.json"
        cmd = [sys.executable, "-m", "benchmarks.device.grid", "--one", name, "--result", str(result_file)]
        try:
            proc = subprocess.run(cmd, cwd=ROOT, timeout=min(plan_timeout_s, left), capture_output=True, text=True)
        except subprocess.TimeoutExpired:
            print(f"{name}: timed out", flush=True)
            continue
        if proc.returncode != 0 or not result_file.exists():
            print(f"{name}: failed ({proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}", flush=True)
            continue
        result = json.loads(result_file.read_text())
        with raw_path.open("a") as f:
            f.write(json.dumps(result) + "\n")
        row = case_row(result, commit)
        rows.append(row)
        with rows_path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        m = row["measured"]
        print(
            f"{name}: {'OOM' if m['oom'] else 'ran'} allocated {m['peak_gib']} GiB, "
            f"reserved {m['alt'] and m['alt']['peak_gib']} GiB, nvidia-smi {m['counters']['device']} GiB, "
            f"{m['tokens_per_s']} tokens/s ({result.get('wall_s')} s)",
            flush=True,
        )
    return rows


def merge(rows_file: Path, cases: Path = CASES) -> int:
    """Append the grid's rows to the cases (a row whose id is there already replaces nothing: it is skipped)."""
    known = {json.loads(line)["id"] for line in cases.read_text().splitlines() if line.strip()}
    new = [line for line in rows_file.read_text().splitlines() if line.strip() and json.loads(line)["id"] not in known]
    with cases.open("a") as f:
        for line in new:
            f.write(line + "\n")
    return len(new)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "benchmarks/results/device")))
    parser.add_argument("--only", nargs="*", choices=sorted(GRID), help="these plans only")
    parser.add_argument("--plan-timeout-s", type=int, default=120)
    parser.add_argument("--budget-s", type=int, default=540, help="the whole grid's wall-clock limit")
    parser.add_argument("--smoke", action="store_true", help="one tiny plan, one step (a CPU check of the path)")
    parser.add_argument("--merge", type=Path, help="append this grid_rows.jsonl to benchmarks/accuracy/cases.jsonl")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.merge is not None:
        print(f"{merge(args.merge)} rows added to {CASES}")
        return 0
    if args.one is not None:
        steps = (1, 1) if args.one == "smoke" else (WARMUP_STEPS, TIMED_STEPS)
        args.result.write_text(json.dumps(measure(args.one, *steps)))
        return 0
    names = ["smoke"] if args.smoke else (args.only or list(GRID))
    rows = run_grid(names, args.out, args.plan_timeout_s, args.budget_s)
    print(f"{len(rows)} of {len(names)} plans recorded in {args.out / 'grid_rows.jsonl'}")
    return 0 if len(rows) == len(names) else 1


if __name__ == "__main__":
    sys.exit(main())
