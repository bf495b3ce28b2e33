"""One test (at least) per memory term, each against a hand computation from its mechanism."""

from __future__ import annotations

from typing import get_args

import pytest

from services.estimator.architecture import architecture_from_config, parameter_counts
from services.estimator.memory import (
    ADAM8BIT_STATE_BYTES,
    GIB,
    GPTQ_BYTES,
    NF4_BNB_BYTES,
    NF4_DOUBLE_QUANT_BYTES,
    activation_bytes,
    adapter_params,
    block_saved_bytes_per_token,
    bnb_dequantize_bytes,
    dequantized_weight_bytes,
    gptq_dequantized_bytes,
    logits_bytes,
    model_states,
    peak_memory,
    quantization_load_bytes,
    quantized_params,
    sharded_working_bytes,
    weight_bytes,
)
from services.estimator.plan import Framework
from services.estimator.recipe import resolve_recipe
from tests.conftest import LLAMA_8B, make_plan

ARCH = architecture_from_config(LLAMA_8B)
TOTAL = parameter_counts(ARCH).total  # 8,030,261,248
H, INTER, V, L = 4096, 14336, 128256, 32


def test_weights_by_precision() -> None:
    for precision, per in (("bf16", 2), ("fp16", 2), ("fp32", 4), ("bf16-mixed", 4)):
        plan = make_plan(precision=precision)
        assert weight_bytes(plan, ARCH, resolve_recipe(plan))[0] == TOTAL * per


def test_nf4_weights_include_quantization_constants() -> None:
    plan = make_plan(method="qlora", lora={"rank": 8})
    recipe = resolve_recipe(plan)
    q = quantized_params(ARCH, recipe)
    assert q == L * (2 * H * H + 2 * H * 1024 + 3 * H * INTER)  # every block linear, not the head
    # The Trainer's QLoRA recipe runs PEFT's prepare_model_for_kbit_training: what is not 4-bit is fp32.
    expected = q * NF4_BNB_BYTES + (TOTAL - q) * 4
    assert weight_bytes(plan, ARCH, recipe)[0] == pytest.approx(expected)
    torchtune = make_plan(method="qlora", lora={"rank": 8}, framework="torchtune")
    assert weight_bytes(torchtune, ARCH, resolve_recipe(torchtune))[0] == pytest.approx(
        q * NF4_DOUBLE_QUANT_BYTES + (TOTAL - q) * 2
    )
    assert NF4_DOUBLE_QUANT_BYTES < NF4_BNB_BYTES


def test_int8_weights_are_one_byte() -> None:
    plan = make_plan(method="qlora", quantization="int8", lora={"rank": 8})
    recipe = resolve_recipe(plan)
    q = quantized_params(ARCH, recipe)
    # LLM.int8() (bitsandbytes Int8Params): one byte per weight and an fp32 scale per output row (SCB):
    # q, k, v, o, gate, up and down have H + 1024 + 1024 + H + INTER + INTER + H rows in each layer.
    row_scales = L * (3 * H + 2 * 1024 + 2 * INTER) * 4
    assert weight_bytes(plan, ARCH, recipe)[0] == pytest.approx(q * 1.0 + row_scales + (TOTAL - q) * 4)


def test_lora_adapter_parameters_for_rank_and_targets() -> None:
    plan = make_plan(method="lora", lora={"rank": 16, "targets": ["q", "v"]})
    assert adapter_params(ARCH, resolve_recipe(plan)) == L * 16 * ((H + H) + (H + 1024))
    all_linear = make_plan(method="lora", lora={"rank": 16, "targets": "all-linear"})
    per_layer = 16 * ((H + H) + 2 * (H + 1024) + (H + H) + 2 * (H + INTER) + (INTER + H))
    assert adapter_params(ARCH, resolve_recipe(all_linear)) == L * per_layer
    with_head = make_plan(method="lora", lora={"rank": 16, "targets": ["lm_head"]})
    assert adapter_params(ARCH, resolve_recipe(with_head)) == 16 * (H + V)


def test_full_finetune_states_pure_bf16_adamw() -> None:
    plan = make_plan(precision="bf16", optimizer="adamw", framework="torchtune")
    s = model_states(plan, ARCH, resolve_recipe(plan))
    assert s.gradients == TOTAL * 2
    assert s.optimizer_states == TOTAL * 4  # exp_avg + exp_avg_sq in bf16
    assert s.master_weights == 0
    assert s.optimizer_temporaries < TOTAL  # fused AdamW: only one tensor's worth


def test_mixed_precision_keeps_fp32_states_and_grads() -> None:
    plan = make_plan(precision="bf16-mixed")
    s = model_states(plan, ARCH, resolve_recipe(plan))
    assert s.weights == TOTAL * 4
    assert s.gradients == TOTAL * 4
    assert s.optimizer_states == TOTAL * 8


def test_foreach_adamw_needs_a_temporary_the_size_of_the_states() -> None:
    plan = make_plan(optimizer_impl="foreach")
    s = model_states(plan, ARCH, resolve_recipe(plan))
    assert s.optimizer_temporaries == TOTAL * 2


def test_eight_bit_and_paged_optimizers() -> None:
    eight = make_plan(optimizer="adamw-8bit")
    assert model_states(eight, ARCH, resolve_recipe(eight)).optimizer_states == pytest.approx(
        TOTAL * 2 * ADAM8BIT_STATE_BYTES
    )
    paged = make_plan(optimizer="paged-adamw")
    s = model_states(paged, ARCH, resolve_recipe(paged))
    assert s.optimizer_states == 0
    assert s.optimizer_states_paged == TOTAL * 8


