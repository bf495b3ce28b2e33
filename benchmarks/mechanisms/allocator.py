"""How much PyTorch's caching allocator reserves beyond the live tensors in steady training steps, by replay.

The estimator's ALLOCATOR_GAP (services/estimator/memory/allocator.py) is what this script writes. It runs
real transformers Llama training steps on the ``meta`` device (shapes and lifetimes as on a GPU, no data),
records every storage the step allocates and when it dies (a ``TorchDispatchMode`` and storage weak
references, polled after each op), and replays that sequence through a model of CUDACachingAllocator's rules
(c10/cuda/CUDACachingAllocator.cpp): sizes rounded to 512 bytes; requests up to 1 MiB from 2 MiB segments
(small pool), up to 10 MiB from 20 MiB segments, larger ones from their own segment rounded to 2 MiB; best
fit by size; a block split when what is left is at least 512 bytes (small pool) or more than 1 MiB (large
pool); adjacent free blocks of a segment merged on free; segments kept, except that a segment that would not
fit first frees every wholly free cached segment and retries (release_cached_blocks). One stream, no
``max_split_size``, no expandable segments.

Attention is emulated as flash attention (it keeps q, k, v, the output and the fp32 log-sum-exp; on
``meta`` SDPA would take the math path and keep the score matrix). Two steps run, so the optimizer states
the first step creates are in the second's segments.

Each row gives two gaps over the allocated peak: the counter gap (reserved peak with memory to spare, what
max_memory_reserved reads) and the fit gap (the least capacity the steps run in, what the allocator cannot
give back). ``derive_gaps`` turns them into ALLOCATOR_GAP: per cell (the unit: kept activations without
checkpointing, one rebuilt block with it; full fine-tuning, whose first AdamW step creates the model's
states in segments the activations freed, or a frozen base), the median ratio to the unit. Results and
figures: benchmarks/results/allocator.json, docs/accuracy.md.

``record_fsdp1_steps`` adds FSDP1's own buffers, each on the stream FSDP allocates it on, around a real full
fine-tuning step (one rank of FULL_SHARD), and the allocator keeps one pool per stream, so the replay shows
what each pool holds (the rows under ``fsdp1``).

Needs the ``trace`` extra (torch, transformers, peft). Run: ``python -m benchmarks.mechanisms.allocator``.
"""

from __future__ import annotations

import bisect
import json
import statistics
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


class OutOfMemory(Exception):
    """A segment the card cannot hold even after every cached free segment was given back."""


