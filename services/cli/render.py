"""Plain-text tables of an estimate for the terminal."""

from __future__ import annotations

from services.estimator.padding import padding_shows
from services.estimator.reports import Estimate

_LABELS = {
    "weights": "weights",
    "adapters": "LoRA adapters",
    "master_weights": "fp32 master weights",
    "gradients": "gradients",
    "optimizer_states": "optimizer states",
    "ddp_buckets": "DDP gradient buckets",
    "activations": "activations",
    "autocast_weight_copies": "16-bit weight copies (autocast)",
    "logits_and_loss": "logits and loss",
    "logits": "logits (last position)",
    "temporaries": "backward/optimizer temporaries",
    "sharding_buffers": "gathered shards (FSDP/ZeRO-3)",
    "dequantized_weights": "dequantized 16-bit weights (4-bit base)",
    "tied_embedding_gradient": "tied embedding's second gradient",
    "quantization_temporaries": "quantizing at load",
    "kv_cache": "KV cache",
    "allocator_reserve": "allocator reserve (fragmentation)",
    "cuda_context": "CUDA context + NCCL",
    "safety_margin": "safety margin",
}


def table(headers: list[str], rows: list[list[str]], right: set[int] | None = None) -> str:
    """Columns padded to their widest cell under a header and a rule; `right` aligns those columns right."""
    right = right or set()
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def _hours(h: float | None) -> str:
    if h is None:
        return "-"
    return f"{h * 60:.0f} min" if h < 1 else f"{h:.1f} h"


def render_estimate(e: Estimate) -> str:
    p = e.parameters
    out = [
        f"{e.model}  ({e.model_type}, {p.total / 1e9:.2f}B parameters"
        + (f", {p.active / 1e9:.2f}B active" if p.active != p.total else "")
        + (f"; trainable {p.trainable / 1e6:,.1f}M; {e.mode})" if e.mode == "train" else f"; {e.mode})"),
        "",
        f"Peak memory per GPU (peak moment: {e.memory.peak_moment.replace('_', ' ')}):",
    ]
    rows = [[_LABELS.get(k, k.replace("_", " ")), f"{v:.2f}"] for k, v in e.memory.breakdown.items()]
    out.append(table(["component", "GiB"], rows, right={1}))
    out += [
        "",
        f"  allocated {e.memory.peak_allocated_gib:.2f} GiB (torch.cuda.max_memory_allocated)",
        f"  reserved  {e.memory.peak_reserved_gib:.2f} GiB (torch.cuda.max_memory_reserved)",
        f"  device    {e.memory.peak_device_gib:.2f} GiB (nvidia-smi)",
        f"  80% band  {e.memory.interval_gib[0]:.2f}-{e.memory.interval_gib[1]:.2f} GiB on the device "
        f"({e.memory.interval_basis})",
    ]
    if e.memory.reclaimable_cache_gib:
        out.append(
            f"  + {e.memory.reclaimable_cache_gib:.2f} GiB of free cached blocks the counters may also show "
            "(FSDP1 stream pools, segments of other batch lengths, blocks checkpointed rebuilds left; "
            "freed before an out-of-memory)"
        )
    if e.memory.optimizer_states_paged_gib:
        out.append(f"  + {e.memory.optimizer_states_paged_gib:.2f} GiB of paged optimizer states (unified memory)")
    out += ["", "Fits on:"]
    fit_rows = [
        [
            f.gpu,
            f"{f.memory_gib:.1f}",
            "yes" + (" (tight)" if f.tight else "") if f.fits else "no",
            f"{f.headroom_gib:+.1f}",
        ]
        # Smallest card first, so the first "yes" is the smallest card the run fits on.
        for f in sorted(e.fits, key=lambda f: (f.memory_gib, f.gpu))
    ]
    out.append(table(["GPU", "GiB", "fits", "headroom GiB"], fit_rows, right={1, 3}))
    if e.mode != "train":
        return "\n".join([*out, *_serving_tail(e)])
    if e.throughput is not None:
        t = e.throughput
        out += [
            "",
            f"Throughput on {t.gpus} x {t.gpu}: {t.tokens_per_s:,.0f} tokens/s "
            f"({t.tokens_per_s_per_gpu:,.0f} per GPU, MFU {t.mfu:.0%}; utilisation {t.utilisation_assumed:.0%}, "
            f"{t.utilisation_source})",
        ]
        if padding_shows(t.tokens_per_s, t.data_tokens_per_s):
            out.append(f"  of which data tokens: {t.data_tokens_per_s:,.0f}/s (the rest is padding; see assumptions)")
    if e.costs:
        head = "Cost" + (
            f" for {e.total_tokens / 1e6:,.1f}M tokens" if e.total_tokens else " (give --dataset-tokens for totals)"
        )
        out += ["", head + ":"]
        cost_rows = [
            [
                c.provider,
                f"{c.gpus} x {c.gpu}",
                "yes" if c.fits else "no",
                f"{c.data_tokens_per_s:,.0f}",
                f"{c.on_demand_usd_per_hour:.2f}",
                f"{c.usd_per_million_tokens:.3f}",
                _hours(c.hours),
                "-" if c.on_demand_usd is None else f"{c.on_demand_usd:,.2f}",
                "-" if c.spot_usd is None else f"{c.spot_usd:,.2f}",
            ]
            for c in e.costs
        ]
        out.append(
            table(
                [
                    "provider",
                    "setup",
                    "fits",
                    "data tok/s",
                    "$/h",
                    "$/M tokens",
                    "time",
                    "on-demand $",
                    "spot $",
                ],
                cost_rows,
                right={3, 4, 5, 6, 7, 8},
            )
        )
    if e.warnings:
        out += ["", "Warnings:", *(f"  - {w}" for w in e.warnings)]
    out += ["", "Assumptions:", *(f"  - {a}" for a in e.assumptions)]
    return "\n".join(out)


def _serving_tail(e: Estimate) -> list[str]:
    """An inference estimate's prefill rate and price per prompt token, warnings and assumptions: no data set,
    run time or training line (decode speed and cost per generated token are not estimated)."""
    out: list[str] = []
    if e.throughput is not None:
        t = e.throughput
        out += [
            "",
            f"Prefill on {t.gpus} x {t.gpu}: {t.tokens_per_s:,.0f} prompt tokens/s "
            f"(utilisation {t.utilisation_assumed:.0%}, {t.utilisation_source}); decode speed is not estimated",
        ]
    if e.costs:
        rows = [
            [
                c.provider,
                f"{c.gpus} x {c.gpu}",
                "yes" if c.fits else "no",
                f"{c.tokens_per_s:,.0f}",
                f"{c.on_demand_usd_per_hour:.2f}",
                f"{c.usd_per_million_tokens:.3f}",
            ]
            for c in e.costs
        ]
        out += ["", "Prefill price (prompt tokens only):"]
        out.append(
            table(["provider", "setup", "fits", "prefill tok/s", "$/h", "$/M prompt tokens"], rows, right={3, 4, 5})
        )
    if e.warnings:
        out += ["", "Warnings:", *(f"  - {w}" for w in e.warnings)]
    out += ["", "Assumptions:", *(f"  - {a}" for a in e.assumptions)]
    return out
