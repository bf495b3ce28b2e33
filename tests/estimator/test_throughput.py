"""Throughput terms against hand computations."""

from __future__ import annotations

import pytest

from services.catalog.gpus import find_gpu
from services.estimator.architecture import architecture_from_config, parameter_counts
from services.estimator.memory import model_states
from services.estimator.plan import Plan
from services.estimator.recipe import resolve_recipe
from services.estimator.throughput import (
    UTILISATION_PRIOR,
    estimate_throughput,
    flops_per_token,
    run_cost,
    step_elementwise_bytes,
)
from tests.conftest import LLAMA_8B, make_plan

ARCH = architecture_from_config(LLAMA_8B)
H, L, V = 4096, 32, 128256
MATMUL = L * (2 * H * H + 2 * H * 1024 + 3 * H * 14336) + V * H  # every weight a token meets in a matmul


def test_full_finetuning_is_six_flops_per_weight_plus_attention() -> None:
    plan = make_plan(seq_len=2048)
    f = flops_per_token(plan, ARCH, resolve_recipe(plan))
    attention_forward = L * 2 * 2 * 2048 * 0.5 * 32 * 128  # causal: half the score matrix
    assert f.forward == pytest.approx(2 * MATMUL + attention_forward)
    assert f.backward == pytest.approx(4 * MATMUL + 2.5 * attention_forward)
    assert f.recompute == 0
    n = parameter_counts(ARCH).active
    assert f.model_flops == pytest.approx(6 * n + 12 * L * H * 2048)


def test_lora_skips_weight_gradients_and_checkpointing_replays_the_forward() -> None:
    full = make_plan(seq_len=1024)
    lora = make_plan(seq_len=1024, method="lora", lora={"rank": 8, "targets": ["q", "v"]})
    gc = make_plan(seq_len=1024, method="lora", lora={"rank": 8, "targets": ["q", "v"]}, gradient_checkpointing=True)
    f_full = flops_per_token(full, ARCH, resolve_recipe(full))
    f_lora = flops_per_token(lora, ARCH, resolve_recipe(lora))
    f_gc = flops_per_token(gc, ARCH, resolve_recipe(gc))
    assert f_lora.hardware / f_full.hardware == pytest.approx(4 / 6, rel=0.03)
    assert f_gc.recompute == pytest.approx(f_gc.forward - 2 * V * H - 2 * (f_gc.forward - f_lora.forward), rel=0.05)
    assert f_gc.hardware > f_lora.hardware


def test_tokens_per_second_from_peak_and_utilisation() -> None:
    plan = make_plan(seq_len=2048, micro_batch_size=8, framework="torchtune")
    recipe = resolve_recipe(plan)
    gpu = find_gpu("H100 SXM")
    tp = estimate_throughput(plan, ARCH, recipe, model_states(plan, ARCH, recipe), gpu)
    compute = tp.flops_per_token.hardware * 8 * 2048 / (989e12 * UTILISATION_PRIOR["hopper"])
    elementwise = step_elementwise_bytes(plan, ARCH, recipe) * 8 * 2048 / (gpu.hbm_bandwidth_gb_per_s * 1e9)
    assert tp.seconds["compute"] == pytest.approx(compute + elementwise)
    assert 0.1 < elementwise / compute < 0.3  # an eager 8B block's norms, rotary and SwiGLU on an H100
    assert tp.tokens_per_s == pytest.approx(8 * 2048 / tp.step_seconds)
    assert 0.2 < tp.mfu < 0.6


def _tp(plan, gpu_name):  # type: ignore[no-untyped-def]
    recipe = resolve_recipe(plan)
    return estimate_throughput(plan, ARCH, recipe, model_states(plan, ARCH, recipe), find_gpu(gpu_name))


def test_big_batches_scale_almost_linearly_over_nvlink() -> None:
    one = _tp(make_plan(seq_len=2048, micro_batch_size=4), "A100 80GB")
    eight = _tp(make_plan(seq_len=2048, micro_batch_size=4, gpus=8, sharding="fsdp"), "A100 80GB")
    # Communication hides behind compute; the sharded optimizer step is even a little shorter.
    assert 7.6 * one.tokens_per_s < eight.tokens_per_s < 8.4 * one.tokens_per_s


