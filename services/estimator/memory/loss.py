"""Logits and loss: the output projection's logits and the cross-entropy's working set."""

from __future__ import annotations

from services.estimator.architecture import Architecture
from services.estimator.plan import Plan
from services.estimator.recipe import Recipe


def chunked_loss_tokens(plan: Plan, recipe: Recipe) -> float:
    """Tokens per chunk of a chunked cross-entropy: a share of the micro-batch (torchtune), or 128
    positions of every sequence (LitGPT's head)."""
    if recipe.loss_chunks:
        return plan.tokens_per_micro_batch / recipe.loss_chunks
    return plan.micro_batch_size * min(plan.seq_len, 128)


def logits_bytes(plan: Plan, arch: Architecture, recipe: Recipe) -> tuple[float, float]:
    """(end of forward, start of backward) bytes of logits, log-probabilities and their gradients.

    Standard loss (transformers ForCausalLMLoss, torchtitan): 16-bit logits, an fp32 upcast for
    cross-entropy whose log_softmax output is kept; its backward holds the kept output, the incoming
    gradient and the input gradient (3 fp32 tensors of tokens x vocab). Chunked loss (torchtune
    CEWithChunkedOutputLoss, LitGPT chunked_cross_entropy) keeps the same log-probabilities but
    materialises the fp32 temporaries one chunk at a time. A fused linear cross-entropy never
    materialises the logits of the whole micro-batch (``fused_linear_cross_entropy_bytes``).
    """
    tokens = plan.tokens_per_micro_batch
    v = arch.vocab_size
    a = recipe.compute_bytes
    up = 4 if recipe.logits_fp32 else a
    if recipe.loss == "fused":
        # Liger's and Unsloth's fused losses take the cap as an argument and apply it chunk by chunk.
        return fused_linear_cross_entropy_bytes(tokens, arch.hidden_size, a)
    if recipe.compiled_loss:
        return compiled_loss_bytes(plan, arch, recipe)
    if recipe.loss_grad_in_place and recipe.loss == "standard":
        # Unsloth's Triton cross-entropy: the 16-bit logits, two fp32 values per token (loss, log-sum-exp),
        # and a backward that overwrites the logits with their gradient (it soft-caps inside the kernel).
        return float(tokens * v * a + 8 * tokens), float(tokens * v * a)
    capped = softcapped_logits_bytes(plan, arch, recipe)
    if recipe.loss == "chunked":
        chunk = chunked_loss_tokens(plan, recipe)
        fwd = tokens * v * (a + up) + chunk * v * up
        bwd = tokens * v * up + chunk * v * 2 * up
        if recipe.loss_keeps_chunks:
            bwd += tokens * v * a  # LitGPT keeps the logits chunks referenced through backward
        return float(fwd + capped), float(bwd + capped)
    fwd = tokens * v * (a + 2 * up)  # logits, upcast copy, kept log-probabilities
    bwd = tokens * v * 3 * up
    return float(fwd + capped), float(bwd + capped)


def softcapped_logits_bytes(plan: Plan, arch: Architecture, recipe: Recipe) -> float:
    """Bytes of the tanh output a soft-capped head keeps for backward, at the end of forward and at the start
    of backward alike.

    transformers' Gemma2ForCausalLM.forward computes ``logits / cap``, ``torch.tanh``, ``* cap`` on the head's
    output (modeling_gemma2.py) and LitGPT's GPT.forward applies ``do_softcapping`` (``tanh(x / thresh) *
    thresh``) to every head chunk: tanh saves its output (TanhBackward0 keeps ``result``), so one more tokens x
    vocab tensor in the head's dtype lives from the forward until the cap's backward, beside the returned logits
    (the division and the scalar product save nothing). torchtune's gemma2 caps the final norm's output, not
    the logits (Gemma2FinalNorm, torchtune/models/gemma2/_component_builders.py): hidden-wide, not counted.
    """
    if not arch.final_logit_softcap or recipe.framework not in ("hf-trainer", "pytorch", "axolotl", "litgpt"):
        return 0.0
    return float(plan.tokens_per_micro_batch * arch.vocab_size * recipe.compute_bytes)


def fused_linear_cross_entropy_bytes(tokens: float, hidden: int, compute_bytes: int) -> tuple[float, float]:
    """(end of forward, start of backward) bytes of a fused linear cross-entropy: the head's matmul and the
    loss run chunk by chunk, so the logits of the whole micro-batch never exist.

    Liger's FusedLinearCrossEntropy (linkedin/Liger-Kernel ops/fused_linear_cross_entropy.py) computes
    the input gradient during the forward into ``grad_input = zeros_like(input)`` (tokens x hidden, kept
    for backward) and sizes its chunks so that one chunk's logits hold as many elements as the hidden
    states (``inc_factor = cdiv(V, H)``, ``chunk_size = next_power_of_2(cdiv(BT, inc_factor))``), plus an
    fp32 loss per token. Unsloth's ``unsloth_fused_ce_loss`` (unsloth_zoo fused_losses: the same chunked
    scheme, its chunk sized to the memory left) and Cut Cross-Entropy (Wijmans et al. 2024, arXiv
    2411.09009: logits only in on-chip memory, axolotl's CCE plugin) hold no more.
    """
    hidden_bytes = tokens * hidden * compute_bytes
    per_token_loss = 4.0 * tokens
    return 2.0 * hidden_bytes + per_token_loss, hidden_bytes + per_token_loss


def compiled_loss_bytes(plan: Plan, arch: Architecture, recipe: Recipe) -> tuple[float, float]:
    """(end of forward, start of backward) bytes of logits and loss when the cross-entropy is compiled.

    Inductor fuses the fp32 upcast, log-softmax and the target gather into one reduction kernel and its
    partitioner saves the kernel's input and the per-token log-sum-exp instead of the fp32
    log-probabilities (min_cut_rematerialization_partition recomputes the softmax in backward).
    Chunked (torchtune's CEWithChunkedOutputLoss.apply_compile_strategy compiles compute_cross_entropy
    per chunk): the 16-bit logit chunks stay, and backward writes one chunk's 16-bit gradient at a time.
    Standard: the decoder upcasts outside the compiled region (torchtune's TransformerDecoder returns
    output.float()), so the fp32 logits are the saved input and backward adds their fp32 gradient.
    """
    tokens = plan.tokens_per_micro_batch
    v = arch.vocab_size
    a = recipe.compute_bytes
    up = 4 if recipe.logits_fp32 else a
    if recipe.loss == "chunked":
        chunk = chunked_loss_tokens(plan, recipe)
        return float(tokens * v * a), float(tokens * v * a + chunk * v * a)
    return float(tokens * v * (a + up)), float(tokens * v * 2 * up)
