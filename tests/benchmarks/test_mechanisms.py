"""The per-layer activation rules against real transformers/PEFT code (needs the trace extra)."""

from __future__ import annotations

import pytest

from tests.conftest import require_trace_extra


@pytest.mark.slow
def test_activation_rules_match_transformers_within_10_percent() -> None:
    require_trace_extra()
    from benchmarks.mechanisms.run import SCENARIOS, measure_scenario

    for scenario in SCENARIOS:
        row = measure_scenario(*scenario)
        assert abs(row["error_pct"]) <= 10, row


def test_gemma2_logit_softcap_keeps_one_more_logits_tensor() -> None:
    """Gemma 2's tanh(logits / cap) * cap keeps the tanh output: what the estimator adds for it is what autograd
    saves in transformers' Gemma2ForCausalLM (a one-layer model with and without final_logit_softcapping)."""
    require_trace_extra()
    from benchmarks.mechanisms.run import final_softcap_saved_bytes_per_token

    measured, predicted = final_softcap_saved_bytes_per_token()
    assert measured > 0
    assert predicted == pytest.approx(measured, rel=0.02)


def test_kernels_per_block_match_a_transformers_llama_layer() -> None:
    """The kernel counts behind the dispatch floor, counted on the real LlamaDecoderLayer (no timing here:
    the host time per kernel is a benchmark, python -m benchmarks.mechanisms.dispatch)."""
    require_trace_extra()
    from benchmarks.mechanisms.dispatch import kernels_per_layer
    from services.estimator.throughput import BACKWARD_KERNELS_PER_FORWARD, KERNELS_PER_BLOCK_FORWARD

    for dtype in ("float32", "bfloat16"):
        forward, backward = kernels_per_layer(dtype)
        assert forward == pytest.approx(KERNELS_PER_BLOCK_FORWARD, rel=0.1), (dtype, forward)
        assert backward / forward == pytest.approx(BACKWARD_KERNELS_PER_FORWARD, rel=0.1), (dtype, backward)


def test_elementwise_bytes_per_width_match_a_transformers_llama_layer() -> None:
    """The estimator's element-wise bytes per token per unit of width are the counts of the real LlamaDecoderLayer's
    non-matmul aten ops (and of ForCausalLMLoss), in each precision, and they are linear in the widths."""
    require_trace_extra()
    from benchmarks.mechanisms.elementwise import (
        coefficients,
        gelu_new_bytes_per_element,
        loss_bytes_per_vocab_entry,
        per_token_per_layer,
        predicted,
    )
    from services.estimator.elementwise import (
        EAGER_BLOCK_BYTES,
        EAGER_LOSS_BYTES_PER_VOCAB_ENTRY,
        PYTHON_GELU_BYTES,
    )

    for precision, table in EAGER_BLOCK_BYTES.items():
        measured = coefficients(precision)
        assert measured["hidden/layer/trained"] == measured["hidden/layer/frozen"]
        expected = {
            "hidden/rms/trained": measured["hidden/rms/trained"],
            "hidden/rms/frozen": measured["hidden/rms/frozen"],
            "hidden/layer": measured["hidden/layer/trained"],
            "intermediate": measured["intermediate"],
            "rotary": measured["query"],
            "eager_scores": measured["eager_scores"],
        }
        assert measured["key_value"] == measured["query"], precision
        for key, value in expected.items():
            assert table[key] == pytest.approx(value), (precision, key)
        # A shape off the measured axes: within the cos/sin reads left out (560 B per token at head_dim 64, 1.1%
        # of this 384-wide block, 0.3% of a 2048-wide one).
        off_axis = (384, 768, 6, 3)
        assert per_token_per_layer(off_axis, precision, True) == pytest.approx(predicted(measured, off_axis), rel=0.02)
        assert gelu_new_bytes_per_element(precision) == pytest.approx(PYTHON_GELU_BYTES[precision]), precision
    assert loss_bytes_per_vocab_entry() == pytest.approx(EAGER_LOSS_BYTES_PER_VOCAB_ENTRY)


def test_zero_hook_counts_match_transformers_and_peft_modules() -> None:
    """ZeRO-3 runs its hooks around every module call: the estimator's count of modules a block calls, and
    of those PEFT's LoRA adds, against a transformers Llama layer with and without adapters (the host time
    per hook is a benchmark, python -m benchmarks.mechanisms.zero_hooks)."""
    require_trace_extra()
    from benchmarks.mechanisms.zero_hooks import modules_called_per_layer, trained_tensors_per_layer
    from services.estimator.architecture import architecture_from_config
    from services.estimator.plan import Plan
    from services.estimator.recipe import resolve_recipe
    from services.estimator.throughput import BLOCK_CONTAINER_MODULES, PEFT_MODULES_PER_ADAPTED_LINEAR
    from services.estimator.throughput.kernels import _hooked

    plain = modules_called_per_layer()
    assert plain == BLOCK_CONTAINER_MODULES + 7 + 2
    assert (modules_called_per_layer(lora=True) - plain) / 7 == PEFT_MODULES_PER_ADAPTED_LINEAR
    config = {
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 172,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 3,
        "vocab_size": 100,
    }
    arch = architecture_from_config(config)
    for method, modules, tensors in (("full", plain, trained_tensors_per_layer()), ("lora", plain + 28, 14)):
        plan = Plan.model_validate(
            {
                "model": {"name": "tiny", "config": config},
                "method": method,
                "framework": "hf-trainer",
                "sharding": "zero3",
                "gpus": 2,
                "lora": {"rank": 8, "targets": "all-linear"} if method == "lora" else None,
            }
        )
        recipe, full = resolve_recipe(plan), method == "full"
        assert _hooked(arch, () if full else recipe.lora_targets, full) == (3 * modules, 3 * tensors), method


