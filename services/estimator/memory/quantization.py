"""Quantized weights: storage per element, the dequantized copies a step makes, the load-time peak.

Sources: QLoRA (Dettmers et al. 2023, arXiv 2305.14314) for NF4 constants; bitsandbytes, torchao
and auto-gptq for their layouts.
"""

from __future__ import annotations

from services.estimator.architecture import Architecture
from services.estimator.plan import Plan
from services.estimator.recipe import Recipe

# NF4 / int8 storage per quantized weight element (bytes), including the quantization constants.
# bitsandbytes NF4: 4-bit codes + one fp32 absmax per 64-element block (QLoRA paper, section 2).
# The packed 4-bit codes alone, the part FSDP and ZeRO-3 shard.
NF4_CODE_BYTES = 0.5
NF4_BNB_BYTES = NF4_CODE_BYTES + 4 / 64
# torchao NF4Tensor (torchtune): block 64, absmax quantized to int8 with an fp32 scaler per 256 blocks,
# the same layout as QLoRA's double quantization.
NF4_DOUBLE_QUANT_BYTES = 0.5 + 1 / 64 + 4 / (64 * 256)
# LLM.int8() (Dettmers et al. 2022, arXiv 2208.07339; bitsandbytes Int8Params): int8 weights, and one fp32
# scale per output row (weight.SCB), counted per row by int8_row_scale_bytes.
INT8_BYTES = 1.0
INT8_ROW_SCALE_BYTES = 4
# GPTQ 4-bit (auto-gptq's QuantLinear): 4-bit codes in int32 words, and per group of 128 input rows an
# fp16 scale and a 4-bit zero point per output column (the group size of the common checkpoints; g_idx,
# one int32 per input row, is negligible).
GPTQ_BYTES = 0.5 + 2 / 128 + 0.5 / 128
# AWQ 4-bit (Lin et al. 2023, arXiv 2306.00978; AutoAWQ's WQLinear_GEMM): qweight packs eight 4-bit codes
# per int32, and per group of 128 input rows qzeros packs eight 4-bit zeros per int32 and scales holds one
# fp16 per output column: the same layout as GPTQ's.
AWQ_BYTES = 0.5 + 2 / 128 + 0.5 / 128
# quantization_config.group_size where an AWQ or GPTQ checkpoint gives none: transformers' GPTQConfig and
# AwqConfig default (group_size: int = 128); absent bits are read as 4, AwqConfig's default.
DEFAULT_GROUP_SIZE = 128
# FP8 (E4M3) weights, as vLLM's and TensorRT-LLM's fp8 checkpoints store them: one byte per element and one
# fp32 scale per tensor (or per output channel), negligible beside the weight.
FP8_BYTES = 1.0


def groupwise_bytes_per_weight(bits: int, group_size: int) -> float:
    """Bytes an AWQ or GPTQ weight element is stored in at ``bits`` per code, with ``group_size`` input rows
    per group (-1: one group spanning the row), its scale and zero point included.

    AutoGPTQ's QuantLinear (auto_gptq/nn_modules/qlinear/qlinear_cuda_old.py, bits 2, 3, 4 or 8) registers
    ``qweight`` int32 (infeatures // 32 * bits, outfeatures): 32 // bits codes per word at 2, 4 and 8 bits, 32
    3-bit codes in three words, bits / 8 bytes per weight at every width; ``qzeros`` int32
    (ceil(infeatures / group_size), outfeatures // 32 * bits), one ``bits``-wide zero per output column and
    group; ``scales`` fp16 (ceil(infeatures / group_size), outfeatures); ``g_idx``, one int32 per input row
    (4 / outfeatures bytes per weight, left out). AutoAWQ's WQLinear_GEMM (awq/modules/linear/gemm.py) packs
    the same per group: ``qweight`` int32 (in_features, out_features // 32 * w_bit), ``qzeros`` alike per
    group, ``scales`` fp16 (in_features // group_size, out_features); its constructor, like vLLM's AWQConfig,
    takes 4 bits only, so other AWQ widths are sized by that packing. So bits / 8 + (2 + bits / 8) / group_size:
    4 bits in groups of 128 is GPTQ_BYTES and AWQ_BYTES. With -1 a linear keeps one scale and zero per output
    column, (2 + bits / 8) / in_features bytes per weight, under 0.5% of a 2-bit code for rows of 2,048
    inputs or more: left out, as g_idx is.
    """
    codes = bits / 8
    if group_size < 1:
        return codes
    return codes + (2 + codes) / group_size  # the fp16 scale and the packed zero of each group


