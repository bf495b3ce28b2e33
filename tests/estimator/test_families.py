"""The 2025-26 families (issue 13 item 2) and the generic fallback for any other decoder-only config."""

from __future__ import annotations

import pytest

from services.catalog.models import catalog_models, find_model
from services.estimator.architecture import (
    SUPPORTED_MODEL_TYPES,
    architecture_from_config,
    checkpoint_bytes,
    parameter_counts,
)
from services.estimator.errors import EstimatorError
from services.estimator.estimate import estimate
from services.estimator.plan import Plan

GIB = 2**30

# Each family with a bundled model whose total is checked against its published count in
# tests/estimator/test_architecture.py::test_parameter_count_matches_published.
NEW_FAMILIES_WITH_PUBLISHED_COUNTS = {
    "qwen": "Qwen/Qwen-7B",
    "deepseek_v2": "deepseek-ai/DeepSeek-V2-Lite",
    "deepseek_v3": "deepseek-ai/DeepSeek-V3",
    "gpt_oss": "openai/gpt-oss-20b",
    "llama4": "meta-llama/Llama-4-Scout-17B-16E",
    "internlm2": "internlm/internlm2_5-7b-chat",
    "chatglm": "THUDM/chatglm3-6b",
    "glm4": "THUDM/GLM-4-9B-0414",
    "cohere": "CohereForAI/aya-expanse-8b",
    "granite": "ibm-granite/granite-3.3-8b-instruct",
    "olmoe": "allenai/OLMoE-1B-7B-0924",
    "phimoe": "microsoft/Phi-3.5-MoE-instruct",
}


@pytest.mark.parametrize(("family", "hf_id"), sorted(NEW_FAMILIES_WITH_PUBLISHED_COUNTS.items()))
def test_new_family_is_parsed_and_has_a_published_count(family: str, hf_id: str) -> None:
    assert family in SUPPORTED_MODEL_TYPES
    model = find_model(hf_id)
    assert model.config["model_type"] == family
    assert model.published_params
    counts = parameter_counts(architecture_from_config(model.config))
    assert abs(counts.total - model.published_params) / model.published_params <= 0.005


@pytest.mark.parametrize(
    ("hf_id", "exact"),
    [
        ("Qwen/Qwen-7B", 7_721_324_544),
        ("deepseek-ai/DeepSeek-V2-Lite", 15_706_484_224),
        ("deepseek-ai/DeepSeek-V3", 671_026_419_200),
        ("openai/gpt-oss-20b", 20_914_757_184),
        ("openai/gpt-oss-120b", 116_829_156_672),
        ("meta-llama/Llama-4-Scout-17B-16E", 108_641_793_536),
        ("internlm/internlm2_5-7b-chat", 7_737_708_544),
        ("THUDM/chatglm3-6b", 6_243_584_000),
        ("THUDM/glm-4-9b", 9_399_951_360),
        ("THUDM/GLM-4-9B-0414", 9_400_279_040),
        ("CohereForAI/aya-expanse-8b", 8_028_033_024),
        ("ibm-granite/granite-3.3-8b-instruct", 8_170_864_640),
        ("allenai/OLMoE-1B-7B-0924", 6_919_161_856),
        ("mistralai/Mistral-Small-24B-Base-2501", 23_572_403_200),
        ("mistralai/Mistral-Nemo-Base-2407", 12_247_782_400),
    ],
)
def test_exact_published_counts(hf_id: str, exact: int) -> None:
    """Where the exact count is published (the Hub's safetensors total, or model.num_parameters()),
    gpuplan's count equals it to the parameter."""
    assert parameter_counts(architecture_from_config(find_model(hf_id).config)).total == exact


def test_qwen1_intermediate_size_counts_both_mlp_halves() -> None:
    arch = architecture_from_config(find_model("Qwen/Qwen-7B").config)
    widths = {lin.name: lin.out_features for lin in arch.blocks[0].linears}
    assert widths["w1"] == widths["w2"] == 22016 // 2
    assert arch.blocks[0].intermediate_size == 11008


