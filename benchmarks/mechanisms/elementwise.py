"""Bytes the non-matmul kernels of a transformer block and of the loss move per token, counted on the real code.

A training step is not only GEMMs and attention: eager PyTorch runs every RMSNorm (upcast, square, mean,
rsqrt, multiply, cast back, weight), rotary embedding, SwiGLU, residual add and their backward formulas as
separate memory-bound kernels, each reading its inputs from and writing its outputs to device memory
(Ivanov et al. 2021, "Data Movement Is All You Need", MLSys: in BERT training the normalisation and
element-wise operators take 0.2% of the FLOPs and a third of the runtime). The estimator charges these
bytes at the card's memory bandwidth (services/estimator/elementwise.py). This script counts them:

- every non-view aten op of a forward and a backward pass of transformers' ``LlamaDecoderLayer`` (SDPA)
  except the matmuls and the attention kernel, counted with ``TorchDispatchMode`` as the bytes of its tensor
  inputs plus its outputs, per token and per layer (the difference of a 2-layer and a 1-layer stack, and of
  128 and 64 tokens, so the rotary table and the per-call constants drop out);
- per unit of each width the block has: the hidden size, the MLP's intermediate size, the query width
  (heads x head_dim) and the key/value width (kv heads x head_dim), each varied alone;
- in three precisions: 16-bit weights and activations, fp32, and fp32 weights under bf16 autocast (the
  Trainer's usual LoRA recipe: fp32 residual stream and norms, bf16 matmul outputs), and with the block's
  weights trained (full fine-tuning: norm weight gradients) or frozen (a LoRA base), with torch's LayerNorm
  in place of the RMSNorms, and with transformers' eager attention (its score-matrix kernels, per head per
  key position);
- transformers' ``NewGELUActivation`` (``gelu_new``), per element;
- transformers' ``ForCausalLMLoss`` on 16-bit logits, per vocabulary entry per token.

Needs the ``trace`` extra (torch, transformers). Run: ``python -m benchmarks.mechanisms.elementwise``
(writes benchmarks/results/elementwise.json); tests/benchmarks/test_mechanisms.py checks the estimator's
constants against ``coefficients``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[1] / "results"
# The counted shape and one step along each width: (hidden, intermediate, heads, kv heads); head_dim 64.
BASE = (256, 512, 4, 2)
HEAD_DIM = 64
TOKENS = (64, 128)
# Ops that are not element-wise traffic: the GEMMs (the estimator's roofline), attention (its FLOPs), and
# _unsafe_view, which returns an alias although its schema does not say so.
NOT_COUNTED = ("mm", "addmm", "bmm", "_unsafe_view")
PRECISIONS = ("16-bit", "fp32", "autocast")


def _bytes_mode() -> Any:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class CountBytes(TorchDispatchMode):
        """Sums the bytes of the tensors each non-view, non-matmul aten op reads and writes."""

        def __init__(self) -> None:
            super().__init__()
            self.bytes = 0

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            schema = func._schema
            name = schema.name.split("::")[-1]
            is_view = not schema.is_mutable and any(r.alias_info for r in schema.returns)
            if is_view or name in NOT_COUNTED or "attention" in name:
                return out
            tensors = [t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)]
            self.bytes += sum(t.numel() * t.element_size() for t in tensors)
            return out

    return CountBytes


def _pass_bytes(
    layers: int,
    widths: tuple[int, int, int, int],
    precision: str,
    trained: bool,
    tokens: int,
    norm: str = "rms",
    attention: str = "sdpa",
) -> tuple[int, int]:
    """(forward, backward) counted bytes of one training pass over a ``layers``-deep Llama stack; ``norm``
    "layer" puts torch's LayerNorm (with bias) where the RMSNorms are, ``attention`` "eager" runs
    transformers' eager attention (the scores materialised) instead of SDPA."""
    import contextlib

    import torch
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    hidden, intermediate, heads, kv_heads = widths
    cfg = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=HEAD_DIM,
        num_hidden_layers=layers,
        vocab_size=100,
    )
    cfg._attn_implementation = attention
    dtype = torch.bfloat16 if precision == "16-bit" else torch.float32
    torch.manual_seed(0)
    blocks = torch.nn.ModuleList([LlamaDecoderLayer(cfg, i) for i in range(layers)]).to(dtype)
    if norm == "layer":
        for block in blocks:
            block.input_layernorm = torch.nn.LayerNorm(hidden, dtype=dtype)
            block.post_attention_layernorm = torch.nn.LayerNorm(hidden, dtype=dtype)
    blocks.requires_grad_(trained)
    rope = LlamaRotaryEmbedding(cfg)
    x = torch.randn(1, tokens, hidden, dtype=dtype, requires_grad=True)
    positions = torch.arange(tokens).unsqueeze(0)
    embeddings = tuple(t.to(dtype) for t in rope(x, positions))
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "autocast" else contextlib.nullcontext()
    mode = _bytes_mode()
    forward = mode()
    with forward, autocast:
        h = x
        for block in blocks:
            out = block(h, position_embeddings=embeddings, attention_mask=None, position_ids=positions)
            h = out[0] if isinstance(out, tuple) else out
    loss = h.float().sum()
    backward = mode()
    with backward:
        loss.backward()
    return forward.bytes, backward.bytes