def test_sgd_and_adafactor_are_smaller_than_adam() -> None:
    adam = make_plan()
    sgd = make_plan(optimizer="sgd")
    ada = make_plan(optimizer="adafactor")
    adam_states = model_states(adam, ARCH, resolve_recipe(adam)).optimizer_states
    assert model_states(sgd, ARCH, resolve_recipe(sgd)).optimizer_states == adam_states / 2
    assert model_states(ada, ARCH, resolve_recipe(ada)).optimizer_states < adam_states / 100


def test_optimizer_in_backward_keeps_one_gradient_at_a_time() -> None:
    plain = make_plan(framework="torchtune")
    fused = make_plan(framework="torchtune", optimizer_in_backward=True)
    a = peak_memory(plain, ARCH, resolve_recipe(plain))
    b = peak_memory(fused, ARCH, resolve_recipe(fused))
    assert b.peak_allocated < a.peak_allocated
    assert model_states(fused, ARCH, resolve_recipe(fused)).largest_gradient == V * H * 2


def test_zero_stages_shard_what_they_should() -> None:
    base = make_plan(gpus=4, precision="bf16-mixed")
    s0 = model_states(base, ARCH, resolve_recipe(base))
    assert s0.ddp_buckets == TOTAL * 4  # DDP without sharding keeps bucket copies of the gradients
    # DeepSpeed casts a -mixed model to bf16 and keeps the fp32 copy as master weights in its optimizer
    # (engine.py _configure_distributed_model), so every stage holds 16-bit weights.
    z1 = make_plan(gpus=4, precision="bf16-mixed", sharding="zero1")
    z2 = make_plan(gpus=4, precision="bf16-mixed", sharding="zero2")
    z3 = make_plan(gpus=4, precision="bf16-mixed", sharding="zero3")
    s1, s2, s3 = (model_states(p, ARCH, resolve_recipe(p)) for p in (z1, z2, z3))
    for s in (s1, s2, s3):
        assert s.optimizer_states == TOTAL * 8 / 4 and s.master_weights == TOTAL * 4 / 4
        assert s.optimizer_temporaries < TOTAL * 4 / 4 / 10  # FusedAdam: no whole-model temporary
    assert s1.weights == s2.weights == TOTAL * 2 and s3.weights == TOTAL * 2 / 4
    assert s1.gradients == TOTAL * (2 + 4)  # stage 1 shards only optimizer states
    assert s2.gradients == TOTAL * (2 + 4) / 4
    # Stage 3 frees the 16-bit gradients bucket by bucket: 18 bytes per parameter / GPUs in all.
    assert s3.gradients == TOTAL * 4 / 4
    assert s3.weights + s3.master_weights + s3.gradients + s3.optimizer_states == TOTAL * 18 / 4
    # bf16 at stage 1 runs DeepSpeed's BF16_Optimizer (engine.py _do_optimizer_sanity_check), whose fp32 gradient
    # buffer is whole (above); fp16 runs the stage-1 ZeRO optimizer, which makes fp32 only of its own partition.
    for precision in ("fp16", "fp16-mixed"):
        fp16 = make_plan(gpus=4, precision=precision, sharding="zero1")
        assert model_states(fp16, ARCH, resolve_recipe(fp16)).gradients == TOTAL * 2 + TOTAL * 4 / 4


def test_deepspeed_bf16_keeps_fp32_master_weights() -> None:
    plan = make_plan(gpus=8, precision="bf16", sharding="zero2")
    s = model_states(plan, ARCH, resolve_recipe(plan))
    assert s.master_weights == TOTAL * 4 / 8
    assert s.optimizer_states == TOTAL * 8 / 8


def test_cpu_offload_moves_states_off_the_gpu() -> None:
    plan = make_plan(gpus=8, sharding="fsdp", cpu_offload=True)
    s = model_states(plan, ARCH, resolve_recipe(plan))
    assert s.weights == 0 and s.optimizer_states == 0 and s.gradients == 0
    fwd, bwd = sharded_working_bytes(plan, ARCH, resolve_recipe(plan))
    assert 0 < fwd <= bwd


def test_fsdp_gathers_two_blocks_and_the_root() -> None:
    plan = make_plan(gpus=8, sharding="fsdp", framework="torchtune")
    fwd, _ = sharded_working_bytes(plan, ARCH, resolve_recipe(plan))
    block = ARCH.largest_block_params * 2
    assert fwd == 2 * block + (V * H * 2) * 2


def test_activation_saves_of_a_llama_block_full_finetune() -> None:
    plan = make_plan(framework="torchtune", seq_len=1024)
    saves = block_saved_bytes_per_token(ARCH.blocks[0], ARCH, plan, resolve_recipe(plan), 1024)
    assert saves["norms"] == 2 * H * (4 + 2)  # fp32 upcast input + normalized output for the weight grad
    assert saves["attention_qkv_out"] == 2 * 128 * (2 * 32 + 2 * 32) + 4 * 32  # k/v expanded to 32 heads
    assert saves["mlp_hidden"] == 3 * 2 * INTER
    assert saves["mlp_down_input"] == 2 * INTER
    assert saves["attention_input"] == saves["mlp_input"] == 2 * H


def test_frozen_layers_do_not_keep_their_inputs() -> None:
    plan = make_plan(method="lora", framework="torchtune", lora={"rank": 8, "targets": ["q", "v"]})
    saves = block_saved_bytes_per_token(ARCH.blocks[0], ARCH, plan, resolve_recipe(plan), 1024)
    assert "mlp_down_input" not in saves and "attention_output_proj_input" not in saves
    assert saves["attention_input"] == 2 * H  # shared by q and v adapters