def test_small_batches_over_pcie_do_not_scale_linearly() -> None:
    one = _tp(make_plan(seq_len=256, micro_batch_size=1), "L40S")
    eight = _tp(make_plan(seq_len=256, micro_batch_size=1, gpus=8, sharding="fsdp"), "L40S")
    # Gathering 16 GB of weights three times per 256-token micro-batch over PCIe (bus bandwidth ~63% of
    # 32 GB/s) takes longer than the compute it should hide: 8 GPUs barely beat (or lose to) one.
    assert eight.tokens_per_s < 4 * one.tokens_per_s
    assert eight.seconds["communication"] > eight.seconds["compute"]


def test_pcie_cards_expose_more_communication_than_nvlink() -> None:
    plan = make_plan(seq_len=512, micro_batch_size=1, gpus=8, sharding="fsdp")
    recipe = resolve_recipe(plan)
    states = model_states(plan, ARCH, recipe)
    nvlink = estimate_throughput(plan, ARCH, recipe, states, find_gpu("A100 80GB"))
    pcie = estimate_throughput(plan, ARCH, recipe, states, find_gpu("L40S"))
    assert pcie.seconds["communication"] > nvlink.seconds["communication"]


def test_qlora_pays_for_dequantization() -> None:
    plan = make_plan(method="qlora", lora={"rank": 8}, seq_len=1024)
    recipe = resolve_recipe(plan)
    tp = estimate_throughput(plan, ARCH, recipe, model_states(plan, ARCH, recipe), find_gpu("A100 80GB"))
    assert tp.seconds["dequantization"] > 0


def test_paged_states_that_do_not_fit_cross_pcie() -> None:
    plan = make_plan(optimizer="paged-adamw", seq_len=1024)
    recipe = resolve_recipe(plan)
    states = model_states(plan, ARCH, recipe)
    gpu = find_gpu("RTX 4090")
    roomy = estimate_throughput(plan, ARCH, recipe, states, gpu, peak_device_bytes=0.0)
    tight = estimate_throughput(plan, ARCH, recipe, states, gpu, peak_device_bytes=gpu.memory_gib * 2**30)
    extra = 2 * states.optimizer_states_paged / (gpu.pcie_gb_per_s * 1e9)
    assert tight.seconds["optimizer"] - roomy.seconds["optimizer"] == pytest.approx(
        extra - 2 * max(0.0, states.optimizer_states_paged - gpu.memory_gib * 2**30) / (gpu.pcie_gb_per_s * 1e9)
    )


def test_calibrated_utilisation_overrides_the_prior() -> None:
    plan = make_plan(seq_len=2048)
    recipe = resolve_recipe(plan)
    states = model_states(plan, ARCH, recipe)
    gpu = find_gpu("A100 80GB")
    tp = estimate_throughput(plan, ARCH, recipe, states, gpu, utilisation=0.25, utilisation_source="calibrated")
    assert tp.utilisation_assumed == 0.25 and tp.utilisation_source == "calibrated"


def test_run_cost_seeds_worked_example() -> None:
    # SEEDS.md section 1: 10,000 examples x 512 tokens x 3 epochs at 1,000 tokens/s = 4.3 h; $4/h -> ~$17.
    cost = run_cost(15_360_000, 1000.0, 1, 4.00, 1.20)
    assert cost.hours == pytest.approx(4.2667, rel=1e-3)
    assert cost.on_demand_usd == pytest.approx(17.07, rel=1e-3)
    assert cost.spot_usd == pytest.approx(5.12, rel=1e-3)


def test_gemm_roofline_is_math_bound_for_long_rows_and_memory_bound_for_few() -> None:
    from services.estimator.throughput import gemm_seconds

    flops, bw = 200e12, 2e12
    # 4096 rows: 2*4096*4096*4096 FLOPs at 200 TFLOPS beats (3 x 4096^2 x 2 B) at 2 TB/s.
    assert gemm_seconds(4096, 4096, 4096, flops, bw, 2) == pytest.approx(2 * 4096**3 / flops)
    # 8 rows: the weight read (4096^2 x 2 B) dominates.
    assert gemm_seconds(8, 4096, 4096, flops, bw, 2) == pytest.approx((8 * 4096 * 2 + 4096**2) * 2 / bw)