def per_token_per_layer(
    widths: tuple[int, int, int, int], precision: str, trained: bool, norm: str = "rms"
) -> tuple[float, float]:
    """(forward, backward) bytes per token per layer: second differences over layers and tokens."""
    counts = {
        (layers, tokens): _pass_bytes(layers, widths, precision, trained, tokens, norm)
        for layers in (1, 2)
        for tokens in TOKENS
    }
    short, long = TOKENS
    out = []
    for i in range(2):
        per_layer = {t: counts[(2, t)][i] - counts[(1, t)][i] for t in TOKENS}
        out.append((per_layer[long] - per_layer[short]) / (long - short))
    return out[0], out[1]


def _step(
    widths: tuple[int, int, int, int], precision: str, trained: bool, norm: str, axis: int, unit: int
) -> tuple[float, float]:
    """(forward, backward) bytes per token per layer per unit of one width: that width doubled, less the base."""
    moved = list(widths)
    moved[axis] *= 2
    base = per_token_per_layer(widths, precision, trained, norm)
    more = per_token_per_layer((moved[0], moved[1], moved[2], moved[3]), precision, trained, norm)
    return (more[0] - base[0]) / unit, (more[1] - base[1]) / unit


def coefficients(precision: str) -> dict[str, tuple[float, float]]:
    """(forward, backward) bytes per token per layer per unit of each width, in one precision.

    ``hidden`` (norms and residual adds) for RMSNorm and LayerNorm blocks with trained and frozen weights (the
    norm weights' gradients), ``intermediate`` (SwiGLU: silu and the gate product), ``query`` and
    ``key_value`` (rotary embedding on q and k), and ``eager_scores`` per head per key position (the score
    matrix eager attention scales, masks, softmaxes and casts). What is left at head_dim 64, the cos/sin
    reads, is 0.3% of a 2048-wide block and is not counted."""
    hidden, intermediate, heads, kv_heads = BASE
    out: dict[str, tuple[float, float]] = {}
    for norm in ("rms", "layer"):
        for trained in (True, False):
            key = f"hidden/{norm}/{'trained' if trained else 'frozen'}"
            out[key] = _step(BASE, precision, trained, norm, 0, hidden)
    out["intermediate"] = _step(BASE, precision, True, "rms", 1, intermediate)
    out["query"] = _step(BASE, precision, True, "rms", 2, heads * HEAD_DIM)
    out["key_value"] = _step(BASE, precision, True, "rms", 3, kv_heads * HEAD_DIM)
    short, long = TOKENS
    per_layer: dict[str, dict[int, tuple[int, int]]] = {}
    for attention in ("sdpa", "eager"):
        per_layer[attention] = {}
        for tokens in TOKENS:
            one = _pass_bytes(1, BASE, precision, True, tokens, attention=attention)
            two = _pass_bytes(2, BASE, precision, True, tokens, attention=attention)
            per_layer[attention][tokens] = (two[0] - one[0], two[1] - one[1])
    # eager - sdpa per layer = c x heads x tokens^2 + d x tokens: per token that is c x heads x tokens + d,
    # and the difference between the two token counts isolates c.
    extra = {t: [(per_layer["eager"][t][i] - per_layer["sdpa"][t][i]) / t for i in range(2)] for t in TOKENS}
    out["eager_scores"] = (
        (extra[long][0] - extra[short][0]) / heads / (long - short),
        (extra[long][1] - extra[short][1]) / heads / (long - short),
    )
    return out


