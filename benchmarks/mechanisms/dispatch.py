"""Kernels per transformer block and the host cost of each, measured on the CPU with the real transformers code.

The estimator's kernel-dispatch floor (services/estimator/throughput.py) is layers x kernels per block x
the host time per kernel: a step cannot be shorter than the time the Python/C++ side takes to issue its
kernels. This script measures both factors on transformers' ``LlamaDecoderLayer`` (bf16, SDPA):

- kernels: every non-view aten op of a forward and of a backward pass with no gradients yet (as after
  ``optimizer.zero_grad()``), counted with ``TorchDispatchMode``, as the difference between a 9-layer and a
  1-layer stack over 8 (so the loss and the rotary table are left out);
- host time per op: the wall-clock of a forward + backward of the same stacks on tensors of 4 tokens x 64
  features, single-threaded, the fastest of several rounds, over the same op difference. At that size the
  CPU kernels themselves take about a microsecond, so the figure is the framework's eager overhead (Python
  module calls, the dispatcher, autograd recording) plus a CPU kernel. On a GPU the kernel runs
  asynchronously and its launch (cudaLaunchKernel, 4-6 us per kernel measured on CUDA 13 by the pegainfer
  launch-overhead study, susun-blog.com "From Launch Overhead to CUDA Graph") takes the CPU kernel's place.

Needs the ``trace`` extra (torch, transformers). Run: ``python -m benchmarks.mechanisms.dispatch``
(writes benchmarks/results/dispatch.json).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[1] / "results"
TOKENS, HIDDEN = 4, 64
ROUNDS, REPEAT = 40, 5
DEEP = 9  # layers of the deeper stack; the per-layer figures are (DEEP - 1)-layer differences


def _count_mode() -> Any:
    from torch.utils._python_dispatch import TorchDispatchMode

    class CountKernels(TorchDispatchMode):
        """Counts aten ops that are not views (a view returns an alias of an input and launches nothing)."""

        def __init__(self) -> None:
            super().__init__()
            self.kernels = 0

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            schema = func._schema
            if schema.is_mutable or not any(r.alias_info for r in schema.returns):
                self.kernels += 1
            return out

    return CountKernels


def _stack(layers: int, dtype: Any) -> tuple[Any, Any]:
    import torch
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    cfg = LlamaConfig(
        hidden_size=HIDDEN,
        intermediate_size=172,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=layers,
        vocab_size=100,
    )
    cfg._attn_implementation = "sdpa"
    blocks = torch.nn.ModuleList([LlamaDecoderLayer(cfg, i) for i in range(layers)]).to(dtype)
    return blocks, LlamaRotaryEmbedding(cfg)


def _forward(blocks: Any, rope: Any, x: Any) -> Any:
    import torch

    positions = torch.arange(x.shape[1]).unsqueeze(0)
    embeddings = rope(x, positions)
    h = x
    for block in blocks:
        out = block(h, position_embeddings=embeddings, attention_mask=None, position_ids=positions)
        h = out[0] if isinstance(out, tuple) else out
    return h.float().sum()


def _counts(blocks: Any, rope: Any, x: Any) -> tuple[int, int]:
    """(forward, backward) non-view aten ops of one training pass over ``blocks``."""
    count_mode = _count_mode()
    forward_mode = count_mode()
    with forward_mode:
        loss = _forward(blocks, rope, x)
    backward_mode = count_mode()
    with backward_mode:
        loss.backward()
    return forward_mode.kernels, backward_mode.kernels


def kernels_per_layer(dtype_name: str) -> tuple[float, float]:
    """(forward, backward) kernels per decoder layer: the deep stack's count less the 1-layer one's, per layer."""
    import torch

    dtype = getattr(torch, dtype_name)
    counts = {}
    for layers in (1, DEEP):
        blocks, rope = _stack(layers, dtype)
        counts[layers] = _counts(blocks, rope, torch.randn(1, TOKENS, HIDDEN, dtype=dtype, requires_grad=True))
    (f1, b1), (fd, bd) = counts[1], counts[DEEP]
    return (fd - f1) / (DEEP - 1), (bd - b1) / (DEEP - 1)


def host_seconds_per_layer(dtype_name: str) -> float:
    """Wall-clock of one layer's forward + backward on tiny tensors: the deep stack's fastest round less the
    1-layer one's, per layer (the fastest round: host overhead is what is left when nothing interferes)."""
    import torch

    dtype = getattr(torch, dtype_name)
    fastest = {}
    for layers in (1, DEEP):
        blocks, rope = _stack(layers, dtype)
        x = torch.randn(1, TOKENS, HIDDEN, dtype=dtype, requires_grad=True)
        for _ in range(5):  # warm-up: first calls initialise caches
            _forward(blocks, rope, x).backward()
            blocks.zero_grad(set_to_none=True)
        rounds = []
        for _ in range(ROUNDS):
            start = time.perf_counter()
            for _ in range(REPEAT):
                # Gradients set to None first, as optimizer.zero_grad() leaves them: the backward assigns
                # them instead of accumulating (9 add kernels per layer more when a step accumulates).
                _forward(blocks, rope, x).backward()
                blocks.zero_grad(set_to_none=True)
            rounds.append((time.perf_counter() - start) / REPEAT)
        fastest[layers] = min(rounds)
    return (fastest[DEEP] - fastest[1]) / (DEEP - 1)


def measure(dtype_name: str) -> dict[str, Any]:
    """Kernels per layer (forward, backward) and host microseconds per kernel for one dtype."""
    forward, backward = kernels_per_layer(dtype_name)
    per_layer = host_seconds_per_layer(dtype_name)
    return {
        "dtype": dtype_name,
        "kernels_per_layer_forward": forward,
        "kernels_per_layer_backward": backward,
        "host_us_per_kernel": round(per_layer / (forward + backward) * 1e6, 2),
        "host_us_per_layer_forward_backward": round(per_layer * 1e6, 1),
    }


def main() -> int:
    import torch

    from services.estimator.throughput import (
        BACKWARD_KERNELS_PER_FORWARD,
        DISPATCH_SECONDS_PER_KERNEL,
        KERNELS_PER_BLOCK_FORWARD,
    )

    torch.set_num_threads(1)
    rows = [measure(d) for d in ("bfloat16", "float32")]
    result = {
        "machine": {"torch": torch.__version__, "threads": 1, "tokens": TOKENS, "hidden": HIDDEN},
        "measured": rows,
        "estimator": {
            "kernels_per_block_forward": KERNELS_PER_BLOCK_FORWARD,
            "kernels_per_block_backward": KERNELS_PER_BLOCK_FORWARD * BACKWARD_KERNELS_PER_FORWARD,
            "dispatch_us_per_kernel": DISPATCH_SECONDS_PER_KERNEL * 1e6,
        },
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "dispatch.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    for row in rows:
        print(
            f"{row['dtype']}: {row['kernels_per_layer_forward']:.0f} kernels forward, "
            f"{row['kernels_per_layer_backward']:.0f} backward per layer; {row['host_us_per_kernel']:.1f} us per kernel"
        )
    print(
        f"estimator: {KERNELS_PER_BLOCK_FORWARD} forward, x{BACKWARD_KERNELS_PER_FORWARD} backward, "
        f"{DISPATCH_SECONDS_PER_KERNEL * 1e6:.0f} us per kernel"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