def test_block_linear_gemms_match_flop_accounting_at_large_m_and_slow_down_at_small_m() -> None:
    from services.estimator.throughput import linear_gemm_seconds, linear_gemm_work

    def block_linear_gemms(plan: Plan) -> tuple[float, float]:
        work = linear_gemm_work(plan, ARCH, resolve_recipe(plan))
        return work[0], linear_gemm_seconds(work, 200e12, 2e12)

    big = make_plan(seq_len=4096, micro_batch_size=2)
    flops, seconds = block_linear_gemms(big)
    linear = L * (2 * H * H + 2 * H * 1024 + 3 * H * 14336)
    assert flops == pytest.approx(3 * 2 * linear * 8192)  # forward, input and weight gradients
    assert seconds == pytest.approx(flops / 200e12)
    small = make_plan(seq_len=16, micro_batch_size=1)
    flops_s, seconds_s = block_linear_gemms(small)
    assert seconds_s > 5 * flops_s / 200e12


def test_lora_unfused_bytes_count_peft_forward_passes() -> None:
    from services.estimator.throughput import lora_unfused_bytes_per_token, lora_unfused_kernels_per_linear

    fwd, bwd = lora_unfused_bytes_per_token(100, 10, 2, 0, dropout=False)
    # lora_A reads x, lora_B writes, scale (read+write), add (read 2, write 1): 2 B each.
    assert fwd == pytest.approx(2 * (100 + 10 + 2 * 10 + 3 * 10))
    assert bwd == pytest.approx(2 * (4 * 10 + 2 * 100 + 3 * 100))
    fwd_d, _ = lora_unfused_bytes_per_token(100, 10, 2, 0, dropout=True)
    assert fwd_d - fwd == pytest.approx(100 * (2 * 2 + 1))
    fwd_c, _ = lora_unfused_bytes_per_token(100, 10, 2, 4, dropout=False)
    assert fwd_c > 2 * fwd
    assert lora_unfused_kernels_per_linear(0, 2, dropout=False) == 4
    assert lora_unfused_kernels_per_linear(4, 2, dropout=True) == 7


def test_lora_unfused_work_is_zero_for_full_unsloth_and_compiled() -> None:
    from services.estimator.throughput import lora_unfused_work

    lora = {"rank": 8, "targets": ["q", "v"]}
    peft = make_plan(method="lora", lora=lora)
    nbytes, kernels = lora_unfused_work(peft, ARCH, resolve_recipe(peft))
    assert nbytes > 0 and kernels == 2 * lora_kernels_for(peft)
    for plan in (
        make_plan(),
        make_plan(method="lora", lora=lora, framework="unsloth"),
        make_plan(method="lora", lora=lora, compile=True),
    ):
        assert lora_unfused_work(plan, ARCH, resolve_recipe(plan)) == (0.0, 0)


def lora_kernels_for(plan):  # type: ignore[no-untyped-def]
    from services.estimator.throughput import lora_unfused_kernels_per_linear

    r = resolve_recipe(plan)
    return lora_unfused_kernels_per_linear(r.adapter_input_bytes, r.compute_bytes, r.lora_dropout > 0)


def test_unfused_lora_slows_a_short_sequence_more_than_a_fused_one() -> None:
    lora = {"rank": 64, "targets": "all-linear"}
    peft = _tp(make_plan(method="lora", lora=lora, seq_len=512), "A100 80GB")
    fused = _tp(make_plan(method="lora", lora=lora, seq_len=512, framework="unsloth"), "A100 80GB")
    assert peft.tokens_per_s < fused.tokens_per_s


def test_ada_prior_rests_on_the_measured_matmul_shares_of_its_cards() -> None:
    from services.estimator.throughput import ADA_MATMUL_SHARES, END_TO_END_OVER_MATMUL, UTILISATION_PRIORS

    prior, source = UTILISATION_PRIORS["ada"]
    shares = sorted(ADA_MATMUL_SHARES)
    assert prior == pytest.approx(END_TO_END_OVER_MATMUL * (shares[1] + shares[2]) / 2, abs=5e-4)
    assert "measured matmul share" in source