def predicted(coef: dict[str, tuple[float, float]], widths: tuple[int, int, int, int]) -> tuple[float, float]:
    """Bytes per token per layer of a trained RMSNorm block of ``widths`` from the coefficients (the cos/sin
    reads left out, as in the estimator)."""
    hidden, intermediate, heads, kv_heads = widths
    return tuple(  # type: ignore[return-value]
        coef["hidden/rms/trained"][i] * hidden
        + coef["intermediate"][i] * intermediate
        + coef["query"][i] * heads * HEAD_DIM
        + coef["key_value"][i] * kv_heads * HEAD_DIM
        for i in range(2)
    )


def gelu_new_bytes_per_element(precision: str) -> tuple[float, float]:
    """(forward, backward) bytes transformers' NewGELUActivation (``gelu_new``, a chain of Python tensor ops) moves
    per element; under autocast it runs on the 16-bit output of the linear before it."""
    import torch
    from transformers.activations import NewGELUActivation

    dtype = torch.float32 if precision == "fp32" else torch.bfloat16
    counts = {}
    for n in (4096, 8192):
        x = torch.randn(n, dtype=dtype, requires_grad=True)
        mode = _bytes_mode()
        forward = mode()
        with forward:
            y = NewGELUActivation()(x)
        grad = torch.ones_like(y)
        backward = mode()
        with backward:
            y.backward(grad)
        counts[n] = (forward.bytes, backward.bytes)
    return (counts[8192][0] - counts[4096][0]) / 4096, (counts[8192][1] - counts[4096][1]) / 4096


def loss_bytes_per_vocab_entry() -> tuple[float, float]:
    """(forward, backward) bytes transformers' ForCausalLMLoss moves per token per vocabulary entry on bf16 logits."""
    import torch
    from transformers.loss.loss_utils import ForCausalLMLoss

    counts = {}
    for vocab in (512, 1024):
        torch.manual_seed(0)
        logits = torch.randn(1, 64, vocab, dtype=torch.bfloat16, requires_grad=True)
        labels = torch.randint(0, vocab, (1, 64))
        mode = _bytes_mode()
        forward = mode()
        with forward:
            loss = ForCausalLMLoss(logits, labels, vocab_size=vocab)
        backward = mode()
        with backward:
            loss.backward()
        counts[vocab] = (forward.bytes, backward.bytes)
    return tuple((counts[1024][i] - counts[512][i]) / 512 / 64 for i in range(2))  # type: ignore[return-value]


def main() -> int:
    import torch

    from services.estimator import elementwise as estimator

    torch.set_num_threads(1)
    off_axis = (384, 768, 6, 3)
    rows: list[dict[str, Any]] = []
    for precision in PRECISIONS:
        coef = coefficients(precision)
        rows.append(
            {
                "precision": precision,
                "bytes_per_token_per_layer_per_width": {
                    k: {"forward": v[0], "backward": v[1]} for k, v in coef.items()
                },
                "off_axis_shape": off_axis,
                "off_axis_counted": per_token_per_layer(off_axis, precision, True),
                "off_axis_from_coefficients": predicted(coef, off_axis),
                "gelu_new_bytes_per_element": gelu_new_bytes_per_element(precision),
            }
        )
    loss = loss_bytes_per_vocab_entry()
    result = {
        "machine": {"torch": torch.__version__, "head_dim": HEAD_DIM, "tokens": TOKENS, "base_shape": BASE},
        "block": rows,
        "loss_bytes_per_token_per_vocab_entry": {"forward": loss[0], "backward": loss[1]},
        "estimator": {
            "eager_block_bytes": estimator.EAGER_BLOCK_BYTES,
            "eager_loss_bytes_per_vocab_entry": estimator.EAGER_LOSS_BYTES_PER_VOCAB_ENTRY,
            "python_gelu_bytes": estimator.PYTHON_GELU_BYTES,
        },
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "elementwise.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    for row in rows:
        c = row["bytes_per_token_per_layer_per_width"]
        print(
            f"{row['precision']:8s} "
            + " ".join(f"{k} {v['forward']:.0f}/{v['backward']:.0f}" for k, v in c.items())
            + f"; off-axis {row['off_axis_counted']} counted, {row['off_axis_from_coefficients']} from the coefficients"
        )
    print(f"loss per vocab entry: {loss[0]:.1f} forward, {loss[1]:.1f} backward")
    return 0


if __name__ == "__main__":
    sys.exit(main())
