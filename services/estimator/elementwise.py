"""Memory-bound element-wise work of a step: the bytes its non-matmul kernels move, charged at memory bandwidth.

In eager PyTorch every RMSNorm (transformers' LlamaRMSNorm: upcast, square, mean, rsqrt, multiply, cast back,
weight), rotary embedding, SwiGLU product, residual add, the loss's upcast and log-softmax, and each of their
backward formulas is a kernel of its own that reads its inputs from device memory and writes its outputs back.
Their FLOPs are negligible, their bytes are not: Ivanov et al. 2021 ("Data Movement Is All You Need", MLSys)
found normalisation and element-wise operators 0.2% of BERT's training FLOPs and over a third of its runtime.
They cost most where a card's FLOPs-per-byte ratio is high (an L40S has 864 GB/s beside 362 dense TFLOPS, an
A100 2,039 GB/s beside 312) and on narrow models (the GEMMs grow with width squared, these bytes with width).

The bytes per token per layer per unit of each width are counted on the real code by
``python -m benchmarks.mechanisms.elementwise`` (benchmarks/results/elementwise.json): every non-view aten op of
transformers' LlamaDecoderLayer other than the matmuls and attention, forward and backward, counted with
TorchDispatchMode as its tensors' bytes in and out. The counts are linear in the widths (a 384-wide shape off
the measured axes matches within 1.1%: the cos/sin reads the estimator leaves out). tests/benchmarks/
test_mechanisms.py holds these constants to the measurement.

Compiled blocks (TorchInductor fuses each chain of pointwise ops into one kernel that reads its inputs once and
writes its outputs once; Ansel et al. 2024, "PyTorch 2", ASPLOS, section 4) and Unsloth's Triton kernels
(unsloth/kernels rms_layernorm.py, rope_embedding.py, swiglu.py: one kernel per norm, rotary and SwiGLU) move
only that unavoidable traffic (``fused_block_bytes``), as fused losses do (``loss_bytes_per_token``).
"""

from __future__ import annotations

from services.estimator.architecture import Architecture, Block
from services.estimator.plan import Plan
from services.estimator.recipe import Recipe

Pair = tuple[float, float]  # (forward, backward) bytes per token per layer per unit of width

# Measured (benchmarks/results/elementwise.json), per precision: "16-bit" weights and activations, "fp32", and
# fp32 weights under bf16 "autocast" (fp32 residual stream and norms, 16-bit matmul outputs).
# - hidden: the block's two norms and two residual adds; an RMSNorm block with its weights trained (their
#   gradients) or frozen (a LoRA base), or torch's fused LayerNorm kernel;
# - intermediate: SwiGLU's silu and gate product, per unit of the MLP's intermediate width;
# - rotary: the rotary embedding of q and of k, per unit of the query width and of the key/value width;
# - eager_scores: eager attention's scaling, softmax (in fp32) and casts of the score matrix, per head per key
#   position.
EAGER_BLOCK_BYTES: dict[str, dict[str, Pair]] = {
    "16-bit": {
        "hidden/rms/trained": (84.0, 222.0),
        "hidden/rms/frozen": (84.0, 206.0),
        "hidden/layer": (20.0, 42.0),
        "intermediate": (10.0, 18.0),
        "rotary": (20.0, 32.0),
        "eager_scores": (24.0, 28.0),
    },
    "fp32": {
        "hidden/rms/trained": (80.0, 252.0),
        "hidden/rms/frozen": (80.0, 220.0),
        "hidden/layer": (40.0, 84.0),
        "intermediate": (20.0, 36.0),
        "rotary": (40.0, 64.0),
        "eager_scores": (16.0, 20.0),
    },
    "autocast": {
        "hidden/rms/trained": (106.0, 294.0),
        "hidden/rms/frozen": (106.0, 262.0),
        "hidden/layer": (66.0, 126.0),
        "intermediate": (10.0, 18.0),
        "rotary": (36.0, 58.0),
        "eager_scores": (24.0, 28.0),
    },
}
# An ungated MLP (GELU, ReLU) keeps the activation and drops the gate product: of SwiGLU's 10 bytes per unit
# forward (silu: read 2, write 2; product: read 4, write 2) 4 stay, of its 18 backward (silu_backward 6, the
# product's two gradient multiplies 12) 6 stay.
UNGATED_SHARE: Pair = (4.0 / 10.0, 6.0 / 18.0)
# transformers' NewGELUActivation (``gelu_new``: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) as eight Python
# tensor ops) per element of the MLP's intermediate width, measured likewise: nine times torch's GELU kernel.
# Under autocast it runs on the 16-bit output of the linear before it.
PYTHON_GELU_BYTES: dict[str, Pair] = {"16-bit": (36.0, 56.0), "fp32": (72.0, 112.0), "autocast": (36.0, 56.0)}
# transformers' ForCausalLMLoss on 16-bit logits, bytes per token per vocabulary entry (measured likewise): the
# fp32 upcast, log_softmax and nll forward; their gradients and the cast back in the backward.
EAGER_LOSS_BYTES_PER_VOCAB_ENTRY: Pair = (18.0, 26.0)


