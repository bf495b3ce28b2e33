"""The sweep's report (benchmarks/results/sweep.md) from its cached rows (benchmarks/results/sweep.json).

Every config whose trace and analytic allocated peaks differ by more than ``THRESHOLD_PCT`` is put in one
mechanism group by the rules of ``mechanism``; each group's text says which side is wrong and why, with
the code it was read from (transformers/PEFT/torch as installed in the venv).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

THRESHOLD_PCT = 5.0

Row = dict[str, Any]


def _pct(value: float, reference: float) -> float:
    return (value - reference) / reference * 100 if reference else 0.0


def _without_head_gradient(row: Row) -> float:
    """The trace against the analytic peak less the output head's gradient it adds at start of backward."""
    head = row["analytic_components"].get("gradients", 0.0) if row["analytic_moment"] == "start_of_backward" else 0.0
    return _pct(row["trace_gib"], row["analytic_gib"] - head)


def _with_head_copy_only(row: Row) -> float:
    """The trace against the analytic peak keeping only the head's autocast copy (``head_copy_gib``)."""
    copies = row["analytic_components"].get("autocast_weight_copies", 0.0)
    return _pct(row["trace_gib"], row["analytic_gib"] - copies + row.get("head_copy_gib", 0.0))


def _is_moe(row: Row) -> bool:
    return "olmoe" in row["model"].lower()


def _is_gemma2(row: Row) -> bool:
    return "gemma-2-" in row["model"].lower()


def _tied_embedding_moment(row: Row) -> bool:
    trace = row["trace_breakdown"]
    weights = row["analytic_components"].get("weights", 0.0)
    return row["method"] == "full" and 0 < trace.get("grad", 0.0) < weights and not trace.get("act")


