"""How much PyTorch's caching allocator reserves beyond the live tensors in steady training steps, by replay.

The estimator adds ``FRAGMENTATION_OF_DYNAMIC`` (15% of the memory that churns within a step) between the
allocated and the reserved peak (services/estimator/memory.py). This script checks that figure without a
GPU: it runs real transformers Llama training steps on the ``meta`` device (shapes and lifetimes as on a
GPU, no data), records every storage the step allocates and when it dies (a ``TorchDispatchMode`` and
storage weak references, polled after each op), and replays that sequence through a model of
CUDACachingAllocator's rules (c10/cuda/CUDACachingAllocator.cpp): sizes rounded to 512 bytes; requests up
to 1 MiB from 2 MiB segments (small pool), up to 10 MiB from 20 MiB segments, larger ones from their own
segment rounded to 2 MiB; best fit by size; a block split when what is left is at least 512 bytes (small
pool) or more than 1 MiB (large pool); adjacent free blocks of a segment merged on free; segments never
returned. One stream, no ``max_split_size``, no expandable segments.

Attention is emulated as flash attention (it keeps q, k, v, the output and the fp32 log-sum-exp; on
``meta`` SDPA would take the math path and keep the score matrix). Two steps run, so the optimizer states
the first step creates are in the second's segments.

Findings (benchmarks/results/allocator.json, Llama-3-8B-shaped steps cut to 8 layers, LoRA adapters in
fp32 as get_peft_model makes them):

- The replayed allocated peak of the real transformers/PEFT code equals the estimator's within 0.4% for
  LoRA and full fine-tuning at 2048 tokens, and the estimator is 3-4% above it for full fine-tuning at
  4096-8192 tokens.
- The reserved-over-allocated gap depends on the step far more than the estimator's 15% of the churning
  memory says: about 1.7 times one block's rebuilt activations under checkpointing (twice the
  estimator's gap for LoRA), about 0.17 times the kept activations without it (0.7 of the estimator's),
  and 11.7 GiB for full fine-tuning with checkpointing at 8192 tokens, where AdamW's states, created in
  the first step inside the freed activation segments, push the second step's activations into new ones
  (the estimator: 2.0 GiB).
- Putting those ratios in the estimator as they are lowers the medium + high median (7.3% -> 6.7%) but
  raises the p90 (19.7% -> 24.4%) and predicts five runs that ran not to fit: near the card's limit the
  allocator frees its cached segments and retries instead of growing, which a replay with unlimited
  memory does not do. The estimator keeps its 15% until a replay under the card's limit (or a GPU)
  separates the cache a run can give back from the fragmentation it cannot.

Needs the ``trace`` extra (torch, transformers, peft). Run: ``python -m benchmarks.mechanisms.allocator``.
"""

from __future__ import annotations

import bisect
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[1] / "results"
MIN_BLOCK = 512  # kMinBlockSize
SMALL_SIZE = 1 << 20  # kSmallSize
SMALL_BUFFER = 2 << 20  # kSmallBuffer
MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc
LARGE_BUFFER = 20 << 20  # kLargeBuffer
ROUND_LARGE = 2 << 20  # kRoundLarge


