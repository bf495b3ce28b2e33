"""The recipe: a plan with every memory-relevant choice made explicit.

Where the plan is silent, :func:`resolve_recipe` takes its framework's default in the release it names
(services.estimator.frameworks, which cites each one) and states what the framework's code does as capabilities
of the recipe, which the memory and throughput models read; an explicit plan field always wins.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.estimator.errors import EstimatorError
from services.estimator.frameworks import FrameworkDefaults, QuantBackend, versioned_defaults
from services.estimator.memo import Canonical, state_without_hash, value_hash_once
from services.estimator.plan import (
    ALL_LINEAR_ROLES,
    Attention,
    CheckpointGranularity,
    Framework,
    Kernels,
    LoraRole,
    Loss,
    OptimizerImpl,
    Padding,
    Plan,
)


@dataclass(frozen=True)
class Recipe:
    """Every memory-relevant choice of a plan, made explicit."""

    framework: Framework
    weight_bytes: int  # bytes per element of the (unquantized) model weights as stored
    compute_bytes: int  # bytes per element of activations in matmuls
    residual_bytes: int  # bytes per element of the residual stream (fp32 under autocast)
    master_weights: bool  # fp32 master copy of trainable params kept beside 16-bit ones
    attention: Attention
    loss: Loss
    logits_fp32: bool
    optimizer_impl: OptimizerImpl
    checkpoint_granularity: CheckpointGranularity
    adapter_bytes: int
    adapter_input_bytes: int  # bytes per element of the adapter's own copy of its input; 0 = shares it
    lora_dropout: float
    lora_targets: tuple[LoraRole, ...]
    lora_rank: int
    quant_backend: QuantBackend
    quantize_lm_head: bool
    model_dropout: bool
    grads_persist: bool
    expands_kv: bool
    python_gelu: bool
    fsdp_accumulates_unsharded: bool
    fsdp_flat_param_grads: bool
    autocast_weight_copies: bool  # 16-bit casts of fp32 weights kept from forward to backward
    compiled: bool  # transformer blocks run through torch.compile (inductor)
    compiled_loss: bool  # the cross-entropy runs through torch.compile as well
    activation_offloading: bool  # saved activations go to host memory in the forward pass
    unties_embeddings: bool  # a tied output head is held as a second matrix
    bnb_dequant_cast: bool  # bitsandbytes dequantizes to another dtype, then casts to the compute dtype
    nf4_whole_tensor: bool  # NF4 quantization at load materialises 16 comparisons per element at once
    fsdp1: bool = True  # FSDP means FSDP1 (record_stream, per-stream pools), not FSDP2
    fsdp_compute_params_16bit: bool = False  # FSDP MixedPrecision gathers 16-bit params over fp32 shards
    kbit_fp32_upcast: bool = False  # the unquantized parameters of a k-bit base are held in fp32
    unquantized_weight_bytes: int = 2  # bytes per element of the parameters a quantized base leaves 16-bit
    padding: Padding = "longest"  # how batches get their length; "longest" makes batch shapes vary
    # The forward runs under torch.autocast: the -mixed precisions, and the Trainer's bf16=True on a 16-bit
    # model (accelerate's prepare_model wraps model.forward in autocast for mixed_precision "bf16").
    autocast: bool = False
    # What the framework's code does, from FrameworkDefaults (its sources are given there).
    fused_qkv: bool = False
    fused_lora_kernels: bool = False
    fused_block_kernels: bool = False  # norms, rotary and activation run as fused kernels
    loss_chunks: int = 0
    loss_keeps_chunks: bool = False
    fsdp_root_gathered: bool = True
    offload_in_flight_tensors: int = 5
    loss_grad_in_place: bool = False  # materialised logits take their gradient in place (Unsloth's Triton CE)
    kernels: Kernels = "none"
    nf4_double_quant: bool = False  # a bitsandbytes NF4 base with nested (8-bit) block constants
    # RMSNorm keeps its input as it comes and an fp32 rstd per token, not an fp32 upcast (Liger, TE, compiled)
    fused_norm_saves: bool = False
    # SwiGLU keeps gate and up only and recomputes act(gate) in backward (Liger's LigerSiLUMulFunction, compiled)
    fused_swiglu_saves: bool = False

    # Hashed by value once: the memos look it up on every estimate (services/estimator/memo.py).
    __hash__ = value_hash_once
    __getstate__ = state_without_hash


# Resolved recipes interned by value (services.estimator.memo.Canonical).
CANONICAL_RECIPES = 256
canonical_recipe: Canonical[Recipe] = Canonical(CANONICAL_RECIPES)


def _bytes_of(precision: str) -> tuple[int, int, int]:
    """(weight bytes, compute bytes, residual-stream bytes) for a plan precision."""
    return {
        "bf16": (2, 2, 2),
        "fp16": (2, 2, 2),
        "fp32": (4, 4, 4),
        # torch.autocast: fp32 weights, bf16/fp16 matmuls, fp32 residual stream and norms.
        "bf16-mixed": (4, 2, 4),
        "fp16-mixed": (4, 2, 4),
    }[precision]


def deepspeed_precision(plan: Plan) -> str:
    """The precision the model runs in: DeepSpeed casts a "-mixed" model to 16-bit.

    With bf16/fp16 enabled the DeepSpeed engine calls module.bfloat16() / module.half() on the model
    (deepspeed/runtime/engine.py, _configure_distributed_model) and keeps the fp32 copy in its ZeRO
    optimizer as master weights, so the weights, activations and residual stream are 16-bit and there
    is no autocast (the Trainer's --bf16 with a DeepSpeed config is this case).
    """
    if plan.sharding in ("zero1", "zero2", "zero3") and plan.precision in ("bf16-mixed", "fp16-mixed"):
        return plan.precision.removesuffix("-mixed")
    return plan.precision


def resolve_recipe(plan: Plan) -> Recipe:
    """Fill every choice the plan leaves open with its framework's default."""
    gptq = _gptq_checkpoint(plan)
    check_gptq_checkpoint(plan, gptq)
    d = versioned_defaults(plan)
    weight_bytes, compute_bytes, residual_bytes = _bytes_of(deepspeed_precision(plan))
    kbit_upcast = kbit_fp32_upcast(plan, d) and not (
        d.recasts_kbit_for_flash and (plan.attention or d.attention) == "flash"
    )
    fsdp_16bit = plan.sharding == "fsdp" and weight_bytes != compute_bytes and d.fsdp_params_16bit
    if fsdp_16bit:
        residual_bytes = compute_bytes  # FSDP MixedPrecision computes with 16-bit parameters
    if kbit_upcast:
        # fp32 embeddings and norm weights make the residual stream fp32, and bitsandbytes' Linear4bit
        # returns its output in its input's dtype (bitsandbytes/nn/modules.py, out.to(inp_dtype)).
        residual_bytes = 4
    # DeepSpeed ZeRO always keeps fp32 master weights for the trainable parameters when the model
    # runs in 16-bit (deepspeed/runtime/bf16_optimizer.py, fp16/fused_optimizer.py).
    master = plan.sharding in ("zero1", "zero2", "zero3") and weight_bytes == 2 and plan.is_training

    lora = plan.lora
    rank = lora.rank if lora is not None else 16
    targets: tuple[LoraRole, ...]
    targets = ALL_LINEAR_ROLES if lora is None or lora.targets == "all-linear" else tuple(lora.targets)
    if plan.method == "full":
        targets, rank = (), 0

    if plan.adapter_dtype is not None:
        adapter_bytes = 4 if plan.adapter_dtype == "fp32" else 2
    elif weight_bytes == 4:
        adapter_bytes = 4
    else:
        adapter_bytes = 4 if d.adapter_fp32 else 2

    # torch.autocast is on for the -mixed precisions, and in the Trainer's usual bf16 recipe.
    autocast = weight_bytes != compute_bytes or (d.autocast and weight_bytes == 2)
    if adapter_bytes == compute_bytes:
        adapter_input = 0
    elif autocast:
        adapter_input = compute_bytes
    else:
        adapter_input = adapter_bytes

    accumulation = plan.gradient_accumulation_steps
    grads_persist = d.grads_persist if accumulation is None else accumulation > 1

    attention = plan.attention or d.attention
    compiled = (d.compile if plan.compile is None else plan.compile) and plan.is_training
    offloading = d.activation_offloading if plan.activation_offloading is None else plan.activation_offloading
    loss = plan.loss or ("fused" if plan.kernels == "liger" else d.loss)
    kernels = resolved_kernels(plan, d, loss)
    recipe = Recipe(
        framework=plan.framework,
        weight_bytes=weight_bytes,
        compute_bytes=compute_bytes,
        residual_bytes=residual_bytes,
        master_weights=master,
        attention=attention,
        loss=loss,
        logits_fp32=d.logits_fp32 if plan.logits_fp32 is None else plan.logits_fp32,
        # DeepSpeed builds its own FusedAdam when its config names the optimizer, as the HF DeepSpeed
        # integration's example configs do (deepspeed/ops/adam/fused_adam.py): no foreach temporaries.
        optimizer_impl=plan.optimizer_impl
        or ("fused" if plan.sharding in ("zero1", "zero2", "zero3") else d.optimizer_impl),
        checkpoint_granularity=plan.checkpoint_granularity or d.checkpoint_granularity,
        adapter_bytes=adapter_bytes,
        adapter_input_bytes=adapter_input,
        autocast=autocast,
        lora_dropout=(lora.dropout if lora is not None and lora.dropout is not None else d.lora_dropout),
        lora_targets=targets,
        lora_rank=rank,
        # A GPTQ checkpoint brings its own layers (auto-gptq's QuantLinear on the block linears, the head
        # left in 16-bit) whatever the framework would quantize with.
        quant_backend="auto-gptq" if gptq else d.quant_backend,
        # AWQ, GPTQ and fp8 checkpoints keep the output head 16-bit (AutoAWQ and vLLM skip lm_head).
        quantize_lm_head=d.quantize_lm_head and not gptq and plan.quantized not in ("fp8", "awq", "gptq"),
        model_dropout=d.model_dropout,
        grads_persist=grads_persist,
        # flash-attention 2 takes grouped K/V as they are; SDPA paths repeat them first.
        expands_kv=d.expands_kv and attention != "flash",
        python_gelu=d.python_gelu,
        fsdp_accumulates_unsharded=d.fsdp_accumulates_unsharded and grads_persist and plan.sharding == "fsdp",
        fsdp_flat_param_grads=d.fsdp_flat_param_grads and plan.sharding == "fsdp" and plan.method != "full",
        # Under autocast every matmul casts its fp32 weight to 16-bit, and autograd keeps that copy for
        # the input gradient (trained weights also sit in autocast's cast cache until the forward ends).
        # FSDP/ZeRO-3 gather 16-bit shards per unit instead; torchtitan uses FSDP2 mixed precision.
        autocast_weight_copies=(
            weight_bytes != compute_bytes
            and plan.sharding not in ("zero3", "fsdp")
            and d.mixed_precision_by_autocast
            and plan.is_training
        ),
        compiled=compiled,
        compiled_loss=compiled and d.compiles_loss,
        activation_offloading=offloading and plan.is_training,
        unties_embeddings=d.unties_embeddings,
        bnb_dequant_cast=d.bnb_dequantizes_to_fp16 and not plan.precision.startswith("fp16"),
        # Current bitsandbytes (a CUDA kernel) and torchao >= 0.2 (pytorch/ao PR #196) quantize in chunks.
        nf4_whole_tensor=plan.nf4_quantization == "whole-tensor"
        or (plan.nf4_quantization is None and d.nf4_whole_tensor and plan.quantized == "nf4"),
        fsdp1=d.fsdp1,
        fsdp_compute_params_16bit=fsdp_16bit,
        kbit_fp32_upcast=kbit_upcast,
        unquantized_weight_bytes=4 if kbit_upcast else compute_bytes,
        padding=plan.padding or d.padding,
        fused_qkv=d.fused_qkv,
        fused_lora_kernels=d.fused_lora_kernels,
        fused_block_kernels=compiled or kernels in ("unsloth", "liger"),
        loss_chunks=d.loss_chunks,
        loss_keeps_chunks=d.loss_keeps_chunks,
        fsdp_root_gathered=d.fsdp_root_gathered,
        offload_in_flight_tensors=d.offload_in_flight_tensors,
        loss_grad_in_place=d.loss_grad_in_place,
        kernels=kernels,
        nf4_double_quant=d.bnb_double_quant if plan.double_quant is None else plan.double_quant,
        fused_norm_saves=compiled or kernels in ("liger", "transformer-engine"),
        fused_swiglu_saves=compiled or kernels == "liger",
    )
    return canonical_recipe(recipe)


def resolved_kernels(plan: Plan, d: FrameworkDefaults, loss: Loss) -> Kernels:
    """The fused kernels the run patches in: the plan's, else Unsloth's own under Unsloth, else Liger where the
    framework's fused loss comes from it (the Trainer's use_liger_kernel), else none.

    What each saves for backward (memory.activations): Liger's LigerRMSNormFunction keeps X as given, W and an
    fp32 RSTD per row (liger_kernel/ops/rms_norm.py, ``ctx.save_for_backward(X, W, RSTD)``) and its
    LigerSiLUMulFunction keeps a and b only, recomputing silu(a) in backward (ops/swiglu.py); Transformer
    Engine's fused LayerNormLinear keeps its input and fp32 rsigma beside the normalised ln_out that the linear
    needs anyway (transformer_engine/pytorch/module/layernorm_linear.py), and its MLP saves what PyTorch's does.
    """
    if plan.kernels is not None:
        return plan.kernels
    if d.fused_lora_kernels:
        return "unsloth"
    if d.liger_kernels_with_fused_loss and loss == "fused":
        return "liger"
    return "none"


def kbit_fp32_upcast(plan: Plan, d: FrameworkDefaults) -> bool:
    """Whether prepare_model_for_kbit_training upcasts the unquantized parameters of the plan's base.

    Only for a bitsandbytes base trained on unsharded GPUs: TRL skips the call for sharded QLoRA (FSDP
    or ZeRO-3 hold the 4-bit weights on the CPU or the meta device at that point; trl/trainer/
    sft_trainer.py, is_sharded_qlora), and PEFT skips the cast for GPTQ models.
    """
    return (
        d.prepares_kbit
        and d.quant_backend == "bitsandbytes"
        and plan.quantized is not None
        and plan.is_training
        and plan.sharding not in ("fsdp", "zero3")
        and not _gptq_checkpoint(plan)
    )


def check_gptq_checkpoint(plan: Plan, gptq: bool) -> None:
    """A GPTQ checkpoint loads 4-bit whatever the plan says, so a training plan over one must be QLoRA
    over 4 bits: its packed integer weights take no gradient (transformers refuses to fine-tune a purely
    quantized model), and a 16-bit or int8 base does not describe it."""
    if not plan.is_training or not gptq:
        return
    config = plan.model.config or {}
    bits = config["quantization_config"].get("bits", 4)
    if bits != 4:
        raise EstimatorError(
            "model.config.quantization_config.bits", f"only 4-bit GPTQ checkpoints are modelled, got {bits!r}"
        )
    if plan.method != "qlora":
        raise EstimatorError(
            "method",
            f"the checkpoint is GPTQ 4-bit (quantization_config.quant_method 'gptq'), so {plan.method!r} "
            "does not apply: adapters train over its 4-bit weights; use method 'qlora' (quantization 'nf4' "
            "stands for a 4-bit base), or a 16-bit checkpoint for 'full' or 'lora'",
        )
    if plan.quantized != "nf4":
        raise EstimatorError(
            "quantization", "the checkpoint is GPTQ 4-bit: use quantization 'nf4' (a 4-bit base) or leave it unset"
        )


def _gptq_checkpoint(plan: Plan) -> bool:
    """A GPTQ checkpoint (config.json quantization_config.quant_method 'gptq'): PEFT skips the fp32 cast
    for it (peft/utils/other.py, ``if not is_gptq_quantized``)."""
    config = plan.model.config or {}
    quantization = config.get("quantization_config")
    return isinstance(quantization, dict) and quantization.get("quant_method") == "gptq"