# (key, title, which side, explanation, rule): the first rule a row matches names its group.
GROUPS: list[tuple[str, str, str, str, Callable[[Row], bool]]] = [
    (
        "moe",
        "MoE experts (OLMoE)",
        "open (trace suspected)",
        "The trace holds about one bf16 copy of every expert weight per MoE layer more than the analytic "
        "activations (0.75 GiB a layer for OLMoE-1B-7B: 64 x (2048x2048 + 2048x1024) x 2 B). The experts run "
        "through transformers/integrations/moe.py `grouped_mm_experts_forward` (`_grouped_linear` passes "
        "`weight.transpose(-2, -1)` to `torch._grouped_mm`); the extra bytes look like a contiguous copy of "
        "that transposed weight made by the CPU/fake path and kept for backward, which the CUDA kernel (it "
        "takes strided weights) would not make. Not verified on a GPU: left open. The same path refuses fp32 "
        "inputs on the CPU (`Expected inputs of BF16 type`), so OLMoE full/fp32/bf16-mixed configs error.",
        _is_moe,
    ),
    (
        "qlora",
        "QLoRA stand-in",
        "neither (method limit)",
        "bitsandbytes needs CUDA, so the trace runs LoRA on a 16-bit base and adds the analytic difference "
        "between the QLoRA plan and that stand-in (services/trace/tracer.py `trace_plan`). The two analytic "
        "peaks fall at different moments (the QLoRA plan's fp32 head copy, kbit upcast), so the added "
        "difference is not the weight difference alone; these rows check only the 16-bit part.",
        lambda row: row["method"] == "qlora",
    ),
    (
        "head_gradient",
        "Full fine-tuning: the head's gradient counted beside the loss working set",
        "analytic, fixed (see 'Fixed by the sweep'); a row here would be one the fix does not cover",
        "services/estimator/memory/peak.py puts the output head's gradient (`head_grad`) into the "
        "start-of-backward moment together with the cross-entropy's three fp32 tokens x vocab tensors. In "
        "autograd order the head's weight gradient is made by the head matmul's backward, after "
        "log_softmax/nll_loss backward has run and released its fp32 tensors (only the 16-bit logits "
        "gradient is left), so the two never coexist; the head's gradient is now counted from the blocks' "
        "backward on (column 'no head grad': the peak without it).",
        lambda row: (
            row["method"] == "full"
            and row["analytic_moment"] == "start_of_backward"
            and abs(_without_head_gradient(row)) <= THRESHOLD_PCT
        ),
    ),
    (
        "tied_embedding",
        "Full fine-tuning of tied models: the embedding's backward moment",
        "trace (a fake-tensor artefact); the analytic moment is right and, since 3a5abc0, modelled",
        "With `tie_word_embeddings` one Parameter is both the input embedding and the head, so its two "
        "gradients meet in autograd's input buffer at the embedding's backward, the step's last op, when every "
        "block gradient exists (trace: 'grad' below the weights, no activations). The analytic model has that "
        "moment since 3a5abc0 (services/estimator/memory/peak.py `tied_embedding_backward`: the head's gradient "
        "beside the embedding's new one), and in every row of this group the trace is that moment plus exactly "
        "one more vocab x hidden tensor (to 0.01%; llama-3.2-1b-07: 6.705 + 0.979 = 7.684 GiB), so the "
        "analytic peak stays at the optimizer step or the start of backward and no row moved. The extra tensor "
        "is the sum itself: the traced peak op is `aten.add.Tensor` over the head's gradient and "
        "`embedding_dense_backward`'s output, out of place because autograd accumulates in place "
        "(`old_var.add_(var)`) only when the incoming gradient is no tensor subclass "
        "(torch/csrc/autograd/input_buffer.cpp `accumulate`: `!at::isTensorSubclassLike(var)`), and a "
        "FakeTensor is one. On a GPU the sum is made in place and two vocab x hidden tensors coexist, as "
        "modelled.",
        _tied_embedding_moment,
    ),
    (
        "gemma2",
        "Gemma 2: soft-capped attention and logits",
        "analytic, fixed (see 'Fixed by the sweep'); a row here would be one the fix does not cover",
        "transformers/models/gemma2/modeling_gemma2.py: `_supports_sdpa = False` (SDPA has no soft-capping), "
        "so a plan on SDPA runs `eager_attention_forward` with `softcap`, whose tanh keeps one more B x H x "
        "S x S score matrix per layer, and `Gemma2ForCausalLM.forward` caps the logits (`logits / cap; tanh; "
        "* cap`), whose tanh keeps one more tokens x vocab tensor. Both are modelled "
        "(services/estimator/memory/activations.py `attention_softcapped`, memory/loss.py "
        "`softcapped_logits_bytes`); the Gemma 2 full fine-tuning rows fall in the two full fine-tuning "
        "groups above.",
        _is_gemma2,
    ),
    (
        "frozen_autocast_copies",
        "LoRA, bf16-mixed, checkpointing: autocast copies of frozen weights",
        "analytic, fixed (see 'Fixed by the sweep'); a row here would be one the fix does not cover",
        "services/estimator/memory/states.py `autocast_weight_copy_bytes` keeps a 16-bit copy of every fp32 "
        "matmul weight until backward. Autocast caches a cast only for leaf tensors that require grad "
        "(aten/src/ATen/autocast_mode.cpp `cached_cast`), so a frozen base weight's copy lives only as a "
        "tensor autograd saves; under checkpointing the blocks save nothing, so only the head's copy "
        "(its matmul is outside the checkpointed blocks) is alive at start of backward. With the head's "
        "copy only, the analytic peak matches the trace (column 'head copy only').",
        lambda row: (
            row["method"] == "lora"
            and row["precision"] == "bf16-mixed"
            and row["gradient_checkpointing"]
            and abs(_with_head_copy_only(row)) <= THRESHOLD_PCT
        ),
    ),
    (
        "other",
        "Not explained",
        "open",
        "No rule above matches: a disagreement not yet traced to a mechanism on either side (breakdowns by "
        "tracker category and analytic component are in sweep.json).",
        lambda row: True,
    ),
]


