"""Check the per-layer activation rules against the real transformers / PEFT code, on the CPU.

Builds small models of several families with random weights, runs a training forward pass with
``torch.autograd.graph.saved_tensors_hooks`` counting every storage autograd keeps for backward
(parameters and buffers excluded, each storage once), and compares the bytes per token per layer
(difference between a 3-layer and a 1-layer model) with ``block_saved_bytes_per_token``.

Needs the ``trace`` extra (torch, transformers, peft). Run: ``python -m benchmarks.mechanisms.run``.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[1] / "results"
TOKENS = 128

# (label, model config, PEFT LoRA settings or None, attention implementation, autocast, gpuplan plan fields)
SCENARIOS: list[tuple[str, dict[str, Any], dict[str, Any] | None, str, bool, dict[str, Any]]] = []
LLAMA = {
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
    "tie_word_embeddings": False,
}
NEOX = {
    "model_type": "gpt_neox",
    "hidden_size": 256,
    "intermediate_size": 1024,
    "num_attention_heads": 8,
    "vocab_size": 1000,
    "rotary_pct": 0.25,
}
PHI3 = {
    "model_type": "phi3",
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "vocab_size": 1000,
    "tie_word_embeddings": False,
    "pad_token_id": 0,
    "eos_token_id": 1,
    "bos_token_id": 1,
}
FALCON = {
    "model_type": "falcon",
    "hidden_size": 256,
    "num_attention_heads": 8,
    "vocab_size": 1000,
    "multi_query": True,
    "parallel_attn": True,
    "bias": False,
    "new_decoder_architecture": False,
}
GPT2 = {
    "model_type": "gpt2",
    "n_embd": 256,
    "n_head": 8,
    "n_positions": 256,
    "vocab_size": 1000,
    "resid_pdrop": 0.0,
    "embd_pdrop": 0.0,
    "attn_pdrop": 0.0,
}
# Gemma 2 soft-caps its attention scores and logits (config attn_logit_softcapping, final_logit_softcapping,
# 50 and 30 by default); transformers runs it with eager attention (no SDPA path).
GEMMA2 = {
    "model_type": "gemma2",
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 32,
    "query_pre_attn_scalar": 32,
    "vocab_size": 1000,
    "hidden_activation": "gelu_pytorch_tanh",
}
QV = {"r": 8, "target_modules": ["q_proj", "v_proj"], "lora_dropout": 0.0}
for label, cfg, lora, attn, autocast, plan in (
    ("llama full bf16", LLAMA, None, "sdpa", False, {"framework": "pytorch"}),
    ("llama full eager", LLAMA, None, "eager", False, {"framework": "pytorch", "attention": "eager"}),
    # Each decoder layer through torch.compile (inductor on the CPU): what its partitioner saves.
    ("llama full bf16, compiled layers", LLAMA, None, "sdpa", False, {"framework": "pytorch", "compile": True}),
    (
        "llama LoRA q,v (fp32 adapters)",
        LLAMA,
        QV,
        "sdpa",
        False,
        {"framework": "pytorch", "method": "lora", "lora": {"rank": 8, "targets": ["q", "v"], "dropout": 0.0}},
    ),
    (
        "llama LoRA all-linear",
        LLAMA,
        {**QV, "target_modules": "all-linear"},
        "sdpa",
        False,
        {"framework": "pytorch", "method": "lora", "lora": {"rank": 8, "targets": "all-linear", "dropout": 0.0}},
    ),
    (
        "llama LoRA q,v under autocast",
        LLAMA,
        QV,
        "sdpa",
        True,
        {"framework": "hf-trainer", "method": "lora", "lora": {"rank": 8, "targets": ["q", "v"], "dropout": 0.0}},
    ),
    ("gpt_neox full bf16 (fused qkv)", NEOX, None, "sdpa", False, {"framework": "pytorch"}),
    ("phi3 full bf16 (fused qkv)", PHI3, None, "sdpa", False, {"framework": "pytorch"}),
    ("falcon full bf16 (fused qkv, MQA)", FALCON, None, "sdpa", False, {"framework": "pytorch"}),
    ("gpt2 full bf16 (fused c_attn)", GPT2, None, "sdpa", False, {"framework": "pytorch"}),
    # The plan asks for SDPA (the default); the estimator must see that Gemma 2 runs eager and soft-capped.
    (
        "gemma2 LoRA q,v (soft-capped, eager)",
        GEMMA2,
        QV,
        "eager",
        False,
        {"framework": "pytorch", "method": "lora", "lora": {"rank": 8, "targets": ["q", "v"], "dropout": 0.0}},
    ),
    ("gemma2 full bf16 (soft-capped, eager)", GEMMA2, None, "eager", False, {"framework": "pytorch"}),
):
    SCENARIOS.append((label, cfg, lora, attn, autocast, plan))


def _measure(
    cfg: dict[str, Any], lora: dict[str, Any] | None, attn: str, autocast: bool, layers: int, compiled: bool = False
) -> int:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {k: v for k, v in cfg.items() if k != "model_type"}
    config = AutoConfig.for_model(cfg["model_type"], **fields, num_hidden_layers=layers)
    config._attn_implementation = attn
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)  # type: ignore[no-untyped-call,unused-ignore]
    if lora is not None:
        model = get_peft_model(model, LoraConfig(**lora))
    model.train()
    if compiled:
        for layer in model.model.layers:
            layer.compile(backend="inductor")
    owned = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    seen: dict[int, int] = {}

    def pack(t: Any) -> Any:
        storage = t.untyped_storage()
        if storage.data_ptr() not in owned:
            seen[storage.data_ptr()] = max(seen.get(storage.data_ptr(), 0), storage.nbytes())
        return t

    ids = torch.randint(0, cfg["vocab_size"], (2, TOKENS))
    mask = torch.ones_like(ids)
    mask[0, 0] = 0  # a padded position, as in a padded fine-tuning batch (HF then repeats K/V heads)
    if compiled:  # the first call compiles; measure the second
        model(input_ids=ids, attention_mask=mask).logits.float().sum().backward()
        seen.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        if autocast:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                model(input_ids=ids, attention_mask=mask)
        else:
            model(input_ids=ids, attention_mask=mask)
    return sum(seen.values())


def _predicted(cfg: dict[str, Any], plan_fields: dict[str, Any]) -> float:
    from services.estimator.architecture import architecture_from_config
    from services.estimator.memory import block_saved_bytes_per_token
    from services.estimator.plan import Plan
    from services.estimator.recipe import resolve_recipe

    config = {**cfg, "num_hidden_layers": 2}
    plan = Plan.model_validate({"model": {"config": config}, "seq_len": TOKENS, **plan_fields})
    arch = architecture_from_config(config)
    return sum(block_saved_bytes_per_token(arch.blocks[0], arch, plan, resolve_recipe(plan), TOKENS).values())


def measure_scenario(
    label: str, cfg: dict[str, Any], lora: dict[str, Any] | None, attn: str, autocast: bool, plan: dict[str, Any]
) -> dict[str, Any]:
    """Saved bytes per token per layer, measured (3 layers minus 1, over 2 sequences) and predicted."""
    warnings.filterwarnings("ignore")
    one, three = (_measure(cfg, lora, attn, autocast, n, bool(plan.get("compile"))) for n in (1, 3))
    measured = (three - one) / 2 / (2 * TOKENS)
    predicted = _predicted(cfg, plan)
    return {
        "scenario": label,
        "measured_bytes_per_token_per_layer": measured,
        "predicted_bytes_per_token_per_layer": predicted,
        "error_pct": round((predicted - measured) / measured * 100, 1),
    }


def final_softcap_saved_bytes_per_token() -> tuple[float, float]:
    """(measured, predicted) bytes per token that Gemma 2's logit soft-capping adds to what autograd keeps:
    a one-layer model with and without final_logit_softcapping, and the estimator's logits at the end of
    forward for the same two configs."""
    from services.estimator.architecture import architecture_from_config
    from services.estimator.memory.loss import logits_bytes
    from services.estimator.plan import Plan
    from services.estimator.recipe import resolve_recipe

    warnings.filterwarnings("ignore")
    uncapped = {**GEMMA2, "final_logit_softcapping": None}
    measured = (_measure(GEMMA2, None, "eager", False, 1) - _measure(uncapped, None, "eager", False, 1)) / (2 * TOKENS)
    predicted = []
    for cfg in (GEMMA2, uncapped):
        config = {**cfg, "num_hidden_layers": 1}
        plan = Plan.model_validate({"model": {"config": config}, "seq_len": TOKENS, "framework": "pytorch"})
        predicted.append(logits_bytes(plan, architecture_from_config(config), resolve_recipe(plan))[0])
    return measured, (predicted[0] - predicted[1]) / plan.tokens_per_micro_batch


def main() -> int:
    try:
        import peft  # noqa: F401
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        print("needs the trace extra: pip install torch==2.13.0 && pip install -e '.[trace]'", file=sys.stderr)
        return 2
    warnings.filterwarnings("ignore")
    rows = []
    for label, cfg, lora, attn, autocast, plan in SCENARIOS:
        one, three = (_measure(cfg, lora, attn, autocast, n, bool(plan.get("compile"))) for n in (1, 3))
        measured = (three - one) / 2 / (2 * TOKENS)
        predicted = _predicted(cfg, plan)
        rows.append(
            {
                "scenario": label,
                "measured_bytes_per_token_per_layer": measured,
                "predicted_bytes_per_token_per_layer": predicted,
                "error_pct": round((predicted - measured) / measured * 100, 1),
            }
        )
        print(f"{label:34} measured {measured:8.0f}  predicted {predicted:8.0f}  ({rows[-1]['error_pct']:+.1f}%)")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "mechanisms.json").write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