def round_size(nbytes: int) -> int:
    return MIN_BLOCK if nbytes < MIN_BLOCK else MIN_BLOCK * -(-nbytes // MIN_BLOCK)


def segment_size(size: int) -> int:
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * -(-size // ROUND_LARGE)


@dataclass(eq=False)
class _Block:
    segment: int
    offset: int
    size: int
    free: bool = True
    prev: _Block | None = None
    next: _Block | None = None


class CachingAllocator:
    """The caching allocator's block rules on one stream; ``reserved`` is the sum of its segments."""

    def __init__(self) -> None:
        self._pools: dict[bool, list[tuple[int, int, int]]] = {True: [], False: []}  # (size, segment, offset)
        self._free_blocks: dict[tuple[int, int], _Block] = {}
        self._live: dict[int, tuple[_Block, bool]] = {}
        self.segments = 0
        self.reserved = self.allocated = self.peak_reserved = self.peak_allocated = 0

    def _add_free(self, small: bool, block: _Block) -> None:
        bisect.insort(self._pools[small], (block.size, block.segment, block.offset))
        self._free_blocks[(block.segment, block.offset)] = block

    def _take_free(self, small: bool, block: _Block) -> None:
        pool = self._pools[small]
        pool.pop(bisect.bisect_left(pool, (block.size, block.segment, block.offset)))
        del self._free_blocks[(block.segment, block.offset)]

    def malloc(self, key: int, nbytes: int) -> None:
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        pool = self._pools[small]
        i = bisect.bisect_left(pool, (size, -1, -1))
        if i < len(pool):  # best fit: the smallest cached block that is large enough
            block = self._free_blocks[pool[i][1:]]
            self._take_free(small, block)
        else:
            block = _Block(self.segments, 0, segment_size(size))
            self.segments += 1
            self.reserved += block.size
        left = block.size - size
        splits = left >= MIN_BLOCK if small else left > SMALL_SIZE
        if splits:
            rest = _Block(block.segment, block.offset + size, left, True, block, block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next, block.size = rest, size
            self._add_free(small, rest)
        block.free = False
        self._live[key] = (block, small)
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    def free(self, key: int) -> None:
        block, small = self._live.pop(key)
        self.allocated -= block.size
        block.free = True
        if block.next is not None and block.next.free:
            after = block.next
            self._take_free(small, after)
            block.size += after.size
            block.next = after.next
            if after.next is not None:
                after.next.prev = block
        if block.prev is not None and block.prev.free:
            before = block.prev
            self._take_free(small, before)
            before.size += block.size
            before.next = block.next
            if block.next is not None:
                block.next.prev = before
            block = before
        self._add_free(small, block)

    def replay(self, events: list[tuple[str, int, int]]) -> CachingAllocator:
        for kind, key, nbytes in events:
            if kind == "alloc":
                self.malloc(key, nbytes)
            elif key in self._live:
                self.free(key)
        return self


def _recorder() -> Any:
    import torch
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class Recorder(TorchDispatchMode):
        """Every new storage an op returns ("alloc") and, polled after each op, every one that died ("free")."""

        def __init__(self) -> None:
            super().__init__()
            self.events: list[tuple[str, int, int]] = []
            self._refs: dict[int, Any] = {}

        def track(self, tensor: Any) -> None:
            storage = tensor.untyped_storage()
            ref = StorageWeakRef(storage)
            if ref.cdata not in self._refs and storage.nbytes():
                self._refs[ref.cdata] = ref
                self.events.append(("alloc", ref.cdata, storage.nbytes()))

        def poll(self) -> None:
            for key in [k for k, ref in self._refs.items() if ref.expired()]:
                del self._refs[key]
                self.events.append(("free", key, 0))

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            self.poll()
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    self.track(t)
            return out

    return Recorder()


def _register_fused_attention() -> str:
    import torch
    from transformers import AttentionInterface

    class FlashLike(torch.autograd.Function):
        """What flash attention keeps and returns, without computing anything (meta tensors)."""

        @staticmethod
        def forward(ctx: Any, q: Any, k: Any, v: Any) -> Any:
            out = torch.empty_like(q)
            ctx.save_for_backward(q, k, v, out, q.new_empty(q.shape[:-1], dtype=torch.float32))
            return out

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            q, k, v, _, _ = ctx.saved_tensors
            return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    def attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, **kwargs: Any) -> Any:
        return FlashLike.apply(query, key, value).transpose(1, 2).contiguous(), None

    name = "gpuplan_fused_attention"  # a name with "flash" in it makes transformers look for a hub kernel
    AttentionInterface.register(name, attention)
    return name


def replay_training_steps(
    method: str, checkpointing: bool, tokens: int, batch: int = 1, layers: int = 8, steps: int = 2
) -> dict[str, Any]:
    """Peaks of ``steps`` training steps of a Llama-3-8B-shaped model cut to ``layers`` layers (bf16, AdamW)."""
    import torch
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=4096,
        intermediate_size=14336,
        num_attention_heads=32,
        num_key_value_heads=8,
        num_hidden_layers=layers,
        vocab_size=128256,
        tie_word_embeddings=False,
    )
    config._attn_implementation = _register_fused_attention()
    with torch.device("meta"):
        model: Any = LlamaForCausalLM(config)
    model = model.to(torch.bfloat16)
    if method == "lora":
        from peft import LoraConfig, inject_adapter_in_model

        model.requires_grad_(False)
        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        model = inject_adapter_in_model(LoraConfig(r=16, lora_dropout=0.0, target_modules=targets), model)
        for name, param in model.named_parameters():  # get_peft_model's autocast_adapter_dtype: fp32 adapters
            if "lora_" in name:
                param.data = param.data.float()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if method == "lora":
            model.enable_input_require_grads()
    model.train()
    recorder = _recorder()
    for tensor in [*model.parameters(), *model.buffers()]:
        recorder.track(tensor)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, foreach=True)
    ids = torch.zeros(batch, tokens, dtype=torch.long, device="meta")
    with recorder:
        for _ in range(steps):
            model(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            recorder.poll()
    allocator = CachingAllocator().replay(recorder.events)
    gib = 2**30
    return {
        "method": method,
        "checkpointing": checkpointing,
        "tokens": tokens,
        "batch": batch,
        "layers": layers,
        "peak_allocated_gib": round(allocator.peak_allocated / gib, 3),
        "peak_reserved_gib": round(allocator.peak_reserved / gib, 3),
        "gap_gib": round((allocator.peak_reserved - allocator.peak_allocated) / gib, 3),
    }


def estimator_peaks_gib(
    method: str, checkpointing: bool, tokens: int, batch: int = 1, layers: int = 8
) -> tuple[float, float]:
    """The estimator's (allocated, reserved) peaks for the same step (pytorch loop, flash, packed rows)."""
    from services.estimator.architecture import architecture_from_config
    from services.estimator.memory import peak_memory
    from services.estimator.plan import Plan
    from services.estimator.recipe import resolve_recipe

    config = {
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "num_hidden_layers": layers,
        "vocab_size": 128256,
        "tie_word_embeddings": False,
    }
    plan = Plan.model_validate(
        {
            "model": {"name": "llama-3-8b-cut", "config": config},
            "method": method,
            "lora": {"rank": 16, "targets": "all-linear", "dropout": 0.0} if method == "lora" else None,
            "framework": "pytorch",
            "precision": "bf16",
            "seq_len": tokens,
            "micro_batch_size": batch,
            "gradient_checkpointing": checkpointing,
            "attention": "flash",
            "padding": "packed",
        }
    )
    memory = peak_memory(plan, architecture_from_config(config), resolve_recipe(plan))
    return round(memory.peak_allocated / 2**30, 3), round(memory.peak_reserved / 2**30, 3)


SCENARIOS = (
    ("lora", True, 2048, 1),
    ("lora", True, 8192, 1),
    ("lora", False, 2048, 1),
    ("lora", False, 4096, 1),
    ("lora", False, 1024, 4),
    ("full", True, 2048, 1),
    ("full", True, 8192, 1),
    ("full", False, 2048, 1),
    ("full", False, 4096, 1),
)


def main() -> int:
    rows = []
    for method, checkpointing, tokens, batch in SCENARIOS:
        row = replay_training_steps(method, checkpointing, tokens, batch)
        allocated, reserved = estimator_peaks_gib(method, checkpointing, tokens, batch)
        row.update(estimator_allocated_gib=allocated, estimator_gap_gib=round(reserved - allocated, 3))
        rows.append(row)
        print(
            f"{method} ckpt={checkpointing} {batch}x{tokens}: replayed allocated {row['peak_allocated_gib']:.2f} "
            f"reserved {row['peak_reserved_gib']:.2f} GiB (gap {row['gap_gib']:.2f}); estimator allocated "
            f"{allocated:.2f} GiB, gap {row['estimator_gap_gib']:.2f} GiB"
        )
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "allocator.json").write_text(json.dumps({"rows": rows}, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