def groupwise_layout(plan: Plan) -> tuple[int, int]:
    """(bits, group_size) of the plan's AWQ or GPTQ weights: those of the checkpoint's quantization_config
    when its quant_method is the plan's format (architecture.checkpoint has checked them), else, or where it
    leaves them out, 4 bits in groups of DEFAULT_GROUP_SIZE as AwqConfig and GPTQConfig default."""
    stored = (plan.model.config or {}).get("quantization_config")
    if not isinstance(stored, dict) or stored.get("quant_method") != plan.quantized:
        return 4, DEFAULT_GROUP_SIZE
    return int(stored.get("bits", 4)), int(stored.get("group_size", DEFAULT_GROUP_SIZE))


def quantized_params(arch: Architecture, recipe: Recipe) -> int:
    """Weights stored 4/8-bit: every block linear (not biases), plus the head where the framework does."""
    total = arch.block_linear_weights
    if recipe.quantize_lm_head:
        total += arch.lm_head_matmul_params if not arch.tie_word_embeddings else 0
    return total


def quantized_bytes_per_weight(plan: Plan, recipe: Recipe) -> float:
    """Bytes a quantized weight element is stored in, its quantization constants included (the int8 row
    scales apart: int8_row_scale_bytes)."""
    quant = plan.quantized
    if quant == "int8":
        return INT8_BYTES
    if quant == "fp8":
        return FP8_BYTES
    if quant in ("awq", "gptq"):
        return groupwise_bytes_per_weight(*groupwise_layout(plan))
    if recipe.quant_backend == "bitsandbytes" and recipe.nf4_double_quant:
        # bnb_4bit_use_double_quant: the absmax quantized to 8 bits in blocks of 256 with an fp32 scale each
        # (QLoRA paper section 2, "Double Quantization": 32/64 = 0.5 bits per parameter -> 8/64 + 32/(64*256)
        # = 0.127), the layout torchao's NF4Tensor uses.
        return NF4_DOUBLE_QUANT_BYTES
    return {"torchao": NF4_DOUBLE_QUANT_BYTES, "auto-gptq": GPTQ_BYTES}.get(recipe.quant_backend, NF4_BNB_BYTES)


def unsharded_quant_constant_bytes(plan: Plan, arch: Architecture, recipe: Recipe) -> float:
    """Bytes of a bitsandbytes NF4 base's block constants (absmax, nested or not) that every rank holds whole
    under FSDP or ZeRO-3.

    bitsandbytes keeps them in ``quant_state``, an attribute beside the parameter, not a parameter or a
    buffer: FSDP and ZeRO-3 partition only the packed 4-bit codes (bnb_4bit_quant_storage), and Linear4bit
    reads the whole state back from the module after a gather (bitsandbytes/nn/modules.py,
    fix_4bit_weight_quant_state_from_module). Answer.AI's train.py quantizes on every rank for the same
    reason ("FSDP only syncs parameters and buffers, so the quant_state isn't copied", load_and_quantize).
    """
    if plan.quantized != "nf4" or recipe.quant_backend != "bitsandbytes" or plan.sharding not in ("fsdp", "zero3"):
        return 0.0
    return quantized_params(arch, recipe) * (quantized_bytes_per_weight(plan, recipe) - NF4_CODE_BYTES)