def test_bitsandbytes_layers_keep_their_inputs_torchao_does_not() -> None:
    bnb = make_plan(method="qlora", lora={"rank": 8, "targets": ["q", "v"]}, framework="litgpt")
    ao = make_plan(method="qlora", lora={"rank": 8, "targets": ["q", "v"]}, framework="torchtune")
    bnb_saves = block_saved_bytes_per_token(ARCH.blocks[0], ARCH, bnb, resolve_recipe(bnb), 512)
    ao_saves = block_saved_bytes_per_token(ARCH.blocks[0], ARCH, ao, resolve_recipe(ao), 512)
    assert bnb_saves["mlp_down_input"] == 2 * INTER
    assert "mlp_down_input" not in ao_saves


def test_peft_fp32_adapters_keep_their_own_copy_of_the_input() -> None:
    # A plain loop (no autocast): PEFT casts the input to fp32 for each adapted module.
    plain = make_plan(method="lora", lora={"rank": 8, "targets": ["q"]}, framework="pytorch")
    saves = block_saved_bytes_per_token(ARCH.blocks[0], ARCH, plain, resolve_recipe(plain), 512)
    assert saves["lora"] == 8 * 4 + H * 4
    # The Trainer with bf16 autocast: the adapter's matmul keeps a 16-bit copy.
    trainer = make_plan(method="lora", lora={"rank": 8, "targets": ["q"]}, framework="hf-trainer")
    saves = block_saved_bytes_per_token(ARCH.blocks[0], ARCH, trainer, resolve_recipe(trainer), 512)
    assert saves["lora"] == 8 * 2 + H * 2
    # torchtune keeps adapters in the model dtype: they share the base layer's input.
    shared = make_plan(method="lora", lora={"rank": 8, "targets": ["q"]}, framework="torchtune")
    saves = block_saved_bytes_per_token(ARCH.blocks[0], ARCH, shared, resolve_recipe(shared), 512)
    assert saves["lora"] == 8 * 2


def test_the_recipe_says_when_the_forward_runs_under_autocast() -> None:
    # The -mixed precisions, and the Trainer's bf16 on a bf16 model (accelerate wraps its forward); the trace
    # follows this flag (services/trace/tracer.py).
    assert resolve_recipe(make_plan(precision="bf16", framework="hf-trainer")).autocast
    assert resolve_recipe(make_plan(precision="bf16-mixed", framework="pytorch")).autocast
    assert not resolve_recipe(make_plan(precision="bf16", framework="pytorch")).autocast
    assert not resolve_recipe(make_plan(precision="fp32", framework="hf-trainer")).autocast


def test_eager_attention_keeps_the_score_matrix() -> None:
    sdpa = make_plan(seq_len=2048)
    eager = make_plan(seq_len=2048, attention="eager")
    a = block_saved_bytes_per_token(ARCH.blocks[0], ARCH, sdpa, resolve_recipe(sdpa), 2048)
    b = block_saved_bytes_per_token(ARCH.blocks[0], ARCH, eager, resolve_recipe(eager), 2048)
    assert b["attention_scores"] == 32 * 2048 * (4 + 2)
    assert "attention_scores" not in a


def test_checkpointing_keeps_only_block_inputs() -> None:
    plan = make_plan(gradient_checkpointing=True, micro_batch_size=2, seq_len=1024)
    acts = activation_bytes(plan, ARCH, resolve_recipe(plan))
    tokens = 2048
    per_block_input = 2 * H * tokens
    final = tokens * H * (4 + 2)
    assert acts.saved == pytest.approx(L * per_block_input + final)
    assert acts.recompute > 0


def test_logits_standard_loss_is_three_fp32_copies_in_backward() -> None:
    plan = make_plan(micro_batch_size=1, seq_len=1000)
    fwd, bwd = logits_bytes(plan, ARCH, resolve_recipe(plan))
    assert fwd == 1000 * V * (2 + 4 + 4)
    assert bwd == 1000 * V * 12
    chunked = make_plan(micro_batch_size=1, seq_len=1000, loss="chunked")
    assert logits_bytes(chunked, ARCH, resolve_recipe(chunked))[1] < bwd
    # A fused linear cross-entropy never holds the whole micro-batch's logits: the input gradient it
    # computes in forward, one chunk of logits as large as the hidden states, an fp32 loss per token.
    fused = make_plan(micro_batch_size=1, seq_len=1000, loss="fused")
    hidden = 1000 * 4096 * 2
    assert logits_bytes(fused, ARCH, resolve_recipe(fused)) == (2 * hidden + 4000, hidden + 4000)


def test_inference_kv_cache() -> None:
    plan = make_plan(mode="inference", micro_batch_size=4, seq_len=8192)
    mem = peak_memory(plan, ARCH, resolve_recipe(plan))
    kv = 2 * L * 8 * 128 * 8192 * 4 * 2
    assert mem.components["kv_cache"] == kv
    assert mem.components["weights"] == TOTAL * 2
    fp8 = make_plan(mode="inference", micro_batch_size=4, seq_len=8192, kv_cache_dtype="fp8")
    assert peak_memory(fp8, ARCH, resolve_recipe(fp8)).components["kv_cache"] == kv / 2


