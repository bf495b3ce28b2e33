"""The element-wise bytes of a step, each term against a hand computation from the measured per-width counts."""

from __future__ import annotations

import pytest

from services.catalog.gpus import find_gpu
from services.catalog.models import find_model
from services.estimator.architecture import architecture_from_config
from services.estimator.elementwise import (
    EAGER_BLOCK_BYTES,
    EAGER_LOSS_BYTES_PER_VOCAB_ENTRY,
    PYTHON_GELU_BYTES,
    UNGATED_SHARE,
    blocks_bytes_per_token,
    elementwise_bytes_per_token,
    loss_bytes_per_token,
    mlp_width,
    precision_of,
)
from services.estimator.memory import model_states
from services.estimator.recipe import resolve_recipe
from services.estimator.throughput import estimate_throughput, step_elementwise_bytes
from tests.conftest import LLAMA_8B, make_plan

ARCH = architecture_from_config(LLAMA_8B)


def test_an_eager_llama_block_moves_its_measured_bytes_per_width() -> None:
    plan = make_plan(method="lora", gradient_checkpointing=False)
    recipe = resolve_recipe(plan)
    assert precision_of(recipe) == "16-bit"
    t = EAGER_BLOCK_BYTES["16-bit"]
    # Llama-3-8B: hidden 4096, SwiGLU 14336, 32 query heads and 8 KV heads of 128; a LoRA base is frozen.
    fwd = t["hidden/rms/frozen"][0] * 4096 + t["intermediate"][0] * 14336 + t["rotary"][0] * (4096 + 1024)
    bwd = t["hidden/rms/frozen"][1] * 4096 + t["intermediate"][1] * 14336 + t["rotary"][1] * (4096 + 1024)
    assert blocks_bytes_per_token(plan, ARCH, recipe) == pytest.approx((32 * fwd, 32 * bwd))
    loss = 128256 * sum(EAGER_LOSS_BYTES_PER_VOCAB_ENTRY)
    assert elementwise_bytes_per_token(plan, ARCH, recipe, 0.0) == pytest.approx(32 * (fwd + bwd) + loss)
    # Checkpointing replays the forward's kernels once more.
    ckpt = make_plan(method="lora", gradient_checkpointing=True)
    assert step_elementwise_bytes(ckpt, ARCH, resolve_recipe(ckpt)) == pytest.approx(32 * (2 * fwd + bwd) + loss)
    # Full fine-tuning adds the norm weights' gradients to the backward.
    full = make_plan(method="full", gradient_checkpointing=False)
    assert blocks_bytes_per_token(full, ARCH, resolve_recipe(full))[1] > 32 * bwd


def test_inference_moves_the_forward_only() -> None:
    train = make_plan(method="full", gradient_checkpointing=False)
    infer = make_plan(mode="inference")
    fwd, _ = blocks_bytes_per_token(train, ARCH, resolve_recipe(train))
    assert elementwise_bytes_per_token(infer, ARCH, resolve_recipe(infer), 0.0) == pytest.approx(fwd)


def test_fused_kernels_move_only_the_unavoidable_traffic() -> None:
    eager = make_plan(method="lora")
    compiled = make_plan(method="lora", compile=True)
    unsloth = make_plan(method="lora", framework="unsloth")
    e = step_elementwise_bytes(eager, ARCH, resolve_recipe(eager))
    c = step_elementwise_bytes(compiled, ARCH, resolve_recipe(compiled))
    u = step_elementwise_bytes(unsloth, ARCH, resolve_recipe(unsloth))
    assert c < e / 3 and u < e / 3
    # The Trainer gets a fused loss from Liger only, which patches the norms, rotary and SwiGLU as well.
    liger = make_plan(method="lora", loss="fused")
    other = make_plan(method="lora", loss="fused", framework="pytorch")
    assert blocks_bytes_per_token(liger, ARCH, resolve_recipe(liger)) == pytest.approx(
        blocks_bytes_per_token(compiled, ARCH, resolve_recipe(compiled))
    )
    assert blocks_bytes_per_token(other, ARCH, resolve_recipe(other)) == pytest.approx(
        blocks_bytes_per_token(eager, ARCH, resolve_recipe(eager))
    )
    # A compiled 16-bit block: two add+norm kernels, each reading the residual and the branch output (2 + 2 bytes
    # per hidden unit) and writing the new residual and the normed activation (2 + 2); SwiGLU (read 4, write 2 per
    # intermediate unit), rotary (read and write q and k); backward twice that.
    fwd = 2 * 8 * 4096 + 6 * 14336 + 4 * (4096 + 1024)
    c_fwd, c_bwd = blocks_bytes_per_token(compiled, ARCH, resolve_recipe(compiled))
    assert (c_fwd, c_bwd) == pytest.approx((32 * fwd, 32 * 2 * fwd))
    # Unsloth's and a compiled loss read the 16-bit logits and write their gradient.
    assert loss_bytes_per_token(ARCH, resolve_recipe(unsloth)) == pytest.approx((4 * 128256, 2 * 128256))