def test_deepseek_dense_first_layers_and_moe_layer_freq() -> None:
    cfg = dict(find_model("deepseek-ai/DeepSeek-V3").config)
    arch = architecture_from_config(cfg)
    dense, moe = arch.blocks
    assert (dense.count, dense.num_experts) == (3, 1)
    assert (moe.count, moe.num_experts, moe.experts_per_token) == (58, 256, 8)
    assert any("multi-token-prediction" in n and "not" in n for n in arch.notes)
    # MoE only on every second layer from layer 3 on: layers 4, 6, ..., 60.
    every_second = architecture_from_config({**cfg, "moe_layer_freq": 2})
    assert [b.count for b in every_second.blocks] == [61 - 29, 29]
    # Active parameters: the technical report's 37B activated.
    assert abs(parameter_counts(arch).active - 37e9) / 37e9 < 0.02


def test_deepseek_v2_lite_has_no_query_compression() -> None:
    arch = architecture_from_config(find_model("deepseek-ai/DeepSeek-V2-Lite").config)
    names = [lin.name for lin in arch.blocks[0].linears]
    assert "q_proj" in names and "q_a_proj" not in names
    assert arch.blocks[0].head_dim == 128 + 64


def test_gpt_oss_mxfp4_checkpoint_size_matches_the_model_card() -> None:
    """OpenAI's model card: checkpoints of 12.8 GiB (20b) and 60.8 GiB (120b) with MXFP4 experts."""
    for hf_id, published_gib in (("openai/gpt-oss-20b", 12.8), ("openai/gpt-oss-120b", 60.8)):
        arch = architecture_from_config(find_model(hf_id).config)
        assert arch.expert_weight_stored_bits == 4.25
        assert abs(checkpoint_bytes(arch, 2.0) / GIB - published_gib) < 0.1
        assert checkpoint_bytes(arch, 2.0) < parameter_counts(arch).total * 2.0 / 3
    bf16 = dict(find_model("openai/gpt-oss-20b").config)
    del bf16["quantization_config"]
    arch = architecture_from_config(bf16)
    assert checkpoint_bytes(arch, 2.0) == parameter_counts(arch).total * 2.0


def test_gpt_oss_active_parameters_match_the_model_card_without_the_input_embedding() -> None:
    arch = architecture_from_config(find_model("openai/gpt-oss-120b").config)
    counts = parameter_counts(arch)
    assert abs((counts.active - counts.embedding) - 5.13e9) / 5.13e9 < 0.005


def test_llama4_maverick_interleaves_dense_and_moe_layers() -> None:
    """Llama 4 Maverick: 128 experts on every second layer (interleave_moe_layer_step 2); the model card
    gives 400B total and 17B active."""
    cfg = dict(find_model("meta-llama/Llama-4-Scout-17B-16E").config)
    text = {**cfg["text_config"], "num_local_experts": 128, "interleave_moe_layer_step": 2}
    arch = architecture_from_config({**cfg, "text_config": text})
    moe, dense = arch.blocks
    assert (moe.count, moe.num_experts, dense.count, dense.intermediate_size) == (24, 128, 24, 16384)
    counts = parameter_counts(arch)
    assert abs(counts.total - 400e9) / 400e9 < 0.005
    assert abs((counts.active - counts.vision) - 17e9) / 17e9 < 0.02
    text_only = architecture_from_config({"model_type": "llama4_text", **text})
    assert parameter_counts(text_only).vision == 0