def test_peaks_are_ordered_and_breakdown_adds_up() -> None:
    plan = make_plan(method="lora", lora={"rank": 16}, micro_batch_size=2, seq_len=2048)
    mem = peak_memory(plan, ARCH, resolve_recipe(plan))
    assert mem.peak_allocated < mem.peak_reserved < mem.peak_device
    assert sum(mem.components.values()) == pytest.approx(mem.peak_device)
    assert mem.peak_device - mem.peak_reserved >= 0.5 * GIB


def test_gradient_accumulation_keeps_gradients_through_the_forward() -> None:
    once = make_plan(gradient_accumulation_steps=1, framework="torchtune")
    accum = make_plan(gradient_accumulation_steps=8, framework="torchtune")
    a = peak_memory(once, ARCH, resolve_recipe(once))
    b = peak_memory(accum, ARCH, resolve_recipe(accum))
    assert b.moments["end_of_forward"] - a.moments["end_of_forward"] == pytest.approx(TOTAL * 2)


def test_gpt_neox_block_matches_the_measured_transformers_saves() -> None:
    # benchmarks/mechanisms measured transformers' GPT-NeoX: both LayerNorms read the same input (kept
    # once, 2 B/h), q/k/v/out are tensors of their own, GELU keeps its input.
    neox = architecture_from_config(
        {
            "model_type": "gpt_neox",
            "hidden_size": 512,
            "intermediate_size": 2048,
            "num_hidden_layers": 2,
            "num_attention_heads": 8,
            "vocab_size": 1000,
        }
    )
    plan = make_plan(framework="pytorch")
    saves = block_saved_bytes_per_token(neox.blocks[0], neox, plan, resolve_recipe(plan), 128)
    assert saves["norms"] == 2 * 512
    assert saves["attention_qkv_out"] == 4 * 2 * 512 + 4 * 8
    assert saves["mlp_hidden"] == saves["mlp_down_input"] == 2 * 2048


def test_litgpt_lora_on_q_and_v_keeps_the_zero_pad_source() -> None:
    # Measured on LitGPT's LoRAQKVLinear with saved_tensors_hooks: index_copy keeps B's output.
    mha = architecture_from_config(
        {
            "model_type": "llama",
            "hidden_size": 512,
            "intermediate_size": 1376,
            "num_hidden_layers": 2,
            "num_attention_heads": 8,
            "vocab_size": 1000,
        }
    )
    plan = make_plan(framework="litgpt", method="lora", lora={"rank": 8, "targets": ["q", "v"], "dropout": 0.05})
    saves = block_saved_bytes_per_token(mha.blocks[0], mha, plan, resolve_recipe(plan), 256)
    h = 512
    # norms 2x fp32 input; q, k, fused qkv (kept by the v view), out, lse; one dropout (mask + output)
    # for the fused layer, A's output for q and v, the zero_pad source (q and v widths); SwiGLU 3 x I.
    expected = 2 * 4 * h + (2 * h + 2 * h + 6 * h + 2 * h + 4 * 8) + (3 * h + 2 * 8 * 2 + 2 * 2 * h) + 3 * 2 * 1376
    assert sum(saves.values()) == expected


def test_autocast_keeps_16_bit_weight_copies() -> None:
    mixed = make_plan(precision="bf16-mixed", framework="litgpt", method="lora", lora={"rank": 8})
    pure = make_plan(precision="bf16", framework="litgpt", method="lora", lora={"rank": 8})
    a = peak_memory(mixed, ARCH, resolve_recipe(mixed))
    b = peak_memory(pure, ARCH, resolve_recipe(pure))
    matmul = L * (2 * H * H + 2 * H * 1024 + 3 * H * INTER) + V * H
    assert a.components["autocast_weight_copies"] == matmul * 2
    assert "autocast_weight_copies" not in b.components
    sharded = make_plan(precision="bf16-mixed", gpus=8, sharding="fsdp")
    assert "autocast_weight_copies" not in peak_memory(sharded, ARCH, resolve_recipe(sharded)).components


def test_fsdp1_flat_parameters_give_frozen_weights_gradients() -> None:
    # Lightning's FSDP1 (use_orig_params=True) grads the whole FlatParameter; with no_sync accumulation
    # they stay unsharded. torchtune's FSDP2 grads only the adapters.
    lit = make_plan(framework="litgpt", method="lora", lora={"rank": 8}, gpus=2, sharding="fsdp")
    tune = make_plan(framework="torchtune", method="lora", lora={"rank": 8}, gpus=2, sharding="fsdp")
    assert model_states(lit, ARCH, resolve_recipe(lit)).gradients > TOTAL * 2
    assert model_states(tune, ARCH, resolve_recipe(tune)).gradients < TOTAL * 0.01


def test_compile_drops_the_norm_upcasts_and_the_activation_output() -> None:
    eager = make_plan(framework="torchtune", seq_len=1024)
    compiled = make_plan(framework="torchtune", seq_len=1024, compile=True)
    a = block_saved_bytes_per_token(ARCH.blocks[0], ARCH, eager, resolve_recipe(eager), 1024)
    b = block_saved_bytes_per_token(ARCH.blocks[0], ARCH, compiled, resolve_recipe(compiled), 1024)
    assert b["norms"] == 2 * (2 * H + 4)  # 16-bit input + fp32 rstd per norm, no fp32 copy
    assert b["mlp_hidden"] == 2 * 2 * INTER  # gate and up outputs; act(gate) is recomputed
    # Matmul inputs and the attention kernel's tensors are not pointwise: they stay.
    for key in ("attention_input", "attention_qkv_out", "mlp_down_input"):
        assert b[key] == a[key]
    # About 70% of the eager saves, as inductor measured on a torchtune-style block (0.71 on the CPU).
    assert 0.6 < sum(b.values()) / sum(a.values()) < 0.8