def test_the_allocator_model_follows_the_caching_allocator_rules() -> None:
    """Segments of 20 MiB for requests under 10 MiB, their own (rounded to 2 MiB) above; best fit; split
    when more than 1 MiB is left (large pool) or 512 bytes (small pool); neighbours merged on free."""
    from benchmarks.mechanisms.allocator import CachingAllocator

    mib = 1 << 20
    a = CachingAllocator()
    a.malloc(1, 3 * mib)
    a.malloc(2, 5 * mib)  # carved from the same 20 MiB segment
    assert (a.reserved, a.allocated) == (20 * mib, 8 * mib)
    a.free(1)
    a.malloc(3, int(12.5 * mib))  # no cached block is large enough: its own 14 MiB segment
    assert a.reserved == 34 * mib and a.segments == 2
    a.free(2)  # merges with the free 3 MiB before it and the 12 MiB after it
    a.malloc(4, 20 * mib)
    assert a.reserved == 34 * mib  # the whole first segment, merged again, serves it
    a.malloc(5, 100)  # the small pool: a 2 MiB segment, 512 bytes taken
    assert (a.reserved, a.allocated) == (36 * mib, int(12.5 * mib) + 20 * mib + 512)


def test_replayed_steps_peak_where_the_estimator_says_and_reserve_its_gap() -> None:
    """Real transformers/PEFT steps on meta tensors (two steps, so AdamW's states exist) reach the estimator's
    allocated peak, and the rows the replay makes give back the ALLOCATOR_GAP it wrote (python -m
    benchmarks.mechanisms.allocator runs every shape and method)."""
    require_trace_extra()
    import json

    from benchmarks.mechanisms.allocator import RESULTS, Step, estimator_step, replay_training_steps, shaped

    two_layers = Step("full", True, 2048, layers=2)
    full = replay_training_steps(two_layers)
    assert full["peak_allocated_gib"] == pytest.approx(estimator_step(two_layers)["allocated_gib"], rel=0.02)
    step = shaped("llama-3.2-1b", "lora", True, 2048)
    lora = replay_training_steps(step)
    est = estimator_step(step)
    assert lora["peak_allocated_gib"] == pytest.approx(est["allocated_gib"], rel=0.02)
    stored = {
        (r["shape"], r["method"], r["checkpointing"], r["tokens"], r["batch"]): r
        for r in json.loads((RESULTS / "allocator.json").read_text())["rows"]
    }[("llama-3.2-1b", "lora", True, 2048, 1)]
    assert (lora["gap_gib"], lora["unavoidable_gap_gib"]) == (stored["gap_gib"], stored["unavoidable_gap_gib"])


def test_zero3_gathers_one_collective_per_module_deepspeed_partitions() -> None:
    """DeepSpeed ZeRO-3 fetches each submodule's partitioned parameters with one coalesced all-gather: the
    estimator's gathers per pass against the modules of a transformers Llama-3.1-8B layer (meta device) whose
    own parameters reach the installed DeepSpeed's default persistence threshold."""
    require_trace_extra()
    import torch
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    from services.catalog.models import find_model
    from services.estimator.architecture import architecture_from_config
    from services.estimator.communication import ZERO3_PERSISTENCE_THRESHOLD, zero3_gathers_per_pass

    threshold = DeepSpeedZeroConfig().param_persistence_threshold
    assert threshold == ZERO3_PERSISTENCE_THRESHOLD
    config = find_model("meta-llama/Llama-3.1-8B").config
    with torch.device("meta"):
        layer = LlamaDecoderLayer(LlamaConfig(**config), 0)
    partitioned = sum(1 for m in layer.modules() if sum(p.numel() for p in m.parameters(recurse=False)) >= threshold)
    arch = architecture_from_config(config)
    assert zero3_gathers_per_pass(arch) == partitioned * arch.num_layers


def test_eager_attention_and_gemma_norms_match_transformers_within_2_percent() -> None:
    """Eager attention keeps q, k, v and its score matrices but no output or log-sum-exp, and Gemma's RMSNorm
    keeps its fp32 product for a trained weight: the per-layer rules against transformers' Llama (eager) and
    Gemma 2 (eager, soft-capped) layers."""
    require_trace_extra()
    from benchmarks.mechanisms.run import SCENARIOS, measure_scenario

    chosen = [s for s in SCENARIOS if s[0] == "llama full eager" or s[0].startswith("gemma2")]
    assert len(chosen) == 3
    for scenario in chosen:
        row = measure_scenario(*scenario)
        assert abs(row["error_pct"]) <= 2, row


def test_fsdp1s_unshard_pool_holds_the_root_and_three_units_and_its_reduce_scatter_pool_only_shards() -> None:
    """FSDP1's buffers placed where torch/distributed/fsdp allocates them (record_fsdp1_steps) around a real
    transformers step: the unshard stream's pool peaks at the root plus three units (in use, prefetched,
    awaiting the rate limiter), as fsdp1_stream_pool_bytes says; the post-backward pool at the sharded
    gradients (no unit-sized cast without a separate reduce dtype)."""
    require_trace_extra()
    from benchmarks.mechanisms.allocator import Step, estimator_step, replay_fsdp1_steps

    step = Step("full", True, 512, layers=4, gpus=4)
    replayed, est = replay_fsdp1_steps(step), estimator_step(step)
    assert replayed["unshard_pool_peak_gib"] == pytest.approx(est["fsdp1_stream_pool_gib"], rel=0.01)
    params = 4 * 218_112_000 + 2 * 128_256 * 4096 + 4096  # four Llama-3-8B blocks, embeddings, head, norm
    assert replayed["post_backward_pool_peak_gib"] == pytest.approx(params * 2 / 4 / 2**30, rel=0.01)
