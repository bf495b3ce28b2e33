"""The mechanisms behind the weak categories of issue 13, each against a hand computation."""

from __future__ import annotations

import pytest

from services.estimator.architecture import architecture_from_config, parameter_counts
from services.estimator.estimate import estimate
from services.estimator.memory import (
    CUDA_CONTEXT_BYTES,
    NF4_BNB_BYTES,
    activation_bytes,
    allocator_gap_bytes,
    block_saved_bytes_per_token,
    fsdp1_stream_pool_bytes,
    nccl_buffer_bytes,
    peak_memory,
    quantized_params,
    weight_bytes,
)
from services.estimator.recipe import resolve_recipe
from tests.conftest import LLAMA_8B, make_plan

ARCH = architecture_from_config(LLAMA_8B)
TOTAL = parameter_counts(ARCH).total
H, L = 4096, 32
MIB = 1024**2

STARCODER = {
    "model_type": "gpt_bigcode",
    "n_embd": 6144,
    "n_layer": 40,
    "n_head": 48,
    "n_inner": 24576,
    "vocab_size": 49152,
    "n_positions": 8192,
    "multi_query": True,
    "activation_function": "gelu_pytorch_tanh",
}


def test_prepare_model_for_kbit_training_upcasts_what_is_not_4bit() -> None:
    plan = make_plan(method="qlora", lora={"rank": 8}, gradient_checkpointing=True, seq_len=4096)
    recipe = resolve_recipe(plan)
    assert recipe.kbit_fp32_upcast and recipe.residual_bytes == 4
    q = quantized_params(ARCH, recipe)
    assert weight_bytes(plan, ARCH, recipe)[0] == pytest.approx(q * NF4_BNB_BYTES + (TOTAL - q) * 4)
    # Checkpointed layers keep their fp32 input: 4 bytes per hidden element per token per layer.
    acts = activation_bytes(plan, ARCH, recipe)
    unprepared = make_plan(
        method="qlora", lora={"rank": 8}, gradient_checkpointing=True, seq_len=4096, framework="unsloth"
    )
    other = activation_bytes(unprepared, ARCH, resolve_recipe(unprepared))
    assert acts.saved - other.saved >= L * 4096 * H * 2  # the residual stream doubled in width
    # Sharded QLoRA (FSDP / ZeRO-3) skips the call (TRL's is_sharded_qlora); LoRA has no k-bit base.
    for other_plan in (
        make_plan(method="qlora", lora={"rank": 8}, gpus=2, sharding="fsdp"),
        make_plan(method="lora", lora={"rank": 8}),
        make_plan(method="qlora", lora={"rank": 8}, framework="torchtune"),
        # axolotl casts norms and embeddings back to 16-bit for flash attention.
        make_plan(method="qlora", lora={"rank": 8}, framework="axolotl"),
    ):
        assert not resolve_recipe(other_plan).kbit_fp32_upcast
    sdpa_axolotl = make_plan(method="qlora", lora={"rank": 8}, framework="axolotl", attention="sdpa")
    assert resolve_recipe(sdpa_axolotl).kbit_fp32_upcast
    # PEFT leaves a GPTQ checkpoint's 16-bit parameters alone.
    gptq = {**LLAMA_8B, "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128}}
    gptq_plan = make_plan(model={"config": gptq}, method="qlora", lora={"rank": 8})
    assert not resolve_recipe(gptq_plan).kbit_fp32_upcast


def test_the_upcast_raises_a_70b_qlora_at_4k_above_the_16bit_reading() -> None:
    llama70 = {
        **LLAMA_8B,
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
    }
    arch = architecture_from_config(llama70)
    plan = make_plan(method="qlora", lora={"rank": 16}, gradient_checkpointing=True, seq_len=4096)
    mem = peak_memory(plan, arch, resolve_recipe(plan))
    embed_and_head = 2 * 128256 * 8192
    # fp32 embeddings and head (+2 bytes each), their head copy for backward (+2 bytes), and the
    # checkpointed fp32 residual stream (+2 bytes x 80 layers x 4096 tokens x 8192).
    floor = embed_and_head * 2 + 128256 * 8192 * 2 + 80 * 4096 * 8192 * 2
    plain = make_plan(
        method="qlora",
        lora={"rank": 16},
        gradient_checkpointing=True,
        seq_len=4096,
        framework="unsloth",
        loss="standard",
        attention="sdpa",
    )
    assert mem.peak_allocated > peak_memory(plain, arch, resolve_recipe(plain)).peak_allocated + 0.8 * floor


def test_multi_query_starcoder_saves_one_kv_head() -> None:
    arch = architecture_from_config(STARCODER)
    plan = make_plan(model={"config": STARCODER}, method="full", seq_len=2048)
    recipe = resolve_recipe(plan)
    block = arch.blocks[0]
    saves = block_saved_bytes_per_token(block, arch, plan, recipe, 2048)
    # SDPA keeps q, k, v as views of the fused c_attn output (6144 + 2 x 128 wide), the output and the
    # fp32 log-sum-exp per head; the 48-head expansion of K/V is a view, so it costs nothing.
    fused = 2 * (6144 + 2 * 128)
    assert saves["attention_qkv_out"] == fused + 2 * 6144 + 4 * 48
    llama_like = {**LLAMA_8B, "num_key_value_heads": 1}
    larch = architecture_from_config(llama_like)
    lplan = make_plan(model={"config": llama_like}, method="full", seq_len=2048)
    lsaves = block_saved_bytes_per_token(larch.blocks[0], larch, lplan, resolve_recipe(lplan), 2048)
    # repeat_kv copies K and V to all 32 heads in the Llama family.
    assert lsaves["attention_qkv_out"] == 2 * 4096 * 4 + 4 * 32


def test_nccl_buffers_per_rank() -> None:
    per_connection = 4 * MIB + 120 * 640 * 8 * 8 + 8 * 512 * 8 * 16
    assert nccl_buffer_bytes(make_plan()) == 0
    assert nccl_buffer_bytes(make_plan(gpus=8, sharding="fsdp")) == 32 * per_connection
    assert nccl_buffer_bytes(make_plan(gpus=8)) == 2 * 32 * per_connection  # DDP: ring and tree
    assert 280 * MIB < 32 * per_connection < 300 * MIB
    one = peak_memory(make_plan(), ARCH, resolve_recipe(make_plan()))
    assert one.peak_device - one.peak_reserved == CUDA_CONTEXT_BYTES


def test_fsdp1_stream_pools_are_cached_but_not_needed() -> None:
    plan = make_plan(
        method="full", gpus=4, sharding="fsdp", precision="bf16-mixed", gradient_checkpointing=True, padding="packed"
    )
    recipe = resolve_recipe(plan)
    unit = ARCH.largest_block_params * 2
    root = (ARCH.embedding_params + ARCH.lm_head_params) * 2
    assert fsdp1_stream_pool_bytes(plan, ARCH, recipe) == pytest.approx(3 * unit + root)
    mem = peak_memory(plan, ARCH, recipe)
    # Beside the part of the step's gap a card just large enough gives back (allocator_gap_bytes).
    counter_gap, fit_gap = allocator_gap_bytes(plan, activation_bytes(plan, ARCH, recipe), 1.0)
    assert 0 < mem.cached_reclaimable - (counter_gap - fit_gap) <= fsdp1_stream_pool_bytes(plan, ARCH, recipe)
    # The fit is checked on the device peak, which leaves the reclaimable cache out.
    report = estimate(plan)
    assert report.memory.reclaimable_cache_gib == pytest.approx(mem.cached_reclaimable / 1024**3, abs=1e-3)
    fit = next(f for f in report.fits if f.gpu == "A100 80GB")
    assert fit.headroom_gib == pytest.approx(80 - report.memory.peak_device_gib, abs=1e-3)
    # FSDP2 (torchtitan, torchtune) frees through events, not record_stream.
    fsdp2 = make_plan(method="full", gpus=4, sharding="fsdp", framework="torchtitan")
    assert fsdp1_stream_pool_bytes(fsdp2, ARCH, resolve_recipe(fsdp2)) == 0


def test_fsdp_mixed_precision_computes_in_16bit_under_accelerate_not_lightning() -> None:
    accelerate = make_plan(method="full", gpus=8, sharding="fsdp", precision="bf16-mixed")
    assert resolve_recipe(accelerate).residual_bytes == 2
    lightning = make_plan(method="full", gpus=8, sharding="fsdp", precision="bf16-mixed", framework="litgpt")
    assert resolve_recipe(lightning).residual_bytes == 4
    single = make_plan(method="full", precision="bf16-mixed")
    assert resolve_recipe(single).residual_bytes == 4  # plain autocast keeps an fp32 residual stream


def test_utilisation_priors_come_from_published_figures() -> None:
    from services.estimator.throughput import (
        END_TO_END_OVER_MATMUL,
        GEMM_RATE,
        MATMUL_SHARE,
        PUBLISHED_MFU,
        UTILISATION_PRIOR,
        UTILISATION_PRIORS,
    )

    # The published MPT-7B figures, less MPT's own element-wise time and with attention counted as causal flash
    # attention does it: within 2% of the published HFU (MPT-7B is wide and its LayerNorm one kernel).
    for cls in ("hopper", "ampere-dc"):
        assert UTILISATION_PRIOR[cls] == GEMM_RATE[cls]
        assert UTILISATION_PRIOR[cls] == pytest.approx(PUBLISHED_MFU[cls], rel=0.02)
    assert GEMM_RATE["hopper"] > PUBLISHED_MFU["hopper"]  # H100's FLOPs per byte are higher: more to take out
    # A training step keeps ~66% of the best matmul rate on A100 (0.641 / 0.869) and H100 (0.470 / 0.803).
    assert pytest.approx((GEMM_RATE["ampere-dc"] / 0.869 + GEMM_RATE["hopper"] / 0.803) / 2) == END_TO_END_OVER_MATMUL
    # The RTX 4090 measured 178.5 TFLOPS on matmuls against a 165.2 datasheet peak.
    assert UTILISATION_PRIOR["consumer"] == pytest.approx(END_TO_END_OVER_MATMUL * 178.5 / 165.2, abs=1e-3)
    assert MATMUL_SHARE["consumer"] > 1
    # The Ada cards (L4, L40, L40S, RTX 6000 Ada) have measured matmul shares; these classes do not.
    assert "measured matmul share" in UTILISATION_PRIORS["ada"][1]
    for cls in ("turing", "ampere-pro"):
        assert "no published measurement" in UTILISATION_PRIORS[cls][1]
    report = estimate(make_plan(), "L40S")
    assert report.throughput is not None and report.throughput.utilisation_assumed == UTILISATION_PRIOR["ada"]


def test_fsdp_no_sync_keeps_16bit_unsharded_gradients() -> None:
    from services.estimator.memory import model_states

    plan = make_plan(method="full", gpus=8, sharding="fsdp", precision="bf16-mixed", gradient_accumulation_steps=2)
    recipe = resolve_recipe(plan)
    assert recipe.fsdp_accumulates_unsharded and recipe.fsdp_compute_params_16bit
    states = model_states(plan, ARCH, recipe)
    # Unsharded bf16 gradients of the whole model plus the fp32 shard the synced step reduces into.
    assert states.gradients == pytest.approx(TOTAL * 2 + TOTAL * 4 / 8)
    no_accumulation = make_plan(method="full", gpus=8, sharding="fsdp", precision="bf16-mixed")
    assert model_states(no_accumulation, ARCH, resolve_recipe(no_accumulation)).gradients == pytest.approx(
        TOTAL * 4 / 8
    )


@pytest.mark.parametrize("sharding", ["fsdp", "zero3"])
@pytest.mark.parametrize("double_quant", [False, True])
def test_sharded_qlora_keeps_the_nf4_constants_whole_on_every_rank(sharding: str, double_quant: bool) -> None:
    # Only the packed 4-bit codes (half a byte per weight) are partitioned; bitsandbytes' quant_state (an
    # fp32 absmax per 64 weights, or with nested quantization an 8-bit one plus an fp32 scale per 256
    # blocks) stays whole, so the weights per rank fall as 1/n towards that floor, not towards zero.
    constants = (1 / 64 + 4 / (64 * 256)) if double_quant else 4 / 64
    per_rank = {}
    for gpus in (2, 8):
        plan = make_plan(method="qlora", lora={"rank": 8}, gpus=gpus, sharding=sharding, double_quant=double_quant)
        recipe = resolve_recipe(plan)
        q = quantized_params(ARCH, recipe)
        per_rank[gpus] = peak_memory(plan, ARCH, recipe).states.weights
        sharded = (q * 0.5 + (TOTAL - q) * 2) / gpus
        assert per_rank[gpus] == pytest.approx(sharded + q * constants)
    assert per_rank[2] - per_rank[8] == pytest.approx((q * 0.5 + (TOTAL - q) * 2) * (1 / 2 - 1 / 8))
    # A 16-bit base has no constants: its weights shard to nothing.
    lora = make_plan(method="lora", lora={"rank": 8}, gpus=8, sharding=sharding)
    assert peak_memory(lora, ARCH, resolve_recipe(lora)).states.weights == pytest.approx(TOTAL * 2 / 8)