def test_compiled_chunked_loss_keeps_only_the_16_bit_logits() -> None:
    plan = make_plan(framework="torchtune", micro_batch_size=1, seq_len=1000, compile=True)
    fwd, bwd = logits_bytes(plan, ARCH, resolve_recipe(plan))
    assert fwd == 1000 * V * 2
    assert bwd == 1000 * V * 2 + 1000 / 8 * V * 2  # plus one chunk's 16-bit gradient
    eager = make_plan(framework="torchtune", micro_batch_size=1, seq_len=1000)
    assert logits_bytes(eager, ARCH, resolve_recipe(eager))[0] > 2.9 * fwd  # the fp32 log-probabilities
    # The decoder's fp32 upcast is outside the compiled region: the standard loss keeps it as its input.
    standard = make_plan(framework="torchtune", micro_batch_size=1, seq_len=1000, compile=True, loss="standard")
    assert logits_bytes(standard, ARCH, resolve_recipe(standard)) == (1000 * V * (2 + 4), 1000 * V * 8)
    # torchtitan of late 2024 (0.0.2) compiled the blocks only: its loss is unchanged by compile.
    titan = make_plan(framework="torchtitan", micro_batch_size=1, seq_len=1000, compile=True, framework_version="0.0.2")
    titan_eager = make_plan(framework="torchtitan", micro_batch_size=1, seq_len=1000, framework_version="0.0.2")
    assert logits_bytes(titan, ARCH, resolve_recipe(titan)) == logits_bytes(
        titan_eager, ARCH, resolve_recipe(titan_eager)
    )


def test_activation_offloading_leaves_the_stash_and_one_block_on_the_gpu() -> None:
    fields = {"framework": "torchtune", "micro_batch_size": 2, "seq_len": 4096}
    tokens = 2 * 4096
    ckpt = make_plan(gradient_checkpointing=True, activation_offloading=True, **fields)
    acts = activation_bytes(ckpt, ARCH, resolve_recipe(ckpt))
    block_input = 2 * H * tokens
    head_input = 2 * H * tokens  # full fine-tune: the head's input stays (torchtune's NoOpManager)
    # torchtune's OffloadActivations(max_fwd_stash_size=5): five block inputs may still be on the GPU,
    # their host copies in flight (torchtune/training/_activation_offloading.py), written out here so a
    # change of the estimator's constant shows up as a failure.
    stash_tensors = 5
    assert acts.saved == pytest.approx(stash_tensors * block_input + head_input)
    assert acts.offloaded == pytest.approx(L * block_input + tokens * H * 4)  # block inputs + final norm
    assert acts.refetched == pytest.approx(block_input)
    plain = make_plan(gradient_checkpointing=True, **fields)
    assert activation_bytes(plain, ARCH, resolve_recipe(plain)).saved > 5 * acts.saved
    # Without checkpointing, backward brings one whole block back at a time: about the per-layer working set.
    off = make_plan(activation_offloading=True, **fields)
    kept = make_plan(**fields)
    a_off = activation_bytes(off, ARCH, resolve_recipe(off))
    a_kept = activation_bytes(kept, ARCH, resolve_recipe(kept))
    assert a_off.refetched == pytest.approx(sum(a_off.per_layer_per_token.values()) * tokens)
    assert a_off.saved < a_kept.saved / 10
    peak_off = peak_memory(off, ARCH, resolve_recipe(off))
    peak_kept = peak_memory(kept, ARCH, resolve_recipe(kept))
    assert peak_off.peak_allocated < peak_kept.peak_allocated - 0.8 * a_kept.saved


def test_litgpt_holds_a_tied_head_as_a_second_matrix() -> None:
    tied = {**LLAMA_8B, "tie_word_embeddings": True}
    arch = architecture_from_config(tied)
    fields = {"model": {"config": tied}, "method": "lora", "lora": {"rank": 8}}
    litgpt = make_plan(framework="litgpt", **fields)
    trainer = make_plan(framework="hf-trainer", **fields)
    extra = (
        model_states(litgpt, arch, resolve_recipe(litgpt)).weights
        - model_states(trainer, arch, resolve_recipe(trainer)).weights
    )
    assert extra == V * H * 2  # the converter copies wte into lm_head.weight


def test_bitsandbytes_dequantizes_the_whole_weight_for_each_matmul() -> None:
    # LitGPT quantizes the head too, and Lightning's plugin quantizes from fp16: fp16 copy + bf16 cast.
    litgpt = make_plan(framework="litgpt", method="qlora", lora={"rank": 8})
    head, block = bnb_dequantize_bytes(litgpt, ARCH, resolve_recipe(litgpt))
    assert head == V * H * (2 + 2)
    assert block == INTER * H * (2 + 2)
    # transformers quantizes in the load dtype and keeps the head in 16-bit: one bf16 copy of a block linear.
    trainer = make_plan(framework="hf-trainer", method="qlora", lora={"rank": 8})
    assert bnb_dequantize_bytes(trainer, ARCH, resolve_recipe(trainer)) == (0.0, INTER * H * 2)
    # torchao's NF4 (torchtune) and unquantized plans have no such copy here.
    torchtune = make_plan(framework="torchtune", method="qlora", lora={"rank": 8})
    assert bnb_dequantize_bytes(torchtune, ARCH, resolve_recipe(torchtune)) == (0.0, 0.0)
    peak = peak_memory(litgpt, ARCH, resolve_recipe(litgpt))
    assert peak.peak_moment in ("end_of_forward", "start_of_backward")
    assert peak.components["dequantized_weights"] == head