def test_deepspeed_zero_hooks_are_host_time_per_module_call_and_trained_tensor() -> None:
    """ZeRO-3 gathers and frees around every module call (forward, checkpoint replay, backward), ZeRO-2/3
    bucket every trained tensor's gradient; FSDP, ZeRO-1 and single-GPU plans pay neither."""
    from services.estimator.throughput import (
        BLOCK_CONTAINER_MODULES,
        HOST_SECONDS_PER_OP,
        PEFT_MODULES_PER_ADAPTED_LINEAR,
        ZERO2_HOST_OPS_PER_TRAINED_TENSOR,
        ZERO3_HOST_OPS_PER_MODULE_BACKWARD,
        ZERO3_HOST_OPS_PER_MODULE_FORWARD,
        ZERO3_HOST_OPS_PER_TRAINED_TENSOR,
        zero_hook_seconds,
    )

    def hooks(**fields: object) -> float:
        plan = make_plan(seq_len=512, gpus=2, **fields)
        return zero_hook_seconds(plan, ARCH, resolve_recipe(plan))

    modules = L * (BLOCK_CONTAINER_MODULES + 7 + 2)  # Llama: 7 linears, 2 RMSNorms per layer
    tensors = L * (7 + 2)
    per_call = ZERO3_HOST_OPS_PER_MODULE_FORWARD
    zero3 = modules * (per_call + ZERO3_HOST_OPS_PER_MODULE_BACKWARD) + tensors * ZERO3_HOST_OPS_PER_TRAINED_TENSOR
    assert hooks(sharding="zero3") == pytest.approx(zero3 * HOST_SECONDS_PER_OP)
    replayed = hooks(sharding="zero3", gradient_checkpointing=True)
    assert replayed == pytest.approx((zero3 + modules * per_call) * HOST_SECONDS_PER_OP)
    assert hooks(sharding="zero2") == pytest.approx(tensors * ZERO2_HOST_OPS_PER_TRAINED_TENSOR * HOST_SECONDS_PER_OP)
    assert hooks(sharding="fsdp") == hooks(sharding="zero1") == 0.0
    # LoRA on q and v: PEFT's modules around two linears per layer, and two adapter tensors each.
    lora = hooks(sharding="zero3", method="lora", lora={"rank": 8, "targets": ["q", "v"]})
    lora_modules = modules + L * 2 * PEFT_MODULES_PER_ADAPTED_LINEAR
    expected = (
        lora_modules * (per_call + ZERO3_HOST_OPS_PER_MODULE_BACKWARD) + L * 4 * ZERO3_HOST_OPS_PER_TRAINED_TENSOR
    )
    assert lora == pytest.approx(expected * HOST_SECONDS_PER_OP)


def test_zero3_hooks_set_the_pace_of_short_micro_batches_only() -> None:
    """On short micro-batches the hooks' host time exceeds the GPU work, so ZeRO-3 is slower than FSDP's
    per-layer units; on long ones the GPU work hides them."""

    def rate(seq_len: int, sharding: str) -> float:
        return _tp(
            make_plan(seq_len=seq_len, gpus=2, sharding=sharding, gradient_checkpointing=True), "H100 SXM"
        ).tokens_per_s

    assert rate(256, "zero3") < 0.8 * rate(256, "fsdp")
    assert rate(8192, "zero3") == pytest.approx(rate(8192, "fsdp"), rel=0.1)