def int8_row_scale_bytes(plan: Plan, arch: Architecture, recipe: Recipe) -> float:
    """LLM.int8()'s fp32 scale per output row of every int8 linear (bitsandbytes Int8Params.SCB)."""
    if plan.quantized != "int8":
        return 0.0
    rows = sum(b.count * lin.copies * lin.out_features for b in arch.blocks for lin in b.linears)
    if recipe.quantize_lm_head and not arch.tie_word_embeddings:
        rows += arch.vocab_size
    return float(rows * INT8_ROW_SCALE_BYTES)


def bnb_dequantize_bytes(plan: Plan, arch: Architecture, recipe: Recipe) -> tuple[float, float]:
    """(output head, largest block linear) bytes of the full-precision copy bitsandbytes makes per matmul.

    MatMul4Bit runs F.linear(A, F.dequantize_4bit(B, quant_state).to(A.dtype).t()) in forward and the
    same dequantization for the input gradient in backward (bitsandbytes/autograd/_functions.py): the
    whole weight exists in 16-bit while the matmul runs, plus a second copy when the dequantized dtype
    (quant_state.dtype, the dtype the weight was quantized from) is not the compute dtype. The copy is a
    temporary of the one matmul, never saved for backward: forward keeps ctx.tensors = (A, B) or
    (None, B), B being the packed 4-bit weight, and backward dequantizes again. So one layer's copy
    exists at a time, in forward and in backward alike; under gradient checkpointing the recomputed
    forward's copy is freed before that block's backward makes its own. Only 4-bit bitsandbytes layers
    do this; torchao's NF4 and int8 paths are not modelled here.
    """
    if plan.quantized != "nf4" or recipe.quant_backend != "bitsandbytes" or not plan.is_training:
        return 0.0, 0.0
    per = recipe.compute_bytes + (2 if recipe.bnb_dequant_cast else 0)  # + the fp16 copy before the cast
    block = arch.largest_linear_weights
    head = arch.lm_head_matmul_params if recipe.quantize_lm_head and not arch.tie_word_embeddings else 0
    return float(head * per), float(block * per)


def gptq_dequantized_bytes(plan: Plan, arch: Architecture, recipe: Recipe) -> tuple[float, float]:
    """(end of forward, during backward) bytes of the 16-bit weights auto-gptq's QuantLinear dequantizes.

    For the row counts of training (at least ``kernel_switch_threshold``, 128) and with exllama off, as
    training needs, ``QuantLinear.forward`` (auto_gptq/nn_modules/qlinear/qlinear_cuda_old.py) unpacks the
    weight with PyTorch ops, shift to int32, cast to int8, mask, subtract the zeros, multiply by the scales
    into a 16-bit weight, and runs ``torch.matmul(x, weight)``. Autograd saves that weight for the input
    gradient (the matmul's other operand needs none), so it lives until the layer's backward, and the
    backward does not dequantize again. Without checkpointing every block linear's copy is saved through
    the forward; with it, a block's replay saves the copies of its own linears for its backward, and its
    largest linear's unpacking peaks 3 bytes per element above its copy (the int32 and int8 stages).
    """
    if plan.quantized is None or recipe.quant_backend != "auto-gptq" or not plan.is_training:
        return 0.0, 0.0
    copy = 2.0  # the 16-bit weight
    if not plan.gradient_checkpointing:
        saved = copy * quantized_params(arch, recipe)
        return saved, saved
    block = max(sum(lin.copies * lin.in_features * lin.out_features for lin in b.linears) for b in arch.blocks)
    largest = arch.largest_linear_weights
    return 0.0, copy * block + 3.0 * largest


def int8_input_bytes(recipe: Recipe) -> int:
    """Bytes per element of what reaches a bitsandbytes int8 linear, the dtype its backward dequantizes to.

    Linear8bitLt passes its input to MatMul8bitLt as it comes (unlike Linear4bit it casts nothing to a compute
    dtype, and the custom autograd Function is outside autocast), and returns its output in that dtype: the
    residual stream's, fp32 under the -mixed precisions or after prepare_model_for_kbit_training's fp32
    embeddings and norms (recipe.residual_bytes), which the MLP's down projection inherits through gate and up.
    """
    return recipe.residual_bytes