def test_whole_tensor_nf4_quantization_peaks_at_load() -> None:
    fields = {"framework": "torchtune", "method": "qlora", "lora": {"rank": 8}, "gradient_checkpointing": True}
    old = make_plan(nf4_quantization="whole-tensor", seq_len=512, **fields)
    new = make_plan(seq_len=512, **fields)
    largest = INTER * H  # the MLP projections are the biggest quantized matrices (the head stays 16-bit)
    # torchao 0.1: 16 comparisons per element at once, 72 bytes/element measured in pytorch/ao PR #315.
    assert quantization_load_bytes(old, ARCH, resolve_recipe(old)) == pytest.approx(largest * (2 + 70))
    # Chunked (torchao >= 0.2): the 16-bit weight plus one 1M-element chunk's working set.
    assert quantization_load_bytes(new, ARCH, resolve_recipe(new)) == pytest.approx(largest * 2 + 1024**2 * 70)
    peak_old = peak_memory(old, ARCH, resolve_recipe(old))
    assert peak_old.peak_moment == "model_load"
    assert peak_memory(new, ARCH, resolve_recipe(new)).peak_moment != "model_load"
    assert make_plan().nf4_quantization is None
    with pytest.raises(ValueError, match="nf4_quantization"):
        make_plan(nf4_quantization="chunked")  # a 16-bit base is not quantized