def precision_of(recipe: Recipe) -> str:
    """Which measured precision the plan's element-wise kernels run in."""
    if recipe.compute_bytes == 4:
        return "fp32"
    return "autocast" if recipe.residual_bytes == 4 else "16-bit"


def mlp_width(block: Block) -> float:
    """The MLP's intermediate width one token passes through: every down projection's input, routed experts'
    times the experts each token is sent to (shared experts once)."""
    width = 0.0
    for lin in block.linears:
        if "down" in lin.roles:
            width += lin.in_features * (block.experts_per_token if lin.copies > 1 else 1)
    return width or float(block.intermediate_size)


def eager_block_bytes(arch: Architecture, block: Block, precision: str, trained: bool, python_gelu: bool) -> Pair:
    """(forward, backward) bytes one token moves through one eager block's element-wise kernels; ``python_gelu``:
    the MLP's activation is transformers' gelu_new chain of Python ops."""
    table = EAGER_BLOCK_BYTES[precision]
    if arch.norm == "rms":
        hidden = table["hidden/rms/trained" if trained else "hidden/rms/frozen"]
    else:
        hidden = table["hidden/layer"]
    norms = max(block.norm_count, 1) / 2  # measured on two norms per block (Gemma 2/3 have four)
    mlp = mlp_width(block)
    if python_gelu and not block.mlp_gated:
        activation = PYTHON_GELU_BYTES[precision]
    else:
        gate = (1.0, 1.0) if block.mlp_gated else UNGATED_SHARE
        activation = (table["intermediate"][0] * gate[0], table["intermediate"][1] * gate[1])
    q = float(block.num_heads * block.head_dim)
    kv = float(block.num_kv_heads * block.head_dim)
    out = []
    for i in range(2):
        b = hidden[i] * norms * arch.hidden_size + activation[i] * mlp
        if arch.rotary:
            b += table["rotary"][i] * (q + kv)
        out.append(b)
    return out[0], out[1]


def eager_scores_bytes(block: Block, precision: str, key_positions: float) -> Pair:
    """(forward, backward) bytes per token of eager attention's score-matrix kernels (scale, softmax, casts)."""
    scores = EAGER_BLOCK_BYTES[precision]["eager_scores"]
    n = block.num_heads * key_positions * (2 if block.kind == "cross-decoder" else 1)
    return scores[0] * n, scores[1] * n


def fused_block_bytes(arch: Architecture, block: Block, recipe: Recipe) -> Pair:
    """(forward, backward) bytes per token of a block whose pointwise chains are fused: each norm with the residual
    add before it reads the residual (r bytes) and the branch output (c) and writes both, the SwiGLU reads the gate
    and up projections and writes their product, rotary reads and writes q and k; the backward reads the saved
    inputs and the incoming gradient and writes the gradient, twice the forward's traffic."""
    r, c = float(recipe.residual_bytes), float(recipe.compute_bytes)
    norms = max(block.norm_count, 1)
    fwd = norms * 2 * (r + c) * arch.hidden_size
    fwd += (3 * c if block.mlp_gated else 2 * c) * mlp_width(block)
    if arch.rotary:
        fwd += 2 * c * (block.num_heads + block.num_kv_heads) * block.head_dim
    return fwd, 2 * fwd