def bnb_int8_dequantize_bytes(plan: Plan, arch: Architecture, recipe: Recipe) -> tuple[float, float]:
    """(output head, largest block linear) bytes of the copy a bitsandbytes int8 layer dequantizes in backward.

    MatMul8bitLt.backward computes the input gradient from a dequantized weight, ``CB =
    state.CB.to(ctx.dtype_A, copy=True).mul_(state.SCB.unsqueeze(1).mul(1.0 / 127.0))`` then
    ``torch.matmul(grad_output, CB)`` (bitsandbytes/autograd/_functions.py, 0.37 to 0.49; before 0.45 a weight
    held in the col_turing/col_ampere layout goes through ``undo_layout`` first): the layer's whole weight in
    the input's dtype, a temporary of that one backward. On cards without int8 tensor cores (compute
    capability below 7.5: V100, P100; ``supports_igemmlt``) bitsandbytes before 0.45 runs the forward the same
    way, ``F.linear(A_wo_outliers, state.CB.to(A.dtype))``, a copy of the same size that is gone before the
    forward ends, so it raises no moment of the step above the backward's and the estimate needs no card.
    """
    if plan.quantized != "int8" or recipe.quant_backend != "bitsandbytes" or not plan.is_training:
        return 0.0, 0.0
    per = int8_input_bytes(recipe)
    block = arch.largest_linear_weights
    head = arch.lm_head_matmul_params if recipe.quantize_lm_head and not arch.tie_word_embeddings else 0
    return float(head * per), float(block * per)


def dequantized_weight_bytes(plan: Plan, arch: Architecture, recipe: Recipe) -> tuple[float, float]:
    """(end of forward and start of backward, during backward) bytes of dequantized weight copies."""
    if recipe.quant_backend == "auto-gptq":
        return gptq_dequantized_bytes(plan, arch, recipe)
    if plan.quantized == "int8":
        return bnb_int8_dequantize_bytes(plan, arch, recipe)
    return bnb_dequantize_bytes(plan, arch, recipe)


# torchao's NF4 quantization before pytorch/ao PR #196 (merged 2024-05-01, first in torchao 0.2): for a
# 16-bit weight of N elements, quantize_tensor_nearest computes (value - nf4).abs() over all 16 NF4 levels
# at once, two N x 16 16-bit tensors, besides the scaled copy and the int64 indices. pytorch/ao PR #315
# measured 37.87 GB peak while quantizing a 2.10 GB bf16 weight (4096 x 128256): 72 bytes per element,
# of which 2 are the weight itself.
NF4_WHOLE_TENSOR_QUANTIZE_BYTES_PER_ELEMENT = 70.0
# Since PR #196 torchao quantizes 1024**2 elements at a time ("Note: Quantize in Chunks", nf4tensor.py).
NF4_QUANTIZE_CHUNK_ELEMENTS = 1024**2


def quantization_load_bytes(plan: Plan, arch: Architecture, recipe: Recipe) -> float:
    """Temporaries of quantizing the largest NF4 weight while the model loads: its 16-bit copy on the
    GPU plus the quantizer's working set (whole-tensor in torchao 0.1, chunked since). A GPTQ checkpoint
    is stored quantized: nothing is quantized while it loads."""
    if plan.quantized != "nf4" or recipe.quant_backend == "auto-gptq":
        return 0.0
    largest = arch.largest_linear_weights
    if recipe.quantize_lm_head and not arch.tie_word_embeddings:
        largest = max(largest, arch.lm_head_matmul_params)
    if recipe.nf4_whole_tensor:
        working = largest
    elif recipe.quant_backend == "torchao":
        working = min(largest, NF4_QUANTIZE_CHUNK_ELEMENTS)
    else:
        working = 0  # bitsandbytes' quantize_4bit is one CUDA kernel writing the packed output directly
    return float(largest * recipe.compute_bytes + working * NF4_WHOLE_TENSOR_QUANTIZE_BYTES_PER_ELEMENT)