def test_baichuan2_counts_its_remote_code_modules() -> None:
    """No exact total is published for Baichuan 2 (its checkpoints are .bin files): the count is checked
    against the module shapes of modeling_baichuan.py (W_pack 3h x h, o_proj, gate/up/down, two RMSNorms
    per layer, final norm, embedding and NormHead)."""
    h, inter, layers, vocab = 4096, 11008, 32, 125696
    per_layer = 3 * h * h + h * h + 3 * h * inter + 2 * h
    arch = architecture_from_config(find_model("baichuan-inc/Baichuan2-7B-Base").config)
    assert parameter_counts(arch).total == layers * per_layer + h + 2 * vocab * h
    assert arch.rotary
    thirteen = architecture_from_config(
        {
            "model_type": "baichuan",
            "hidden_size": 5120,
            "intermediate_size": 13696,
            "num_hidden_layers": 40,
            "num_attention_heads": 40,
            "vocab_size": 125696,
            "model_max_length": 4096,
        }
    )
    assert not thirteen.rotary and "ALiBi positions" in thirteen.notes
    assert abs(parameter_counts(thirteen).total - 13.9e9) / 13.9e9 < 0.005


def test_command_r_plus_qk_norm_and_parallel_block() -> None:
    base = dict(find_model("CohereForAI/c4ai-command-r-v01").config)
    arch = architecture_from_config(base)
    assert arch.blocks[0].parallel_residual and arch.tie_word_embeddings
    with_norm = architecture_from_config({**base, "use_qk_norm": True})
    assert parameter_counts(with_norm).total - parameter_counts(arch).total == 40 * (64 + 64) * 128


def test_every_new_catalog_model_estimates_a_training_step() -> None:
    for hf_id in (*NEW_FAMILIES_WITH_PUBLISHED_COUNTS.values(), "baichuan-inc/Baichuan2-7B-Base"):
        plan = Plan.model_validate(
            {"model": {"name": hf_id}, "method": "lora", "seq_len": 1024, "gradient_checkpointing": True}
        )
        report = estimate(plan, "H100 80GB")
        assert report.memory.peak_device_gib > 0 and report.confidence == "high"
        assert report.throughput is not None and report.throughput.tokens_per_s > 0


# --------------------------------------------------------------------------------------------------
# Any other decoder-only config

UNKNOWN = {
    "model_type": "my_new_lm",
    "hidden_size": 1024,
    "num_hidden_layers": 8,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "intermediate_size": 2816,
    "vocab_size": 32000,
    "hidden_act": "silu",
    "tie_word_embeddings": True,
}


def test_unknown_family_is_estimated_from_the_standard_keys_with_low_confidence() -> None:
    arch = architecture_from_config(UNKNOWN)
    assert arch.confidence == "low"
    assert any("not a known family" in n for n in arch.notes)
    same_as_llama = architecture_from_config({**UNKNOWN, "model_type": "llama"})
    assert parameter_counts(arch).total == parameter_counts(same_as_llama).total


def test_generic_fallback_names_each_assumption() -> None:
    bare = {
        "model_type": "mystery",
        "n_embd": 768,
        "n_layer": 12,
        "n_head": 12,
        "vocab_size": 50257,
    }
    arch = architecture_from_config(bare)
    notes = " | ".join(arch.notes)
    for assumption in (
        "key/value head",
        "intermediate_size = 4 x hidden_size",
        "untied output head",
        "biases",
        "head_dim",
    ):
        assert assumption in notes, assumption
    block = arch.blocks[0]
    assert (arch.hidden_size, block.count, block.num_heads, block.num_kv_heads) == (768, 12, 12, 12)
    assert block.intermediate_size == 4 * 768


def test_generic_fallback_reads_aliases_and_experts() -> None:
    cfg = {
        "model_type": "some_moe",
        "d_model": 2048,
        "num_layers": 24,
        "num_heads": 16,
        "num_kv_heads": 4,
        "ffn_hidden_size": 5632,
        "padded_vocab_size": 65536,
        "num_experts": 8,
        "moe_top_k": 2,
        "activation_function": "gelu",
    }
    arch = architecture_from_config(cfg)
    block = arch.blocks[0]
    assert (block.num_experts, block.experts_per_token, block.mlp_gated) == (8, 2, False)
    assert (arch.hidden_size, arch.vocab_size, block.num_kv_heads, block.intermediate_size) == (2048, 65536, 4, 5632)
    assert parameter_counts(arch).active < parameter_counts(arch).total