def test_ungated_layer_norm_and_expert_blocks() -> None:
    phi = architecture_from_config(find_model("microsoft/phi-2").config)
    plan = make_plan(model={"name": "microsoft/phi-2"}, method="lora", gradient_checkpointing=False)
    recipe = resolve_recipe(plan)
    block = phi.blocks[0]
    assert phi.norm == "layer" and not block.mlp_gated
    t = EAGER_BLOCK_BYTES["16-bit"]
    # Phi-2's attention and MLP share one LayerNorm (the count was measured on two per block).
    assert block.norm_count == 1
    # Its gelu_new runs as transformers' chain of Python ops under the Trainer, torch's one GELU kernel compiled.
    assert phi.activation == "gelu_new" and recipe.python_gelu
    rest = t["hidden/layer"][0] * phi.hidden_size / 2
    rest += t["rotary"][0] * (block.num_heads + block.num_kv_heads) * block.head_dim
    fwd = rest + PYTHON_GELU_BYTES["16-bit"][0] * 10240
    assert blocks_bytes_per_token(plan, phi, recipe)[0] == pytest.approx(block.count * fwd)
    torchtune = make_plan(model={"name": "microsoft/phi-2"}, method="lora", framework="torchtune")
    assert not resolve_recipe(torchtune).python_gelu
    fwd = rest + t["intermediate"][0] * UNGATED_SHARE[0] * 10240
    assert blocks_bytes_per_token(torchtune, phi, resolve_recipe(torchtune))[0] == pytest.approx(block.count * fwd)
    # Mixtral: each token passes through 2 of the 8 experts' SwiGLU.
    mixtral = architecture_from_config(find_model("mistralai/Mixtral-8x7B-v0.1").config)
    assert mlp_width(mixtral.blocks[0]) == 2 * 14336


def test_precision_picks_the_measured_table() -> None:
    assert precision_of(resolve_recipe(make_plan(precision="fp32"))) == "fp32"
    assert precision_of(resolve_recipe(make_plan(precision="bf16-mixed"))) == "autocast"
    assert precision_of(resolve_recipe(make_plan(method="qlora", quantization="nf4"))) == "autocast"


def test_element_wise_time_weighs_most_on_cards_with_few_bytes_per_flop() -> None:
    """The same bytes cost an L40S (864 GB/s beside 362 TFLOPS) a larger share of its step than an A100."""
    plan = make_plan(method="lora", seq_len=2048, micro_batch_size=2)
    recipe = resolve_recipe(plan)
    states = model_states(plan, ARCH, recipe)
    moved = step_elementwise_bytes(plan, ARCH, recipe) * 2 * 2048
    shares = {}
    for name in ("L40S", "A100 80GB"):
        gpu = find_gpu(name)
        tp = estimate_throughput(plan, ARCH, recipe, states, gpu)
        shares[name] = moved / (gpu.hbm_bandwidth_gb_per_s * 1e9) / tp.step_seconds
    assert shares["L40S"] > 1.5 * shares["A100 80GB"]
    assert 0.05 < shares["A100 80GB"] < 0.3