def fuses_block_kernels(recipe: Recipe) -> bool:
    """Whether the blocks' norms, rotary and activation run as fused kernels: compiled blocks (Inductor), Unsloth
    (its Triton kernels), and the Trainer with a fused loss, which it gets from Liger alone: TrainingArguments'
    use_liger_kernel patches the model with Liger's defaults, RMSNorm, RoPE and SwiGLU kernels beside the fused
    linear cross-entropy (linkedin/Liger-Kernel liger_kernel/transformers/monkey_patch.py,
    apply_liger_kernel_to_llama: rope, rms_norm, swiglu and fused_linear_cross_entropy default to True)."""
    return recipe.fused_block_kernels


def blocks_bytes_per_token(plan: Plan, arch: Architecture, recipe: Recipe) -> Pair:
    """(forward, backward) element-wise bytes one token moves through all the blocks."""
    fused = fuses_block_kernels(recipe)
    precision = precision_of(recipe)
    trained = plan.method == "full"
    python_gelu = recipe.python_gelu and arch.activation == "gelu_new"
    fwd = bwd = 0.0
    for block in arch.blocks:
        if fused:
            f, b = fused_block_bytes(arch, block, recipe)
        else:
            f, b = eager_block_bytes(arch, block, precision, trained, python_gelu)
        if recipe.attention == "eager":
            sf, sb = eager_scores_bytes(block, precision, plan.seq_len)
            f, b = f + sf, b + sb
        fwd += block.count * f
        bwd += block.count * b
    return fwd, bwd


def loss_bytes_per_token(arch: Architecture, recipe: Recipe) -> Pair:
    """(forward, backward) element-wise bytes of the loss per token: transformers' upcast cross-entropy (torchtune's
    and LitGPT's chunked losses run the same kernels a chunk at a time); a fused or compiled loss reads the
    16-bit logits once and writes their gradient once (Liger's fused linear cross-entropy computes it in place in
    the forward)."""
    v = float(arch.vocab_size)
    if recipe.loss == "fused" or recipe.compiled_loss:
        c = float(recipe.compute_bytes)
        return 2 * c * v, c * v
    return EAGER_LOSS_BYTES_PER_VOCAB_ENTRY[0] * v, EAGER_LOSS_BYTES_PER_VOCAB_ENTRY[1] * v


def elementwise_bytes_per_token(plan: Plan, arch: Architecture, recipe: Recipe, replay: float) -> float:
    """Bytes one token moves through the step's element-wise kernels: the blocks' forward (again, ``replay`` of it,
    under activation checkpointing) and backward, and the loss; the forward only outside training."""
    fwd, bwd = blocks_bytes_per_token(plan, arch, recipe)
    if not plan.is_training:
        return fwd
    loss_fwd, loss_bwd = loss_bytes_per_token(arch, recipe)
    return fwd * (1.0 + replay) + bwd + loss_fwd + loss_bwd


def mpt_elementwise_bytes_per_token(shape: dict[str, float]) -> float:
    """Element-wise bytes per token of a training step of llm-foundry's MPT (16-bit, no checkpointing): per layer
    two LayerNorms and residual adds and an ungated GELU MLP, plus the loss; the shape is MPT's config."""
    table = EAGER_BLOCK_BYTES["16-bit"]
    per_layer = sum(
        table["hidden/layer"][i] * shape["d_model"] + table["intermediate"][i] * UNGATED_SHARE[i] * shape["ffn"]
        for i in range(2)
    )
    return shape["layers"] * per_layer + sum(EAGER_LOSS_BYTES_PER_VOCAB_ENTRY) * shape["vocab"]