def test_a_gptq_checkpoint_keeps_the_copies_autograd_saves() -> None:
    """GPTQ: a block's 16-bit copies live through its backward under checkpointing (every block's without),
    the checkpoint loads quantized (no quantization temporaries) and stores 4.16 bits per weight."""
    gptq_config = {**LLAMA_8B, "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128}}
    fields = {"method": "qlora", "quantization": "nf4", "lora": {"rank": 8}, "seq_len": 1024}
    arch = architecture_from_config(gptq_config)
    ckpt = make_plan(model={"name": "m", "config": gptq_config}, gradient_checkpointing=True, **fields)
    plain = make_plan(model={"name": "m", "config": gptq_config}, **fields)
    recipe = resolve_recipe(ckpt)
    h, f, kv = 4096, 14336, 1024
    block = 2 * h * h + 2 * h * kv + 3 * h * f
    assert gptq_dequantized_bytes(ckpt, arch, recipe) == (0.0, 2 * block + 3 * h * f)
    q = quantized_params(arch, recipe)
    assert q == 32 * block  # the head stays 16-bit
    assert gptq_dequantized_bytes(plain, arch, resolve_recipe(plain)) == (2 * q, 2 * q)
    assert bnb_dequantize_bytes(ckpt, arch, recipe) == (0.0, 0.0)
    assert quantization_load_bytes(ckpt, arch, recipe) == 0.0
    stored, _ = weight_bytes(ckpt, arch, recipe)
    assert stored == pytest.approx(
        q * GPTQ_BYTES + (parameter_counts(arch).total - q) * recipe.unquantized_weight_bytes
    )
    no_ckpt = peak_memory(plain, arch, resolve_recipe(plain))
    with_ckpt = peak_memory(ckpt, arch, recipe)
    assert no_ckpt.peak_allocated - with_ckpt.peak_allocated > 0.9 * 2 * q  # every copy saved without it


def test_unsloth_fused_blocks_keep_what_its_kernels_save() -> None:
    """Unsloth's LoRA_QKV / LoRA_W / LoRA_MLP and fast RMSNorm keep far less than PEFT's modules: X for
    the projections, e and g of the MLP, the norms' inputs and inverse RMS; flash attention its usual."""
    from services.estimator.memory import unsloth_block_saved_bytes_per_token, unsloth_fused_block

    lora = {"rank": 16, "targets": "all-linear", "dropout": 0.0}
    plan = make_plan(framework="unsloth", method="qlora", quantization="nf4", lora=lora, seq_len=4096)
    recipe = resolve_recipe(plan)
    block = ARCH.blocks[0]
    assert unsloth_fused_block(block, plan, recipe)
    saved = block_saved_bytes_per_token(block, ARCH, plan, recipe, 4096)
    assert saved == unsloth_block_saved_bytes_per_token(block, ARCH, recipe)
    h, q, kv, f = 4096, 4096, 1024, 14336
    assert sum(saved.values()) == 2 * (2 * h + 4) + 2 * h + 2 * (2 * q + 2 * kv) + 4 * 32 + 2 * h + 2 * 2 * f
    hf = make_plan(method="qlora", quantization="nf4", lora=lora, seq_len=4096)
    assert sum(saved.values()) < 0.5 * sum(
        block_saved_bytes_per_token(block, ARCH, hf, resolve_recipe(hf), 4096).values()
    )
    # Unsloth keeps PEFT's modules where its kernels do not apply: dropout, some projections only, full.
    for fields in (
        {"lora": {**lora, "dropout": 0.05}},
        {"lora": {**lora, "targets": ["q", "v"]}},
        {"method": "full", "quantization": None, "lora": None},
    ):
        other = make_plan(
            **{**{"framework": "unsloth", "method": "qlora", "quantization": "nf4", "lora": lora}, **fields}
        )
        assert not unsloth_fused_block(block, other, resolve_recipe(other)), fields


def test_offloading_keeps_one_block_input_in_flight_under_unsloth_and_five_under_torchtune() -> None:
    from services.estimator.memory import offload_stash_bytes

    unsloth = resolve_recipe(make_plan(framework="unsloth", method="lora", lora={"rank": 8}))
    torchtune = resolve_recipe(make_plan(framework="torchtune", method="lora", lora={"rank": 8}))
    assert offload_stash_bytes(1.0, 100.0, unsloth) == 1.0
    assert offload_stash_bytes(1.0, 100.0, torchtune) == 5.0
    assert offload_stash_bytes(1.0, 3.0, torchtune) == 3.0  # never more than what was offloaded


def test_the_reserved_peak_is_the_largest_moment_with_its_cache_whichever_moment_allocates_most() -> None:
    """A 4-bit load's temporaries (all churn) can reserve more than a short step that allocates more: one sample
    more per micro-batch moves the allocated peak to the step, and the reserved peak must not fall with it
    (hypothesis found this on Qwen2.5-7B, QLoRA, 41 tokens)."""
    from services.catalog.models import find_model
    from services.estimator.plan import Plan

    arch = architecture_from_config(find_model("Qwen/Qwen2.5-7B").config)
    shape = {
        "model": {"name": "Qwen/Qwen2.5-7B"},
        "method": "qlora",
        "framework": "torchtune",
        "lora": {"rank": 64, "targets": ["q", "lm_head"]},
        "optimizer": "adafactor",
        "seq_len": 41,
        "gradient_checkpointing": True,
        "gpus": 8,
        "sharding": "zero2",
        "attention": "eager",
    }
    small, big = (Plan.model_validate({**shape, "micro_batch_size": n}) for n in (3, 4))
    a = peak_memory(small, arch, resolve_recipe(small))
    b = peak_memory(big, arch, resolve_recipe(big))
    assert a.peak_moment == "model_load" and b.peak_moment != "model_load"
    assert b.peak_allocated > a.peak_allocated
    assert b.peak_device >= a.peak_device
    assert b.peak_reserved >= a.peak_reserved
    assert sum(b.components.values()) == pytest.approx(b.peak_device)


@pytest.mark.parametrize(
    ("quantization", "bytes_per_weight"),
    [
        # bitsandbytes NF4 (QLoRA paper, section 2): 4 bits + an fp32 absmax per 64 weights = 4.5 bits.
        ("nf4", 4.5 / 8),
        # AWQ and GPTQ group-128 checkpoints: 4 bits, and per 128 inputs a 16-bit scale and a 4-bit zero.
        ("awq", (4 + (16 + 4) / 128) / 8),
        ("gptq", (4 + (16 + 4) / 128) / 8),
        # fp8 E4M3: one byte (a per-tensor scale is negligible).
        ("fp8", 1.0),
    ],
)
def test_served_weights_are_stored_as_their_format_lays_them_out(quantization: str, bytes_per_weight: float) -> None:
    plan = make_plan(mode="inference", quantization=quantization)
    recipe = resolve_recipe(plan)
    # Every block linear is quantized; embeddings, norms and the output head stay bf16.
    linears = L * (H * (H + 2 * 1024 + H) + 3 * H * INTER)
    assert weight_bytes(plan, ARCH, recipe)[0] == pytest.approx(linears * bytes_per_weight + (TOTAL - linears) * 2)


def test_inference_peak_has_no_training_state() -> None:
    plan = make_plan(mode="inference", quantization="awq", micro_batch_size=2, seq_len=4096)
    mem = peak_memory(plan, ARCH, resolve_recipe(plan))
    assert mem.peak_moment == "prefill" and mem.trainable_params == 0
    for training_part in ("gradients", "optimizer_states", "master_weights", "adapters", "logits_and_loss"):
        assert training_part not in mem.components


def test_a_tied_embedding_holds_two_gradients_when_its_backward_runs() -> None:
    # One Parameter is the input embedding and the head: at the embedding's backward the head's gradient waits
    # in autograd's input buffer beside the embedding's new one, next to every block's gradient.
    tied_config = {**LLAMA_8B, "tie_word_embeddings": True}
    for config, extra in ((tied_config, V * H * 2), (LLAMA_8B, 0)):
        plan = make_plan(model={"name": "llama-8b", "config": config}, method="full", precision="bf16")
        arch = architecture_from_config(config)
        recipe = resolve_recipe(plan)
        states = model_states(plan, arch, recipe)
        held = states.weights + states.optimizer_states + states.gradients + states.master_weights
        moment = peak_memory(plan, arch, recipe).moments["tied_embedding_backward"]
        assert moment == pytest.approx(held + extra)
    # LoRA freezes the embedding: no gradient of it at all.
    lora = make_plan(model={"name": "llama-8b", "config": tied_config}, method="lora")
    arch, recipe = architecture_from_config(tied_config), resolve_recipe(lora)
    s = model_states(lora, arch, recipe)
    held = s.weights + s.adapters + s.optimizer_states + s.gradients + s.master_weights + s.ddp_buckets
    assert peak_memory(lora, arch, recipe).moments["tied_embedding_backward"] == pytest.approx(held)


def _gemma2(**fields: object) -> tuple:
    from services.catalog.models import find_model

    config = dict(find_model("google/gemma-2-2b").config)
    caps = fields.pop("caps", True)
    if not caps:
        config.update(attn_logit_softcapping=None, final_logit_softcapping=None)
    plan = make_plan(model={"name": "gemma-2-2b", "config": config}, seq_len=2048, micro_batch_size=2, **fields)
    return plan, architecture_from_config(config), resolve_recipe(plan)


def test_gemma2_on_sdpa_runs_soft_capped_eager_attention() -> None:
    """transformers' Gemma2 has no SDPA path (``_supports_sdpa = False``): a plan on SDPA is the eager plan, and
    the cap's tanh keeps one more score matrix than eager attention without a cap."""
    lora = {"method": "lora", "framework": "hf-trainer"}
    sdpa, eager = peak_memory(*_gemma2(**lora)), peak_memory(*_gemma2(attention="eager", **lora))
    assert sdpa.peak_allocated == eager.peak_allocated
    capped = sdpa.activations_per_layer_per_token
    plain = peak_memory(*_gemma2(caps=False, attention="eager", **lora)).activations_per_layer_per_token
    assert capped["attention_scores"] > plain["attention_scores"]
    # Without caps the same SDPA plan keeps no score matrix at all.
    assert "attention_scores" not in peak_memory(*_gemma2(caps=False, **lora)).activations_per_layer_per_token


def test_gemma2_caps_cost_nothing_where_a_kernel_or_the_framework_skips_them() -> None:
    """flash-attn caps inside its kernel, torchtune's gemma2 keeps SDPA and caps the final norm, not the logits
    (Gemma2FinalNorm), and Liger's fused linear cross-entropy caps chunk by chunk."""
    for fields in (
        {"method": "lora", "framework": "hf-trainer", "attention": "flash", "loss": "fused"},
        {"method": "lora", "framework": "torchtune"},
    ):
        capped, uncapped = _gemma2(**fields), _gemma2(caps=False, **fields)
        assert peak_memory(*capped).peak_allocated == peak_memory(*uncapped).peak_allocated, fields


def test_gemma2_capped_logits_keep_one_more_logits_tensor_through_backward() -> None:
    """The head's tanh output lives from the end of forward to the cap's backward, after the loss's own."""
    fields = {"method": "lora", "framework": "hf-trainer", "attention": "flash"}
    capped, uncapped = _gemma2(**fields), _gemma2(caps=False, **fields)
    (fwd, bwd), (fwd0, bwd0) = logits_bytes(*capped), logits_bytes(*uncapped)
    logits_tensor = capped[0].tokens_per_micro_batch * capped[1].vocab_size * 2  # bf16 head output
    assert (fwd - fwd0, bwd - bwd0) == (logits_tensor, logits_tensor)


def test_int8_lora_backward_holds_one_dequantized_weight_in_the_inputs_dtype() -> None:
    """bitsandbytes' MatMul8bitLt.backward makes ``state.CB.to(ctx.dtype_A)`` for the input gradient: the
    largest linear of Llama-3.1-8B (MLP, 14336 x 4096) in fp32, since prepare_model_for_kbit_training's fp32
    embeddings and norms make the block's inputs fp32 and Linear8bitLt casts nothing."""
    plan = make_plan(
        method="lora",
        quantization="int8",
        precision="bf16",
        framework="hf-trainer",
        gradient_checkpointing=True,
        seq_len=256,
        micro_batch_size=1,
    )
    # (the head's copy, one block linear's copy): transformers leaves lm_head unquantized
    assert dequantized_weight_bytes(plan, ARCH, resolve_recipe(plan)) == (0.0, 14336 * 4096 * 4)
    # Serving dequantizes nothing to keep: no backward.
    infer = make_plan(mode="inference", quantization="int8", precision="bf16")
    assert "dequantized_weights" not in peak_memory(infer, ARCH, resolve_recipe(infer)).components


def test_liger_swiglu_backward_allocates_only_the_products_gradient() -> None:
    """LigerSiLUMulFunction.backward stores the gate's and up's gradients into the saved gate and up outputs
    (liger_kernel/ops/swiglu.py), so a block's backward holds one new MLP-wide gradient (from down_proj's
    backward) where PyTorch's silu(gate) * up makes two more."""
    fields = {"method": "lora", "framework": "hf-trainer", "seq_len": 4096, "micro_batch_size": 2}
    liger, plain = make_plan(kernels="liger", **fields), make_plan(kernels="none", loss="fused", **fields)
    plain_transient = activation_bytes(plain, ARCH, resolve_recipe(plain)).backward_transient
    liger_transient = activation_bytes(liger, ARCH, resolve_recipe(liger)).backward_transient
    assert plain_transient - liger_transient == 2 * 4096 * INTER * 2  # one bf16 tokens x 14336 tensor fewer


@pytest.mark.parametrize("method", ["full", "lora", "qlora"])
@pytest.mark.parametrize("sharding", ["none", "zero2", "fsdp"])
@pytest.mark.parametrize("framework", get_args(Framework))
def test_model_states_held_for_a_layout_give_every_micro_batch_its_own_peak(
    method: str, sharding: str, framework: str
) -> None:
    # The planner's evaluator keeps one ModelStates per layout and hands it to peak_memory for every micro-batch
    # size and checkpointing it probes there: each peak must be the one peak_memory works out from scratch.
    layout = {"method": method, "gpus": 4, "sharding": sharding, "framework": framework}
    first = make_plan(**layout, micro_batch_size=1, gradient_checkpointing=True)
    held = model_states(first, ARCH, resolve_recipe(first))
    for micro_batch, checkpointing in [(8, False), (32, True)]:
        plan = make_plan(**layout, micro_batch_size=micro_batch, gradient_checkpointing=checkpointing)
        recipe = resolve_recipe(plan)
        assert peak_memory(plan, ARCH, recipe, held) == peak_memory(plan, ARCH, recipe)