# What the sweep found and this branch fixed (the rows above are after these fixes).
FIXED = (
    "Analytic: the output head's weight gradient no longer sits in the start-of-backward moment beside the "
    "cross-entropy's fp32 tokens x vocab tensors: autograd makes it in the head matmul's backward, after "
    "log_softmax/nll_loss backward has released those (services/estimator/memory/peak.py, the "
    "`start_of_backward` moment; it stays in `during_backward`). The 35 full fine-tuning rows that were "
    "-5.2%..-12.7% below the trace are within 5% (the sweep: 166 -> 200 of 210 within 5%, p10 -7.9% -> "
    "-1.4%). Held out, medium+high: counter 6.7%/21.2% unchanged, fit bytes 9.0% -> 8.6% median (p90 31.0% "
    "unchanged), refusals 0 of 138 unchanged; the cases as published: 5.9%/21.0% -> 6.5%/20.6% (fit bytes "
    "8.4%/25.2% -> 8.1%/25.0%).",
    "Trace: `Module.to_empty` made one new Parameter per owning module, so a tied embedding and head "
    "came back as two (every tied model traced with an extra vocab x hidden weight, its gradient and "
    "optimizer states); services/trace/tracer.py `_to_empty_keeping_ties` points the owners back at one.",
    "Trace: the model was always built with SDPA, ignoring the plan's attention, and Gemma 2 "
    "(`_supports_sdpa = False`) failed to build; the tracer now follows the plan (eager when asked) and "
    "falls back to eager for a class that refuses SDPA, as from_pretrained would.",
    "Analytic: a checkpointed LoRA block keeps no autocast copy of its frozen weights (autocast caches a "
    "cast only for a leaf that requires grad, aten/src/ATen/autocast_mode.cpp `cached_cast`; a "
    "checkpointed block saves none), only the head's: services/estimator/memory/states.py "
    "`autocast_weight_copy_bytes`. It changes 10 configs: the 8 that are not Gemma 2 went from -1.6%..-15.5% "
    "to within 0.3% of the trace, the 2 Gemma 2 ones from +2.9%/+8.9% to +7.3%/+12.8% (their trace runs "
    "eager attention and soft-capped logits, group below); held-out medium+high unchanged (counter "
    "6.2%/17.3%, fit bytes 9.9%/30.8%, tokens/s 8.7%, OOMs not flagged 0 of 9, refusals 8 of 138).",
    "Analytic: Gemma 2's soft-capping (transformers modeling_gemma2.py): a plan on SDPA runs eager attention "
    "(`_supports_sdpa = False`), whose `softcap` tanh keeps one more score matrix per layer, and the capped "
    "logits keep their tanh output, one more tokens x vocab tensor (services/estimator/memory/activations.py "
    "`attention_softcapped`, memory/loss.py `softcapped_logits_bytes`; architecture fields "
    "`attention_logit_softcap`, `final_logit_softcap`). The 12 gemma-2-2b configs went from 11 outside 5% "
    "(-6.4%..+25.8%) to 4, all full fine-tuning: 06 and 09 (-11.8%, -10.9%) are the head-gradient group "
    "(within 1% without it; 09 was within 5% before only because the missing soft-cap tensors offset the "
    "head gradient) and 03 and 11 (+7.1%, +11.0%) the tied-embedding group. Every LoRA/QLoRA Gemma 2 row is "
    "within 1.3%.",
    "Analytic: eager attention saves no output and no log-sum-exp (only SDPA does; the value matmul's output "
    "is kept by whichever consumer needs it, counted there), and Gemma's RMSNorm keeps its fp32 product "
    "``output * (1.0 + weight.float())`` for a trained weight (Llama keeps the 16-bit one): "
    "services/estimator/memory/activations.py `_attention_saves`, `rms_norm_scaled_bytes`. Measured with "
    "benchmarks/mechanisms on transformers' layers: Llama eager +3.0% -> -0.0%, Falcon +8.2% -> +4.0%, Gemma 2 "
    "LoRA +2.5% -> -0.2%, Gemma 2 full -6.1% -> -0.1%. Sweep: the gemma-2-2b LoRA/QLoRA rows within 0.9%; the "
    "gemma-2b rows move by at most 0.4 points.",
    "Trace: the Trainer's pure-bf16 recipe ran without autocast (the tracer enabled it for the -mixed "
    'precisions only), while accelerate wraps the forward in autocast for mixed_precision "bf16" whatever '
    "the model's dtype (accelerate/accelerator.py `prepare_model`: `autocast_context(model_forward_func)`) "
    "and the analytic recipe assumes it (services/estimator/frameworks.py `FrameworkDefaults.autocast`). Without "
    "it PEFT casts each adapted module's input to the fp32 adapter's dtype (peft/tuners/tuners_utils.py "
    "`_cast_input_dtype`) and lora_A keeps that fp32 copy; under autocast the fp32 copy is a temporary and "
    "lora_A keeps autocast's 16-bit cast. This was the one 'not explained' row, llama-3.2-1b-10 (LoRA "
    "all-linear r64, bf16, 4096 x 4): its storages at the peak by producing op (`python -m "
    "benchmarks.sweep.peak_ops llama-3.2-1b-10`) held per layer seven fp32 `_to_copy` adapter inputs (q, k, "
    "v, o, gate, up at 2048 wide, down at 8192: 1.25 GiB, twice their 16-bit size) and fp32 lora_A outputs, "
    "2.5 GiB more than autocast keeps over the 4 layers; loss tensors, norms and MLP agreed. The tracer now "
    "follows the recipe (`Recipe.autocast`, services/trace/tracer.py `_run_step`): the 26 LoRA/QLoRA bf16 "
    "Trainer rows without checkpointing moved down by 0.01-2.53 GiB (full fine-tuning and checkpointed rows "
    "did not move); llama-3.2-1b-10 went from +6.4% to -1.5%, mistral-7b-v0.1-09 (the one QLoRA stand-in "
    "row) from +7.1% to -1.6%, olmoe-1b-7b-0924-11 from +8.1% to +3.9%. What is left of llama-3.2-1b-10's "
    "-1.5% (0.48 GiB) is two analytic terms, less the adapters' 16-bit casts autocast caches (0.02 GiB): K "
    "and V kept expanded to every head (0.375 GiB), which transformers' SDPA path does under a padding mask, "
    "the Trainer recipe's 'longest' padding, while the trace passes no mask and gets `enable_gqa` "
    "(integrations/sdpa_attention.py `use_gqa_in_sdpa`); and the first block's input norm (0.125 GiB), which "
    "keeps nothing when the frozen embedding's output needs no gradient (LoRA without checkpointing, so no "
    "enable_input_require_grads), a small analytic overcount left unchanged.",
)