def test_estimate_of_an_unknown_family_warns_and_is_low_confidence() -> None:
    report = estimate(Plan.model_validate({"model": {"config": UNKNOWN}, "method": "full", "seq_len": 512}))
    assert report.confidence == "low"
    assert report.model_type == "my_new_lm"
    assert any("confidence: low" in w for w in report.warnings)


def test_a_config_without_sizes_is_refused_naming_the_missing_keys() -> None:
    with pytest.raises(EstimatorError) as err:
        architecture_from_config({"model_type": "rwkv", "hidden_size": 8, "vocab_size": 100})
    assert err.value.field == "model.config"
    assert "num_hidden_layers" in err.value.message and "num_attention_heads" in err.value.message
    assert "hidden_size" not in err.value.message.split("estimate:")[1].split(";")[0]


def test_bundled_families_keep_high_confidence() -> None:
    assert all(architecture_from_config(m.config).confidence == "high" for m in catalog_models())


def test_layer_counts_are_arithmetic_not_a_loop_over_layers() -> None:
    """DeepSeek's and Llama 4's MoE layer counts are formulas (validation bounds the sizes themselves):
    equal to counting layer by layer, and instant for any count."""
    import time

    from services.estimator.architecture.moe import moe_layer_count

    for layers in range(0, 12):
        for first in range(0, 6):
            for every in range(0, 4):
                by_layer = sum(1 for i in range(layers) if i >= first and every > 0 and i % every == 0)
                assert moe_layer_count(layers, first, every) == by_layer
    start = time.perf_counter()
    assert moe_layer_count(10**12, 3, 1) == 10**12 - 3
    assert time.perf_counter() - start < 0.01
    scout = dict(find_model("meta-llama/Llama-4-Scout-17B-16E").config)
    l4 = architecture_from_config(
        {**scout, "text_config": {**scout["text_config"], "num_hidden_layers": 96, "interleave_moe_layer_step": 2}}
    )
    assert [b.count for b in l4.blocks] == [48, 48]


def test_deepseek_v2_full_matches_its_paper() -> None:
    """DeepSeek-V2 (arXiv:2405.04434): 236B total, 21B activated; q LoRA 1536, 160 routed + 2 shared."""
    cfg = dict(find_model("deepseek-ai/DeepSeek-V2-Lite").config)
    cfg.update(
        hidden_size=5120,
        intermediate_size=12288,
        moe_intermediate_size=1536,
        num_hidden_layers=60,
        num_attention_heads=128,
        num_key_value_heads=128,
        q_lora_rank=1536,
        n_routed_experts=160,
        n_shared_experts=2,
        num_experts_per_tok=6,
        topk_method="group_limited_greedy",
    )
    counts = parameter_counts(architecture_from_config(cfg))
    assert abs(counts.total - 236e9) / 236e9 < 0.005
    assert abs(counts.active - 21e9) / 21e9 < 0.02


def test_sibling_model_types_share_the_parser() -> None:
    """cohere2 (Command R7B) has Command-R's parameters; glm (GLM-4-9B-chat-hf) the remote-code GLM-4's."""
    aya = dict(find_model("CohereForAI/aya-expanse-8b").config)
    assert parameter_counts(architecture_from_config({**aya, "model_type": "cohere2"})).total == 8_028_033_024
    glm_hf = {
        "model_type": "glm",
        "hidden_size": 4096,
        "intermediate_size": 13696,
        "num_hidden_layers": 40,
        "num_attention_heads": 32,
        "num_key_value_heads": 2,
        "head_dim": 128,
        "vocab_size": 151552,
        "attention_bias": True,
        "tie_word_embeddings": False,
    }
    assert parameter_counts(architecture_from_config(glm_hf)).total == 9_399_951_360


