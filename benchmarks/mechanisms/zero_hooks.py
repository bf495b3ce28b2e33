"""DeepSpeed ZeRO's host work per module and per trained tensor, measured on the CPU with the real DeepSpeed.

ZeRO-3 gathers each module's parameters in a hook before the module runs and frees them in a hook after it,
in the forward, in the backward and in a checkpoint's replay; ZeRO-2 and ZeRO-3 also run a hook per trained
parameter in the backward that moves its gradient into the reduce bucket (deepspeed/runtime/zero/
parameter_offload.py and partitioned_param_coordinator.py, stage3.py, stage_1_and_2.py). The hooks are
Python and run on the host for every micro-batch, whatever the number of GPUs: with small tensors per
module they, not the GPU, set the step time (DeepSpeed PR #6649 "module_granularity_threshold" cuts them
for fine-grained models for that reason; TensorAuto/OpenTau issue #177 measured ZeRO-2's backward hooks
at 2.8 s of a 3.4 s step on 8 x A100).

This script runs transformers' ``LlamaDecoderLayer`` stacks (fp32, 4 tokens x 64 features, so the CPU
kernels take about a microsecond) under a DeepSpeed engine on one CPU process (gloo), and without one,
and takes the extra host time per layer (a 9-layer minus a 1-layer stack, the fastest of several rounds)
for: the forward, the backward with frozen weights (ZeRO-3's gather/release only), the backward with
trained weights (plus the gradient hooks) under ZeRO-3, and the same under ZeRO-2. The extra is divided
by the modules a layer calls (counted with a global forward pre-hook: 13 for Llama) or by the trained
tensors per layer (9), and expressed in eager host ops: the plain stack's host time per aten op, measured
in the same run, so the estimator scales it with its own ``HOST_SECONDS_PER_OP`` and the figure does not
depend on how fast this machine is.

Needs the ``trace`` and ``exportcheck`` extras (torch, transformers, deepspeed). Run:
``python -m benchmarks.mechanisms.zero_hooks`` (writes benchmarks/results/zero_hooks.json).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.mechanisms.dispatch import (
    DEEP,
    HIDDEN,
    TOKENS,
    _forward,
    _stack,
    host_seconds_per_layer,
    kernels_per_layer,
)

RESULTS = Path(__file__).resolve().parents[1] / "results"
ROUNDS = 60


class _Stack:
    """A decoder stack with one trained scale on its input, so a backward runs even with frozen blocks."""

    def __init__(self, layers: int, frozen: bool) -> None:
        import torch

        class Model(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.blocks, self.rope = _stack(layers, torch.float32)
                self.scale = torch.nn.Parameter(torch.ones(HIDDEN))

            def forward(self, x: Any) -> Any:
                return _forward(self.blocks, self.rope, x * self.scale)

        self.model = Model()
        if frozen:
            for p in self.model.blocks.parameters():
                p.requires_grad_(False)


def _init_process_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")


def _fastest_pass_seconds(layers: int, frozen: bool, stage: int | None) -> tuple[float, float]:
    """(forward, backward) seconds of one micro-batch, the fastest of ``ROUNDS``; ``stage`` None: no engine."""
    import torch

    model = _Stack(layers, frozen).model
    x = torch.randn(1, TOKENS, HIDDEN)
    if stage is None:
        forward, backward = model, lambda loss: loss.backward()
    else:
        import deepspeed

        _init_process_group()
        config = {
            "train_micro_batch_size_per_gpu": 1,
            # Never an optimizer step: every backward is a micro-step of accumulation, as between steps.
            "gradient_accumulation_steps": 10**6,
            "zero_optimization": {"stage": stage},
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
        }
        trained = [p for p in model.parameters() if p.requires_grad]
        engine, *_ = deepspeed.initialize(model=model, model_parameters=trained, config=config)
        forward, backward = engine, engine.backward
    best_f = best_b = float("inf")
    for i in range(ROUNDS + 5):  # the first 5 warm caches up
        start = time.perf_counter()
        loss = forward(x)
        middle = time.perf_counter()
        backward(loss)
        end = time.perf_counter()
        if i >= 5:
            best_f, best_b = min(best_f, middle - start), min(best_b, end - middle)
    return best_f, best_b


def _per_layer(frozen: bool, stage: int | None) -> tuple[float, float]:
    """(forward, backward) seconds per decoder layer: the deep stack's less the 1-layer stack's, per layer."""
    f1, b1 = _fastest_pass_seconds(1, frozen, stage)
    fd, bd = _fastest_pass_seconds(DEEP, frozen, stage)
    return (fd - f1) / (DEEP - 1), (bd - b1) / (DEEP - 1)


def modules_called_per_layer(lora: bool = False) -> float:
    """Modules whose forward runs per decoder layer (ZeRO-3 hooks every one), counted by a global pre-hook;
    ``lora``: with PEFT LoRA adapters (dropout 0.05) on all seven linears."""
    import torch

    counts = {}
    for layers in (1, DEEP):
        model: Any = _Stack(layers, frozen=False).model
        if lora:
            from peft import LoraConfig, inject_adapter_in_model

            targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
            model = inject_adapter_in_model(LoraConfig(r=8, lora_dropout=0.05, target_modules=targets), model)
        calls = 0

        def count(_module: Any, _args: Any) -> None:
            nonlocal calls
            calls += 1

        handle = torch.nn.modules.module.register_module_forward_pre_hook(count)
        try:
            model(torch.randn(1, TOKENS, HIDDEN))
        finally:
            handle.remove()
        counts[layers] = calls
    return (counts[DEEP] - counts[1]) / (DEEP - 1)


def trained_tensors_per_layer() -> int:
    return sum(1 for _ in _Stack(1, frozen=False).model.blocks[0].parameters())


def measure() -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    forward_ops, backward_ops = kernels_per_layer("float32")
    plain_full = _per_layer(frozen=False, stage=None)
    plain_frozen = _per_layer(frozen=True, stage=None)
    # Host seconds per eager op on this machine, from the dispatch benchmark's steadier timing.
    op_s = host_seconds_per_layer("float32") / (forward_ops + backward_ops)
    z3_full = _per_layer(frozen=False, stage=3)
    z3_frozen = _per_layer(frozen=True, stage=3)
    z2_full = _per_layer(frozen=False, stage=2)
    modules = modules_called_per_layer()
    tensors = trained_tensors_per_layer()
    z3_forward = ((z3_full[0] - plain_full[0]) + (z3_frozen[0] - plain_frozen[0])) / 2
    z3_backward_frozen = z3_frozen[1] - plain_frozen[1]
    z3_grad_hooks = (z3_full[1] - plain_full[1]) - z3_backward_frozen
    z2_grad_hooks = z2_full[1] - plain_full[1]
    return {
        "host_us_per_op": round(op_s * 1e6, 2),
        "modules_called_per_layer": modules,
        "trained_tensors_per_layer": tensors,
        "extra_us_per_layer": {
            "zero3_forward": round(z3_forward * 1e6, 1),
            "zero3_backward_frozen": round(z3_backward_frozen * 1e6, 1),
            "zero3_gradient_hooks": round(z3_grad_hooks * 1e6, 1),
            "zero2_gradient_hooks": round(z2_grad_hooks * 1e6, 1),
        },
        "host_ops": {
            "zero3_per_module_forward": round(z3_forward / modules / op_s, 1),
            "zero3_per_module_backward": round(z3_backward_frozen / modules / op_s, 1),
            "zero3_per_trained_tensor_backward": round(z3_grad_hooks / tensors / op_s, 1),
            "zero2_per_trained_tensor_backward": round(z2_grad_hooks / tensors / op_s, 1),
        },
    }


def main() -> int:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    import deepspeed
    import torch

    from services.estimator.throughput import (
        ZERO2_HOST_OPS_PER_TRAINED_TENSOR,
        ZERO3_HOST_OPS_PER_MODULE_BACKWARD,
        ZERO3_HOST_OPS_PER_MODULE_FORWARD,
        ZERO3_HOST_OPS_PER_TRAINED_TENSOR,
    )

    rows = [measure() for _ in range(3)]
    result = {
        "machine": {"torch": torch.__version__, "deepspeed": deepspeed.__version__, "threads": 1, "tokens": TOKENS},
        "runs": rows,
        "estimator": {
            "zero3_per_module_forward": ZERO3_HOST_OPS_PER_MODULE_FORWARD,
            "zero3_per_module_backward": ZERO3_HOST_OPS_PER_MODULE_BACKWARD,
            "zero3_per_trained_tensor_backward": ZERO3_HOST_OPS_PER_TRAINED_TENSOR,
            "zero2_per_trained_tensor_backward": ZERO2_HOST_OPS_PER_TRAINED_TENSOR,
        },
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "zero_hooks.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    for row in rows:
        print(
            f"{row['host_us_per_op']} us per op, {row['modules_called_per_layer']:.0f} modules per layer:",
            row["host_ops"],
        )
    print("estimator:", result["estimator"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