GPTQ_8B = {**LLAMA_8B, "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False}}


def test_a_gptq_checkpoint_dequantizes_with_pytorch_ops_in_forward_and_replay_only() -> None:
    """auto-gptq's PyTorch unpacking moves 18.5 bytes per weight element, in the forward and its replay;
    the backward reuses the copy autograd saved. bitsandbytes moves 4.6, in every pass."""
    from services.estimator.memory import quantized_params
    from services.estimator.throughput import GPTQ_DEQUANT_BYTES

    fields = {"method": "qlora", "quantization": "nf4", "lora": {"rank": 8}, "seq_len": 1024}
    gptq = make_plan(model={"name": "llama-8b-gptq", "config": GPTQ_8B}, gradient_checkpointing=True, **fields)
    recipe = resolve_recipe(gptq)
    assert recipe.quant_backend == "auto-gptq" and not recipe.quantize_lm_head
    assert pytest.approx(18.5) == GPTQ_DEQUANT_BYTES
    tp = _tp(gptq, "A100 80GB")
    bandwidth = find_gpu("A100 80GB").hbm_bandwidth_gb_per_s * 1e9
    q = quantized_params(ARCH, recipe)
    assert tp.seconds["dequantization"] == pytest.approx(2 * q * 18.5 / bandwidth)  # forward + replay
    no_replay = _tp(make_plan(model={"name": "llama-8b-gptq", "config": GPTQ_8B}, **fields), "A100 80GB")
    assert no_replay.seconds["dequantization"] == pytest.approx(q * 18.5 / bandwidth)
    bnb = _tp(make_plan(gradient_checkpointing=True, **fields), "A100 80GB")
    assert bnb.seconds["dequantization"] == pytest.approx(3 * q * 4.6 / bandwidth)
    assert tp.tokens_per_s < bnb.tokens_per_s


def test_only_4_bit_gptq_checkpoints_are_estimated() -> None:
    from services.estimator.errors import EstimatorError

    eight_bit = {**GPTQ_8B, "quantization_config": {**GPTQ_8B["quantization_config"], "bits": 8}}
    plan = make_plan(model={"name": "m", "config": eight_bit}, method="qlora", lora={"rank": 8})
    with pytest.raises(EstimatorError) as err:
        resolve_recipe(plan)
    assert err.value.field == "model.config.quantization_config.bits"
    # Inference over a GPTQ checkpoint trains nothing: not refused.
    resolve_recipe(make_plan(model={"name": "m", "config": GPTQ_8B}, mode="inference"))


def test_the_calibrated_utilisation_is_the_one_at_which_the_estimate_meets_the_measurement() -> None:
    from services.estimator.estimate import UTILISATION_SEARCH, estimate, utilisation_reproducing

    plan = make_plan(method="lora", seq_len=2048, micro_batch_size=2)
    gpu = find_gpu("A100 80GB")
    for measured in (1000.0, 3000.0, 6000.0):
        found = utilisation_reproducing(plan, gpu, measured)
        assert found is not None and found[1]
        report = estimate(plan, gpu, utilisation=found[0])
        assert report.throughput is not None
        assert report.throughput.tokens_per_s_per_gpu == pytest.approx(measured, rel=1e-3)
        # Above the hardware FLOPs utilisation of the same measurement: the step's element-wise bytes, adapter
        # passes and optimizer are charged beside the GEMMs, not folded into their rate.
        hfu = report.throughput.hardware_flops_per_token * measured / (gpu.dense_tflops("bf16") * 1e12)
        assert found[0] > hfu
    # Where a floor binds, every utilisation above some value gives the same rate: the measurement does not say
    # which, so the class prior stays (TinyLlama QLoRA at 1024 tokens is bound by its kernel dispatch).
    tiny = make_plan(
        model={"name": "TinyLlama/TinyLlama-1.1B-Chat-v1.0"}, method="qlora", quantization="nf4", seq_len=1024
    )
    at_prior = estimate(tiny, gpu).throughput
    assert at_prior is not None
    assert estimate(tiny, gpu, utilisation=0.9).throughput.tokens_per_s_per_gpu == at_prior.tokens_per_s_per_gpu  # type: ignore[union-attr]
    found = utilisation_reproducing(tiny, gpu, at_prior.tokens_per_s_per_gpu)
    assert found == (UTILISATION_PRIOR["ampere-dc"], True)
    # Faster than the estimate can go at any utilisation: the upper end, not met.
    assert utilisation_reproducing(plan, gpu, 1e7) == (UTILISATION_SEARCH[1], False)
    assert utilisation_reproducing(plan, gpu, 0.0) is None


def test_an_fp32_plan_says_its_throughput_assumes_tf32() -> None:
    from services.estimator.estimate import estimate

    fp32 = estimate(make_plan(precision="fp32"), "A100 80GB")
    assert any("TF32" in w and "set_float32_matmul_precision" in w for w in fp32.warnings)
    assert not any("TF32" in w for w in estimate(make_plan(precision="bf16"), "A100 80GB").warnings)