def test_glm45_air_and_seed_oss() -> None:
    """GLM-4.5-Air (arXiv:2508.06471: 106B total, 12B active without the embeddings) and Seed-OSS-36B."""
    air = architecture_from_config(find_model("zai-org/GLM-4.5-Air").config)
    dense, moe = air.blocks
    assert (dense.count, moe.count, moe.num_experts, moe.experts_per_token) == (1, 45, 128, 8)
    counts = parameter_counts(air)
    assert abs(counts.total - 106e9) / 106e9 < 0.01
    assert abs((counts.active - counts.embedding - counts.lm_head) - 12e9) / 12e9 < 0.02
    assert any("multi-token-prediction" in n for n in air.notes)
    seed = architecture_from_config(find_model("ByteDance-Seed/Seed-OSS-36B-Instruct").config)
    assert seed.confidence == "high"
    biases = {lin.name: lin.bias for lin in seed.blocks[0].linears}
    assert biases["q_proj"] and biases["k_proj"] and biases["v_proj"] and not biases["o_proj"]
    assert parameter_counts(seed).total == 36_151_104_512


def test_qwen1_reads_both_intermediate_size_conventions() -> None:
    """Qwen's config.json gives both MLP halves as intermediate_size; the plan schema of the benchmark cases
    (shared/benchmarks/README.md) gives one half and keeps Qwen's value as qwen_intermediate_size."""
    own = dict(find_model("Qwen/Qwen-7B").config)
    schema = {**own, "intermediate_size": 11008, "qwen_intermediate_size": 22016}
    halves_only = {**own, "intermediate_size": 11008}
    totals = {parameter_counts(architecture_from_config(cfg)).total for cfg in (own, schema, halves_only)}
    assert totals == {7_721_324_544}
    assert any("one half" in n for n in architecture_from_config(schema).notes)


@pytest.mark.parametrize(
    ("hf_id", "key"),
    [
        # Missing, each took a default transformers does not have, sizing the model silently wrong at "high"
        # confidence (a probe of stop 61): every layer dense, Mistral with all heads as KV heads, Qwen3's and
        # Gemma's head_dim as hidden / heads, Pythia's and Phi-2's MLP as 4 x hidden, a full q_proj for DeepSeek.
        ("deepseek-ai/DeepSeek-V3", "n_routed_experts"),
        ("deepseek-ai/DeepSeek-V3", "first_k_dense_replace"),
        ("deepseek-ai/DeepSeek-V3", "n_shared_experts"),
        ("deepseek-ai/DeepSeek-V3", "q_lora_rank"),
        ("zai-org/GLM-4.5-Air", "n_routed_experts"),
        ("zai-org/GLM-4.5-Air", "num_key_value_heads"),
        ("mistralai/Mistral-7B-v0.1", "num_key_value_heads"),
        ("Qwen/Qwen3-32B", "head_dim"),
        ("google/gemma-7b", "head_dim"),
        ("openai/gpt-oss-120b", "num_key_value_heads"),
        ("microsoft/Phi-3.5-MoE-instruct", "num_key_value_heads"),
        ("EleutherAI/pythia-6.9b", "intermediate_size"),
        ("microsoft/phi-2", "intermediate_size"),
        ("meta-llama/Llama-3.1-8B", "intermediate_size"),
    ],
)
def test_a_size_whose_default_is_not_ours_is_required(hf_id: str, key: str) -> None:
    config = {k: v for k, v in find_model(hf_id).config.items() if k != key}
    with pytest.raises(EstimatorError, match=r"missing; a \w+ config.json needs it") as refused:
        architecture_from_config(config)
    assert refused.value.field == f"model.config.{key}"


def test_a_llama_config_without_kv_heads_or_head_dim_takes_transformers_defaults() -> None:
    # LlamaConfig's own defaults: every head a KV head, head_dim hidden / heads.
    config = find_model("meta-llama/Llama-3.1-8B").config
    bare = {k: v for k, v in config.items() if k not in ("num_key_value_heads", "head_dim")}
    full = {**bare, "num_key_value_heads": config["num_attention_heads"]}
    assert (
        parameter_counts(architecture_from_config(bare)).total == parameter_counts(architecture_from_config(full)).total
    )
