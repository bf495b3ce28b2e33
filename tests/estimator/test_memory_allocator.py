"""The caching allocator's share of memory.py: segment sizes from CUDACachingAllocator's constants, the
segment tails of kept activations, and the cache that batches of other lengths leave behind."""

from __future__ import annotations

import pytest

from services.catalog.gpus import find_gpu
from services.estimator.architecture import architecture_from_config
from services.estimator.estimate import cap_cache_to_card, estimate
from services.estimator.memory import (
    ALLOCATOR_GAP,
    activation_bytes,
    activation_rounding_bytes,
    allocator_block_bytes,
    allocator_gap_bytes,
    allocator_segment_bytes,
    logits_bytes,
    peak_memory,
    segment_tail_bytes,
    varying_length_cache_bytes,
)
from services.estimator.recipe import resolve_recipe
from tests.conftest import LLAMA_8B, make_plan

ARCH = architecture_from_config(LLAMA_8B)
MIB = 1 << 20
H, L = 4096, 32


def test_blocks_round_to_512_bytes() -> None:
    assert allocator_block_bytes(1) == 512
    assert allocator_block_bytes(512) == 512
    assert allocator_block_bytes(513) == 1024


def test_segment_sizes_follow_the_allocators_size_classes() -> None:
    # kSmallSize 1 MiB -> kSmallBuffer 2 MiB; below kMinLargeAlloc 10 MiB -> kLargeBuffer 20 MiB;
    # from 10 MiB on, the request rounded up to kRoundLarge 2 MiB.
    assert allocator_segment_bytes(1 * MIB) == 2 * MIB
    assert allocator_segment_bytes(1 * MIB + 1) == 20 * MIB
    assert allocator_segment_bytes(10 * MIB - 1) == 20 * MIB
    assert allocator_segment_bytes(10 * MIB) == 10 * MIB
    assert allocator_segment_bytes(10 * MIB + 1) == 12 * MIB


def test_only_tensors_with_a_segment_of_their_own_leave_a_tail() -> None:
    assert segment_tail_bytes(5 * MIB) == 0  # shares a 20 MiB segment
    assert segment_tail_bytes(16 * MIB) == 0  # a multiple of 2 MiB fills its segment
    assert segment_tail_bytes(16 * MIB + 100) == 18 * MIB - (16 * MIB + 512)


def test_checkpointed_activations_leave_one_tail_per_layer() -> None:
    # Under checkpointing each layer keeps its 16-bit input: tokens x 4096 x 2 bytes.
    at_2048 = make_plan(seq_len=2048, gradient_checkpointing=True)
    assert activation_rounding_bytes(at_2048, ARCH, resolve_recipe(at_2048)) == 0  # exactly 16 MiB
    at_1000 = make_plan(seq_len=1000, gradient_checkpointing=True)
    assert activation_rounding_bytes(at_1000, ARCH, resolve_recipe(at_1000)) == 0  # 7.8 MiB: shared segments
    at_1500 = make_plan(seq_len=1500, gradient_checkpointing=True)
    tensor = 1500 * H * 2  # 12,288,000 bytes, a multiple of 512
    assert activation_rounding_bytes(at_1500, ARCH, resolve_recipe(at_1500)) == L * (12 * MIB - tensor)


def test_fixed_shapes_leave_no_cache_of_other_lengths() -> None:
    for padding in ("packed", "max-length"):
        recipe = resolve_recipe(make_plan(padding=padding))
        assert varying_length_cache_bytes(recipe, 5e9) == 0
    assert varying_length_cache_bytes(resolve_recipe(make_plan(padding="longest")), 5e9) == 5e9


def test_frameworks_default_to_their_data_pipelines_batch_shapes() -> None:
    expected = {
        "hf-trainer": "longest",  # DataCollatorWithPadding / TRL without packing
        "unsloth": "longest",
        "torchtune": "longest",  # packed=False, padded_collate_sft
        "litgpt": "longest",
        "torchtitan": "packed",
        "axolotl": "packed",
        "pytorch": "max-length",
    }
    for framework, padding in expected.items():
        assert resolve_recipe(make_plan(framework=framework)).padding == padding
    assert resolve_recipe(make_plan(framework="torchtune", padding="packed")).padding == "packed"