def mechanism(row: Row) -> str:
    return next(key for key, _, _, _, rule in GROUPS if rule(row))


def _quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    if not ordered:
        return {}

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

    return {"min": ordered[0], "p10": at(0.1), "median": at(0.5), "p90": at(0.9), "max": ordered[-1]}


def render(data: dict[str, Any]) -> str:
    rows: list[Row] = data["rows"]
    ok = [r for r in rows if r["status"] == "ok"]
    failed = [r for r in rows if r["status"] != "ok"]
    flagged = [r for r in ok if abs(r["diff_pct"]) > THRESHOLD_PCT]
    diffs = [r["diff_pct"] for r in ok]
    replay_gap = [r["replay_diff_pct"] - r["diff_pct"] for r in ok]
    lines = [
        "# Trace against the analytic estimate: a generated sweep",
        "",
        "Generated by `python -m benchmarks.sweep.run` (configs: benchmarks/sweep/configs.py; rewrite this "
        "file from sweep.json with `--report`). Trace: one real transformers/PEFT step under fake tensors "
        "(services/trace/tracer.py), its storages replayed through benchmarks/mechanisms/allocator.py. "
        "Analytic: services/estimator, the allocated peak (`torch.cuda.max_memory_allocated`). "
        "diff = (trace - analytic) / analytic.",
        "",
        f"- configs: {len(rows)}; traced: {len(ok)}; failed or skipped: {len(failed)}; "
        f"run time {data.get('seconds', 0)} s",
        f"- |diff| <= {THRESHOLD_PCT:g}%: {len(ok) - len(flagged)}; |diff| > {THRESHOLD_PCT:g}%: {len(flagged)} "
        f"(trace higher: {sum(r['diff_pct'] > 0 for r in flagged)}, lower: {sum(r['diff_pct'] < 0 for r in flagged)})",
    ]
    if diffs:
        q = _quantiles(diffs)
        lines.append("- diff %: " + ", ".join(f"{k} {v:+.1f}" for k, v in q.items()))
        q = _quantiles([abs(d) for d in diffs])
        lines.append("- |diff| %: " + ", ".join(f"{k} {v:.1f}" for k, v in q.items()))
        q = _quantiles(replay_gap)
        lines.append(
            "- allocator replay's allocated peak less the tracker's, % of analytic: "
            + ", ".join(f"{k} {v:+.2f}" for k, v in q.items())
        )
    lines += ["", "## Fixed by the sweep", ""]
    lines += [f"- {fix}" for fix in FIXED]
    lines += ["", "## Disagreements by mechanism", ""]
    by_group: dict[str, list[Row]] = {}
    for row in flagged:
        by_group.setdefault(mechanism(row), []).append(row)
    for key, title, side, text, _ in GROUPS:
        members = by_group.get(key, [])
        if not members:
            continue
        lines += [f"### {title} ({len(members)})", "", f"Wrong side: {side}. {text}", ""]
        lines += [
            "| config | method | precision | seq x mb | ckpt | trace GiB | analytic GiB | diff % | "
            "no head grad % | head copy only % |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in sorted(members, key=lambda r: r["id"]):
            lines.append(
                f"| {r['id']} | {r['method']} | {r['precision']} | {r['seq_len']} x {r['micro_batch_size']} | "
                f"{'on' if r['gradient_checkpointing'] else 'off'} | {r['trace_gib']:.3f} | {r['analytic_gib']:.3f} "
                f"| {r['diff_pct']:+.1f} | {_without_head_gradient(r):+.1f} | {_with_head_copy_only(r):+.1f} |"
            )
        lines.append("")
    if failed:
        lines += ["## Failed or skipped", "", "| config | status | reason |", "|---|---|---|"]
        lines += [f"| {r['id']} | {r['status']} | {r['reason'][:120]} |" for r in failed]
        lines.append("")
    return "\n".join(lines)


def write_report(data: dict[str, Any], path: Path) -> None:
    path.write_text(render(data), encoding="utf-8")