class CachingAllocator:
    """The caching allocator's block rules on one stream; ``reserved`` is the sum of its segments. With a
    ``capacity``, a segment that would not fit first makes it give back every cached segment that is wholly
    free and retry (release_cached_blocks), and raises OutOfMemory if it still does not fit."""

    def __init__(self, capacity: int | None = None) -> None:
        # One pool per (stream, small): a block freed goes back to the pool of the stream it was allocated on,
        # and only requests on that stream are served from it (BlockPool per stream: get_free_block).
        self._pools: dict[tuple[int, bool], list[tuple[int, int, int]]] = {}  # (size, segment, offset)
        self._free_blocks: dict[tuple[int, int], _Block] = {}
        self._live: dict[int, tuple[_Block, tuple[int, bool]]] = {}
        self._segment_sizes: dict[int, tuple[int, tuple[int, bool]]] = {}  # segment: (size, pool)
        self.reserved_by_stream: dict[int, int] = {}
        self.peak_reserved_by_stream: dict[int, int] = {}
        self.capacity = capacity
        self.segments = 0
        self.reserved = self.allocated = self.peak_reserved = self.peak_allocated = 0

    def _new_segment(self, size: int, pool: tuple[int, bool]) -> _Block:
        if self.capacity is not None and self.reserved + size > self.capacity:
            wholly_free = [
                (key, block)
                for key, block in self._free_blocks.items()
                if block.offset == 0 and block.size == self._segment_sizes[block.segment][0]
            ]
            for _, block in wholly_free:
                self._take_free(self._segment_sizes[block.segment][1], block)
                freed, (stream, _) = self._segment_sizes.pop(block.segment)
                self.reserved -= freed
                self.reserved_by_stream[stream] -= freed
            if self.reserved + size > self.capacity:
                raise OutOfMemory
        block = _Block(self.segments, 0, size)
        self._segment_sizes[self.segments] = (size, pool)
        self.segments += 1
        self.reserved += size
        stream = pool[0]
        self.reserved_by_stream[stream] = self.reserved_by_stream.get(stream, 0) + size
        self.peak_reserved_by_stream[stream] = max(
            self.peak_reserved_by_stream.get(stream, 0), self.reserved_by_stream[stream]
        )
        return block

    def _add_free(self, pool: tuple[int, bool], block: _Block) -> None:
        bisect.insort(self._pools.setdefault(pool, []), (block.size, block.segment, block.offset))
        self._free_blocks[(block.segment, block.offset)] = block

    def _take_free(self, pool_key: tuple[int, bool], block: _Block) -> None:
        pool = self._pools[pool_key]
        pool.pop(bisect.bisect_left(pool, (block.size, block.segment, block.offset)))
        del self._free_blocks[(block.segment, block.offset)]

    def malloc(self, key: int, nbytes: int, stream: int = 0) -> None:
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        pool_key = (stream, small)
        pool = self._pools.setdefault(pool_key, [])
        i = bisect.bisect_left(pool, (size, -1, -1))
        if i < len(pool):  # best fit: the smallest cached block that is large enough
            block = self._free_blocks[pool[i][1:]]
            self._take_free(pool_key, block)
        else:
            block = self._new_segment(segment_size(size), pool_key)
        left = block.size - size
        splits = left >= MIN_BLOCK if small else left > SMALL_SIZE
        if splits:
            rest = _Block(block.segment, block.offset + size, left, True, block, block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next, block.size = rest, size
            self._add_free(pool_key, rest)
        block.free = False
        self._live[key] = (block, pool_key)
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    @staticmethod
    def _absorb(first: _Block, second: _Block) -> _Block:
        """Merge the free ``second`` into ``first``, the block before it in their segment."""
        first.size += second.size
        first.next = second.next
        if second.next is not None:
            second.next.prev = first
        return first

    def free(self, key: int) -> None:
        block, pool = self._live.pop(key)
        self.allocated -= block.size
        block.free = True
        if block.next is not None and block.next.free:
            self._take_free(pool, block.next)
            block = self._absorb(block, block.next)
        if block.prev is not None and block.prev.free:
            self._take_free(pool, block.prev)
            block = self._absorb(block.prev, block)
        self._add_free(pool, block)

    def replay(self, events: list[tuple[Any, ...]]) -> CachingAllocator:
        """Events ("alloc", key, bytes[, stream]) and ("free", key, 0)."""
        for kind, key, nbytes, *stream in events:
            if kind == "alloc":
                self.malloc(key, nbytes, *stream)
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

        def ignore(self, tensor: Any) -> None:
            """A storage made outside the recording (a parameter whose memory the caller accounts for)."""
            ref = StorageWeakRef(tensor.untyped_storage())
            self._refs.setdefault(ref.cdata, ref)

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


LLAMA_3_8B = {"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8}


@dataclass(frozen=True)
class Step:
    """A training step to replay: LoRA (rank 16 on every projection) or full fine-tuning of a Llama-shaped
    model (``shape``: its widths, Llama-3-8B's by default) cut to ``layers`` layers, bf16, AdamW."""

    method: str
    checkpointing: bool
    tokens: int
    batch: int = 1
    layers: int = 8
    shape: tuple[tuple[str, int], ...] = tuple(LLAMA_3_8B.items())
    precision: str = "bf16"  # "bf16" or "fp32": the dtype of the weights and of the compute
    gpus: int = 1  # above 1: FSDP1 full shard over that many ranks (record_fsdp1_steps)

    def config(self) -> dict[str, Any]:
        widths = dict(self.shape)
        return {"vocab_size": 128256, "tie_word_embeddings": False, **widths, "num_hidden_layers": self.layers}


def record_training_steps(step: Step, steps: int = 2) -> list[tuple[str, int, int]]:
    """The storages ``steps`` training steps allocate and free, in order."""
    import torch
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaForCausalLM

    config = LlamaConfig(**step.config())
    config._attn_implementation = _register_fused_attention()
    with torch.device("meta"):
        model: Any = LlamaForCausalLM(config)
    model = model.to(torch.bfloat16)
    if step.method == "lora":
        from peft import LoraConfig, inject_adapter_in_model

        model.requires_grad_(False)
        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        model = inject_adapter_in_model(LoraConfig(r=16, lora_dropout=0.0, target_modules=targets), model)
        for name, param in model.named_parameters():  # get_peft_model's autocast_adapter_dtype: fp32 adapters
            if "lora_" in name:
                param.data = param.data.float()
    if step.checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if step.method == "lora":
            model.enable_input_require_grads()
    model.train()
    recorder = _recorder()
    for tensor in [*model.parameters(), *model.buffers()]:
        recorder.track(tensor)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, foreach=True)
    ids = torch.zeros(step.batch, step.tokens, dtype=torch.long, device="meta")
    with recorder:
        for _ in range(steps):
            model(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            recorder.poll()
    events: list[tuple[str, int, int]] = recorder.events
    return events


UNSHARD_STREAM, POST_BACKWARD_STREAM = 1, 2


def record_fsdp1_steps(step: Step, steps: int = 2) -> list[tuple[Any, ...]]:
    """Full fine-tuning under FSDP1 FULL_SHARD over ``step.gpus`` ranks, one rank's allocations with their stream.

    The real transformers step runs on ``meta`` (activations and per-parameter gradients as autograd makes
    them); FSDP1's own buffers are added where torch/distributed/fsdp makes them (one unit per decoder layer,
    a root unit of the rest, use_orig_params=False, no MixedPrecision, limit_all_gathers, BACKWARD_PRE):
    - the sharded flat parameters, padded to a multiple of the ranks, are made once (_flat_param.py shard);
    - _runtime_utils._unshard allocates a unit's padded unsharded flat parameter inside
      ``with unshard_stream`` (FlatParamHandle.unshard -> _alloc_padded_unsharded_flat_param), after the rate
      limiter waited on the oldest of two queued free events (_limiter_utils._FreeEventQueue); the block is
      freed on the compute stream after record_stream (_free_unsharded_flat_param), so it returns to the
      unshard stream's pool, and is taken as free when the limiter has waited on its event;
    - the pre-backward hook sits on the unit's outputs (_register_pre_backward_hooks) and prefetches the next
      unit in backward order (BACKWARD_PRE, _prefetch_handle); the root stays unsharded from forward to its
      post-backward (_post_forward_reshard skips the root);
    - the views' gradients are concatenated into the flat parameter's gradient once all arrived (autograd's
      split backward), which _post_backward_hook reduce-scatters into a new shard allocated on the
      post-backward stream (_get_reduce_scatter_tensors: torch.empty_like(chunks[0])); the unsharded gradient
      is record_stream'ed to that stream and taken as free when the next unit's reduce-scatter is issued;
    - AdamW over the flat shards (FlatParameter.__new__ returns a plain nn.Parameter, so
      _default_to_fused_or_foreach picks foreach): states made at the first step, one sqrt temporary per shard.
    """
    import itertools
    from collections import deque

    import torch
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaForCausalLM

    config = LlamaConfig(**step.config())
    config._attn_implementation = _register_fused_attention()
    dtype = torch.float32 if step.precision == "fp32" else torch.bfloat16
    with torch.device("meta"):
        model: Any = LlamaForCausalLM(config)
    model = model.to(dtype)
    if step.checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    recorder = _recorder()
    events: list[tuple[Any, ...]] = recorder.events
    keys = itertools.count(-1, -1)

    def alloc(nbytes: int, stream: int = 0) -> int:
        key = next(keys)
        events.append(("alloc", key, int(nbytes), stream))
        return key

    def free(key: int) -> None:
        events.append(("free", key, 0))

    element = torch.finfo(dtype).bits // 8
    layers = list(model.model.layers)
    in_layers = {id(p) for layer in layers for p in layer.parameters()}
    units = [list(layer.parameters()) for layer in layers]
    units.append([p for p in model.parameters() if id(p) not in in_layers])  # the root unit
    root = len(units) - 1
    padded = [-(-sum(p.numel() for p in unit) // step.gpus) * step.gpus for unit in units]
    unsharded_bytes = [n * element for n in padded]
    shard_bytes = [n // step.gpus * element for n in padded]
    for nbytes in shard_bytes:
        alloc(nbytes)
    for p in model.parameters():  # their memory is the shards and the gathered units above
        recorder.ignore(p)
    queue: deque[int] = deque()
    gathered: dict[int, int] = {}
    grads: dict[int, int] = {}
    state = {"backward": False}
    pending: list[int] = []

    def unshard(u: int) -> None:
        if u in gathered:
            return
        if len(queue) >= 2:
            free(queue.popleft())
        gathered[u] = alloc(unsharded_bytes[u], UNSHARD_STREAM)

    def reshard(u: int) -> None:
        queue.append(gathered.pop(u))

    def pre_backward(u: int) -> None:
        state["backward"] = True
        unshard(u)
        if 0 < u < root:
            unshard(u - 1)

    def post_backward(u: int) -> None:
        reshard(u)
        flat = alloc(unsharded_bytes[u])
        for p in units[u]:
            p.grad = None
        grads[u] = alloc(shard_bytes[u], POST_BACKWARD_STREAM)
        while pending:
            free(pending.pop())
        pending.append(flat)

    def forward_pre_hook(u: int) -> Any:
        def hook(module: Any, args: Any) -> None:
            if not state["backward"]:
                unshard(u)

        return hook

    def forward_hook(u: int) -> Any:
        def hook(module: Any, args: Any, output: Any) -> None:
            if state["backward"]:
                return  # the checkpointed recompute runs inside the unit's backward
            reshard(u)
            out = output[0] if isinstance(output, tuple) else output
            if out.requires_grad:
                out.register_hook(lambda grad: pre_backward(u))

        return hook

    for u, layer in enumerate(layers):
        layer.register_forward_pre_hook(forward_pre_hook(u))
        layer.register_forward_hook(forward_hook(u))
    model.register_forward_pre_hook(lambda module, args: unshard(root))
    for u, unit in enumerate(units):
        seen: set[int] = set()

        def accumulated(p: Any, u: int = u, seen: set[int] = seen) -> None:
            seen.add(id(p))
            if len(seen) == len(units[u]):
                seen.clear()
                post_backward(u)

        for p in unit:
            p.register_post_accumulate_grad_hook(accumulated)
    ids = torch.zeros(step.batch, step.tokens, dtype=torch.long, device="meta")
    states: list[int] = []
    with recorder:
        for _ in range(steps):
            state["backward"] = False
            model(input_ids=ids, labels=ids).loss.backward()
            recorder.poll()
            while pending:  # the step's end: every reduce-scatter and free event has completed
                free(pending.pop())
            while queue:
                free(queue.popleft())
            if not states:
                states = [alloc(nbytes) for nbytes in shard_bytes for _ in range(2)]
            temporaries = [alloc(nbytes) for nbytes in shard_bytes]
            for key in temporaries:
                free(key)
            for u in list(grads):
                free(grads.pop(u))
    return events


def replay_fsdp1_steps(step: Step, steps: int = 2) -> dict[str, Any]:
    """Peaks of FSDP1's recorded steps, by stream, and the smallest card they fit."""
    events = record_fsdp1_steps(step, steps)
    allocator = CachingAllocator().replay(events)
    fits_in = smallest_card(events, allocator.peak_allocated, allocator.peak_reserved + (32 << 20))
    gib = 2**30
    by_stream = allocator.peak_reserved_by_stream
    return {
        "peak_allocated_gib": round(allocator.peak_allocated / gib, 3),
        "peak_reserved_gib": round(allocator.peak_reserved / gib, 3),
        "compute_pool_peak_gib": round(by_stream.get(0, 0) / gib, 3),
        "unshard_pool_peak_gib": round(by_stream.get(UNSHARD_STREAM, 0) / gib, 3),
        "post_backward_pool_peak_gib": round(by_stream.get(POST_BACKWARD_STREAM, 0) / gib, 3),
        "fits_in_gib": round(fits_in / gib, 3),
    }


def smallest_card(events: list[tuple[Any, ...]], low: int, high: int, step: int = 32 << 20) -> int:
    """The least capacity (to ``step``) the steps run in without OutOfMemory, between ``low`` and ``high``."""
    while high - low > step:
        middle = (low + high) // 2
        try:
            CachingAllocator(middle).replay(events)
            high = middle
        except OutOfMemory:
            low = middle
    return high


def replay_training_steps(step: Step, steps: int = 2) -> dict[str, Any]:
    """Peaks of the recorded steps replayed without a memory limit, and the smallest card they fit."""
    events = record_training_steps(step, steps)
    allocator = CachingAllocator().replay(events)
    fits_in = smallest_card(events, allocator.peak_allocated, allocator.peak_reserved + (32 << 20))
    gib = 2**30
    return {
        "method": step.method,
        "checkpointing": step.checkpointing,
        "tokens": step.tokens,
        "batch": step.batch,
        "layers": step.layers,
        "peak_allocated_gib": round(allocator.peak_allocated / gib, 3),
        "peak_reserved_gib": round(allocator.peak_reserved / gib, 3),
        "gap_gib": round((allocator.peak_reserved - allocator.peak_allocated) / gib, 3),
        # What the allocator cannot give back: the least memory the steps fit in, over the allocated peak.
        "fits_in_gib": round(fits_in / gib, 3),
        "unavoidable_gap_gib": round((fits_in - allocator.peak_allocated) / gib, 3),
    }


def estimator_step(step: Step) -> dict[str, float]:
    """The estimator's allocated and reserved peaks (GiB) and one rebuilt block (GiB) for the same step
    (a plain PyTorch loop over the transformers model, flash attention, packed rows)."""
    from services.estimator.architecture import architecture_from_config
    from services.estimator.memory import activation_bytes, fsdp1_stream_pool_bytes, model_states, peak_memory
    from services.estimator.plan import Plan
    from services.estimator.recipe import resolve_recipe

    config = {"model_type": "llama", **step.config()}
    plan = Plan.model_validate(
        {
            "model": {"name": "llama-cut", "config": config},
            "method": step.method,
            "lora": {"rank": 16, "targets": "all-linear", "dropout": 0.0} if step.method == "lora" else None,
            "framework": "pytorch",
            "precision": step.precision,
            "seq_len": step.tokens,
            "gpus": step.gpus,
            "sharding": "fsdp" if step.gpus > 1 else "none",
            "micro_batch_size": step.batch,
            "gradient_checkpointing": step.checkpointing,
            "attention": "flash",
            "padding": "packed",
        }
    )
    arch, recipe = architecture_from_config(config), resolve_recipe(plan)
    memory = peak_memory(plan, arch, recipe)
    acts = activation_bytes(plan, arch, recipe)
    states = model_states(plan, arch, recipe)
    gib = 2**30
    return {
        "allocated_gib": round(memory.peak_allocated / gib, 3),
        "reserved_gib": round(memory.peak_reserved / gib, 3),
        "rebuilt_block_gib": round(acts.recompute / gib, 3),
        "saved_activations_gib": round(acts.saved / gib, 3),
        "optimizer_states_gib": round(states.optimizer_states / gib, 3),
        "counter_reserved_gib": round((memory.peak_reserved + memory.cached_reclaimable) / gib, 3),
        "fsdp1_stream_pool_gib": round(fsdp1_stream_pool_bytes(plan, arch, recipe) / gib, 3),
    }


SHAPES = {
    "llama-3-8b": LLAMA_3_8B,
    "llama-3.2-1b": {
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
    },
    "qwen2.5-7b": {
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
    },
}
# Whole models (every layer, their own vocabularies) for the FSDP1 replays.
FSDP1_SHAPES = {
    "llama-2-7b": {
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "vocab_size": 32000,
    },
    "llama-2-70b": {
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "vocab_size": 32000,
    },
}
# (shape, method, checkpointing, tokens, micro-batch)
SCENARIOS = (
    *((shape, "lora", True, tokens, 1) for shape in SHAPES for tokens in (2048, 8192)),
    *((shape, "full", True, 2048, 1) for shape in SHAPES),
    ("llama-3-8b", "full", True, 8192, 1),
    ("llama-3-8b", "lora", False, 2048, 1),
    ("llama-3-8b", "lora", False, 1024, 4),
    ("llama-3-8b", "full", False, 2048, 1),
    ("llama-3-8b", "full", False, 4096, 1),
    *((shape, method, False, 2048, 1) for shape in ("llama-3.2-1b", "qwen2.5-7b") for method in ("lora", "full")),
)


def gap_cell(method: str, checkpointing: bool) -> str:
    """The cell of services.estimator.memory.allocator.ALLOCATOR_GAP a step falls in: the gap's unit (the kept
    activations without checkpointing, one rebuilt block with it) and whether AdamW's first step creates the
    whole model's states inside segments the step's activations freed (full fine-tuning) or not."""
    return f"{'rebuilt' if checkpointing else 'kept'}/{'full' if method == 'full' else 'frozen'}"


def derive_gaps(rows: list[dict[str, Any]]) -> dict[str, list[float]]:
    """ALLOCATOR_GAP from the replayed rows, by the rule fixed before the accuracy was looked at: per cell, the
    median over its rows of (counter gap, fit gap) / unit, rounded to 2 digits. Counter gap: peak reserved minus
    peak allocated with memory to spare (what max_memory_reserved reads). Fit gap: the least memory the steps
    run in, over the allocated peak (what the allocator cannot give back before an out-of-memory)."""
    cells: dict[str, list[tuple[float, float]]] = {}
    for row in rows:
        unit = row["rebuilt_block_gib"] if row["checkpointing"] else row["saved_activations_gib"]
        ratios = (row["gap_gib"] / unit, row["unavoidable_gap_gib"] / unit)
        cells.setdefault(gap_cell(row["method"], row["checkpointing"]), []).append(ratios)
    return {
        cell: [round(statistics.median(r[0] for r in ratios), 2), round(statistics.median(r[1] for r in ratios), 2)]
        for cell, ratios in sorted(cells.items())
    }


# FSDP1 full fine-tuning, 2048 tokens, one sequence: (shape, layers, precision, ranks, checkpointing).
FSDP1_SCENARIOS = (
    ("llama-3-8b", 8, "bf16", 4, True),
    ("llama-3-8b", 8, "bf16", 16, True),
    ("llama-2-7b", 32, "fp32", 4, True),
    ("llama-2-7b", 32, "fp32", 4, False),
    ("llama-2-70b", 80, "bf16", 16, True),
)


def shape_of(name: str) -> tuple[tuple[str, int], ...]:
    return tuple({**SHAPES, **FSDP1_SHAPES}[name].items())


def shaped(shape: str, method: str, checkpointing: bool, tokens: int, batch: int = 1) -> Step:
    return Step(method, checkpointing, tokens, batch, shape=tuple(SHAPES[shape].items()))


def main() -> int:
    rows = []
    for shape, method, checkpointing, tokens, batch in SCENARIOS:
        step = shaped(shape, method, checkpointing, tokens, batch)
        row = {"shape": shape, **replay_training_steps(step)}
        est = estimator_step(step)
        row.update(
            estimator_allocated_gib=est["allocated_gib"],
            estimator_gap_gib=round(est["reserved_gib"] - est["allocated_gib"], 3),
            rebuilt_block_gib=est["rebuilt_block_gib"],
            saved_activations_gib=est["saved_activations_gib"],
            optimizer_states_gib=est["optimizer_states_gib"],
        )
        if checkpointing:
            row["gap_over_rebuilt_block"] = round(row["gap_gib"] / est["rebuilt_block_gib"], 2)
        rows.append(row)
        print(
            f"{shape} {method} ckpt={checkpointing} {batch}x{tokens}: replayed allocated "
            f"{row['peak_allocated_gib']:.2f} reserved {row['peak_reserved_gib']:.2f} GiB (gap {row['gap_gib']:.2f}, "
            f"unavoidable {row['unavoidable_gap_gib']:.2f}); estimator allocated {est['allocated_gib']:.2f}, gap "
            f"{row['estimator_gap_gib']:.2f}; gap / rebuilt block {row.get('gap_over_rebuilt_block', '-')}"
        )
    fsdp1_rows = []
    for shape, layers, precision, gpus, checkpointing in FSDP1_SCENARIOS:
        step = Step("full", checkpointing, 2048, layers=layers, precision=precision, gpus=gpus, shape=shape_of(shape))
        est = estimator_step(step)
        row = {"shape": shape, "layers": layers, "precision": precision, "gpus": gpus, "checkpointing": checkpointing}
        row.update(replay_fsdp1_steps(step))
        row.update(
            estimator_allocated_gib=est["allocated_gib"],
            estimator_reserved_gib=est["reserved_gib"],
            estimator_counter_reserved_gib=est["counter_reserved_gib"],
            estimator_unshard_pool_gib=est["fsdp1_stream_pool_gib"],
        )
        fsdp1_rows.append(row)
        replayed = " ".join(f"{k[:-4]} {v:.2f}" for k, v in row.items() if k.endswith("_gib"))
        print(f"FSDP1 {shape}/{layers} {precision} x{gpus} ckpt={checkpointing}: {replayed}")
    derived = derive_gaps(rows)
    for cell, (counter, fit) in derived.items():
        print(f"ALLOCATOR_GAP[{cell!r}] = ({counter}, {fit}): counter gap, fit gap per unit")
    RESULTS.mkdir(parents=True, exist_ok=True)
    payload = {"rows": rows, "allocator_gap": derived, "fsdp1": fsdp1_rows}
    (RESULTS / "allocator.json").write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
