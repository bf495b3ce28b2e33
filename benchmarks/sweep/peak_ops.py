"""The storages alive at one sweep config's traced peak, grouped by the op that made them.

The sweep's tracker (MemTracker) says how much of the peak is activations, temporaries or gradients; this says
which tensors they are: every storage an op returns is labelled with the op, its shape and dtype, and at the
highest live total the labels are summed. What existed before the step (weights, optimizer states, the
batch) is one group, "before the step". The total equals the tracker's peak (the same step, the same
storages).

Run: ``python -m benchmarks.sweep.peak_ops llama-3.2-1b-10`` (needs the trace extra).
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from typing import Any

GIB = 2**30
BEFORE = "before the step"


def _peak_recorder() -> Any:
    import torch
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class PeakRecorder(TorchDispatchMode):
        """Live storages with the op that made each; a copy of the labels at the highest live total."""

        def __init__(self) -> None:
            super().__init__()
            self._live: dict[int, tuple[Any, int, str]] = {}
            self.live_bytes = 0
            self.peak_bytes = 0
            self.peak_op = ""
            self.at_peak: list[tuple[int, str]] = []

        def track(self, tensor: Any, label: str = BEFORE) -> None:
            storage = tensor.untyped_storage()
            ref = StorageWeakRef(storage)
            if ref.cdata not in self._live and storage.nbytes():
                self._live[ref.cdata] = (ref, storage.nbytes(), label)
                self.live_bytes += storage.nbytes()

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            for key in [k for k, (ref, _, _) in self._live.items() if ref.expired()]:
                self.live_bytes -= self._live.pop(key)[1]
            name = func.overloadpacket.__name__
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    self.track(t, f"{name} {tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}")
            if self.live_bytes > self.peak_bytes:
                self.peak_bytes, self.peak_op = self.live_bytes, str(func)
                self.at_peak = [(nbytes, label) for _, nbytes, label in self._live.values()]
            return out

        def poll(self) -> None:  # the sweep's recorder interface (benchmarks/mechanisms/allocator.py)
            pass

    return PeakRecorder()


def peak_ops(config_id: str) -> tuple[Any, float, str, list[tuple[str, int, float]]]:
    """The config's trace result, the recorded peak (GiB), the op it came after and, at the peak,
    (label, storages, GiB) by producing op, largest first."""
    from benchmarks.sweep.configs import sweep_configs
    from benchmarks.sweep.run import plan_of
    from services.trace.tracer import trace_plan

    config = next((c for c in sweep_configs() if c.id == config_id), None)
    if config is None:
        raise SystemExit(f"config: no sweep config has the id {config_id!r} (see benchmarks/results/sweep.json)")
    recorder = _peak_recorder()
    result = trace_plan(plan_of(config), recorder=recorder)
    groups: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for nbytes, label in recorder.at_peak:
        groups[label][0] += 1
        groups[label][1] += nbytes / GIB
    ranked = sorted(((k, int(n), gib) for k, (n, gib) in groups.items()), key=lambda row: -row[2])
    return result, recorder.peak_bytes / GIB, recorder.peak_op, ranked


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", help="a sweep config id, e.g. llama-3.2-1b-10")
    parser.add_argument("--min-mib", type=float, default=1.0, help="leave out groups below this size")
    args = parser.parse_args(argv)
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    result, peak_gib, op, ranked = peak_ops(args.config)
    print(f"{args.config}: trace {result.peak_allocated_gib:.3f} GiB {result.breakdown}")
    print(f"analytic {result.analytic_peak_allocated_gib:.3f} GiB; recorded peak {peak_gib:.3f} GiB after {op}")
    for label, count, gib in ranked:
        if gib * 1024 >= args.min_mib:
            print(f"{gib:8.3f} GiB  x{count:<4d} {label}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