def test_other_lengths_show_in_the_counters_but_not_in_the_peaks() -> None:
    fields = {"method": "lora", "lora": {"rank": 8}, "seq_len": 4096, "gradient_checkpointing": True}
    varying = make_plan(padding="longest", **fields)
    packed = make_plan(padding="packed", **fields)
    rv, rp = resolve_recipe(varying), resolve_recipe(packed)
    mv, mp = peak_memory(varying, ARCH, rv), peak_memory(packed, ARCH, rp)
    assert mv.peak_allocated == mp.peak_allocated
    assert mv.peak_reserved == mp.peak_reserved
    assert mv.peak_device == mp.peak_device
    # Packed rows leave no cache of other lengths, only the part of the step's gap the counters read
    # with memory to spare beyond what the fit keeps.
    acts = activation_bytes(packed, ARCH, rp)
    counter_gap, fit_gap = allocator_gap_bytes(packed, acts, 0.0)
    assert mp.components["allocator_reserve"] == pytest.approx(fit_gap, rel=1e-9)
    assert mp.cached_reclaimable == pytest.approx(counter_gap - fit_gap, rel=1e-9)
    # One more step's length-dependent memory: the kept activations plus the larger of the loss's two
    # moments and one block's recomputation in backward.
    acts = activation_bytes(varying, ARCH, rv)
    fwd, bwd = logits_bytes(varying, ARCH, rv)
    length_dependent = acts.saved + max(fwd, bwd, acts.recompute + acts.backward_transient)
    # The step peaks at a training moment here, so the whole of it is cache beyond the reserved peak.
    assert mv.peak_moment != "model_load"
    other_lengths = mv.cached_reclaimable - mp.cached_reclaimable
    assert other_lengths == pytest.approx(length_dependent, rel=0.01)


def test_the_cache_never_holds_more_than_the_card_has_left() -> None:
    plan = make_plan(method="lora", lora={"rank": 8}, seq_len=16384, micro_batch_size=2, gradient_checkpointing=True)
    mem = peak_memory(plan, ARCH, resolve_recipe(plan))
    card = find_gpu("A100 80GB")
    room = card.memory_gib * 1024**3 - mem.peak_device
    assert mem.cached_reclaimable > room > 0
    assert cap_cache_to_card(mem, card).cached_reclaimable == pytest.approx(room)
    report = estimate(plan, "A100 80GB")
    assert report.memory.peak_device_gib + report.memory.reclaimable_cache_gib == pytest.approx(80.0, abs=1e-3)


def test_the_allocator_gap_is_what_the_replay_derived() -> None:
    """ALLOCATOR_GAP is the medians benchmarks/mechanisms/allocator.py wrote from its replays, and they
    follow from the rows it wrote by the rule the constant states."""
    import json
    from pathlib import Path

    from benchmarks.mechanisms.allocator import derive_gaps

    result = json.loads((Path(__file__).parents[2] / "benchmarks/results/allocator.json").read_text())
    assert {cell: list(gap) for cell, gap in ALLOCATOR_GAP.items()} == result["allocator_gap"]
    assert derive_gaps(result["rows"]) == result["allocator_gap"]


def test_the_gap_takes_its_unit_from_checkpointing_and_its_cell_from_the_optimizer_states() -> None:
    lora = make_plan(method="lora", lora={"rank": 8}, seq_len=2048, gradient_checkpointing=False)
    acts = activation_bytes(lora, ARCH, resolve_recipe(lora))
    assert allocator_gap_bytes(lora, acts, 1.0) == pytest.approx(
        tuple(g * acts.saved for g in ALLOCATOR_GAP["kept/frozen"])
    )
    full = make_plan(method="full", seq_len=2048, gradient_checkpointing=True)
    acts = activation_bytes(full, ARCH, resolve_recipe(full))
    rebuilt = ALLOCATOR_GAP["rebuilt/full"]
    assert allocator_gap_bytes(full, acts, 1.0) == pytest.approx(tuple(g * acts.recompute for g in rebuilt))
    # States kept off the GPU (CPU offload, paged) are not created in freed segments.
    frozen = ALLOCATOR_GAP["rebuilt/frozen"]
    assert allocator_gap_bytes(full, acts, 0.0) == pytest.approx(tuple(g * acts.recompute for g in frozen))


def test_offloaded_activations_come_back_as_a_rebuild_does_with_checkpointing_or_without() -> None:
    """Under activation offloading each block's saved tensors come back just before its backward, as a checkpointed
    block is rebuilt: the cache gap scales with that block either way. Read as kept activations, the small on-GPU
    stash left no gap, and turning checkpointing on raised the 8B full fine-tune's peak at 8,192 tokens by 4.6 GiB
    (75.9 to 80.4 GiB: one fits an 80 GB card, the other not; a probe of the estimator)."""
    arch = architecture_from_config(LLAMA_8B)
    gaps = []
    for checkpointing in (False, True):
        plan = make_plan(activation_offloading=True, seq_len=8192, gradient_checkpointing=checkpointing)
        recipe = resolve_recipe(plan)
        acts = activation_bytes(plan, arch, recipe)
        assert acts.offloaded > 0
        gaps.append(allocator_gap_bytes(plan, acts, 1.0))
    assert gaps[0] == pytest.approx(gaps[1], rel=0.01) and gaps[0][1] > 2**30
