"""Framework defaults: what each training framework does where the plan is silent.

A :class:`Recipe` is the plan with every memory-relevant choice made explicit. Each default names the
framework code or documentation it comes from; an explicit plan field always wins.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from packaging.version import Version

from services.estimator.errors import EstimatorError
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
from services.estimator.versions import parse_framework_version

# auto-gptq: a GPTQ checkpoint (config.json quantization_config.quant_method "gptq"), whatever the framework.
QuantBackend = Literal["bitsandbytes", "torchao", "auto-gptq"]


@dataclass(frozen=True)
class FrameworkDefaults:
    attention: Attention
    loss: Loss
    logits_fp32: bool
    optimizer_impl: OptimizerImpl
    checkpoint_granularity: CheckpointGranularity
    adapter_fp32: bool  # LoRA weights kept in fp32 over a 16-bit base
    lora_dropout: float
    quant_backend: QuantBackend
    quantize_lm_head: bool
    model_dropout: bool  # honours the config's dropout probabilities in training
    grads_persist: bool  # gradient accumulation by default, so gradients live through the forward
    expands_kv: bool  # GQA K/V are repeated to all heads before attention (saved at full width)
    python_gelu: bool  # HF's gelu_new is a chain of Python ops, each saving its input
    note: str
    # Gradient accumulation under FSDP skips the reduce-scatter with no_sync(), which keeps the
    # *unsharded* gradients (accelerate's default sync_each_batch=False; Lightning Fabric's
    # no_backward_sync). torchtune and torchtitan accumulate sharded gradients.
    fsdp_accumulates_unsharded: bool = True
    # FSDP1 with use_orig_params=True (Lightning Fabric's FSDPStrategy) flattens frozen and trained
    # weights into one FlatParameter, and the gradient covers all of it, frozen parts included.
    fsdp_flat_param_grads: bool = False
    # The forward runs under torch.autocast (Trainer with bf16=True, the usual LoRA/QLoRA recipe), so an
    # fp32 adapter receives a 16-bit copy of its input; without autocast PEFT casts the input to fp32.
    autocast: bool = False
    # Whether the framework's compile switch also compiles the loss. torchtune's recipes call
    # training.compile_loss (torchtune/training/_compile.py); the Trainer's torch_compile wraps the model,
    # whose forward computes the loss. torchtitan's train.py of late 2024 compiled the blocks only
    # (loss_fn is a plain function called on the model output).
    compiles_loss: bool = True
    # Off unless asked for in every framework we model: torchtune's recipe configs ship compile: False
    # and enable_activation_offloading: False; TrainingArguments.torch_compile defaults to False.
    compile: bool = False
    activation_offloading: bool = False
    # LitGPT's GPT keeps lm_head and wte as two parameters (litgpt/model.py has no weight tying) and its
    # HF converter copies the embedding into lm_head.weight for tied models
    # (litgpt/scripts/convert_hf_checkpoint.py, copy_weights_hf_llama): a tied model is held untied.
    unties_embeddings: bool = False
    # Whether bitsandbytes' dequantize_4bit returns fp16 whatever the compute dtype. Lightning's
    # BitsandbytesPrecision casts every weight to fp16 before quantize_4bit (lightning/fabric/plugins/
    # precision/bitsandbytes.py, _Linear4bit.quantize), so quant_state.dtype is fp16; transformers
    # quantizes the weight in its load dtype, the compute dtype of the usual recipe.
    bnb_dequantizes_to_fp16: bool = False
    # PEFT's prepare_model_for_kbit_training runs before a bitsandbytes 4/8-bit base is trained: the
    # PEFT QLoRA guide calls it, TRL's SFTTrainer calls it for a non-sharded k-bit model, axolotl for
    # load_in_4bit/8bit. It casts every remaining 16-bit parameter (embeddings, norms, the head) to fp32
    # (peft/utils/other.py, "cast all non INT8 parameters to fp32").
    # Not modelled: TRL's SFTTrainer no longer calls it (trl 1.16 sft_trainer.py has no call; see also trl#4577)
    # and casts the adapters of a quantized model to bf16; the public Trainer cases (ms-swift, HF blog) fit
    # the cast, so the default keeps it until a plan can say which script ran.
    prepares_kbit: bool = False
    # axolotl casts norms and embeddings back to the 16-bit dtype after prepare_model_for_kbit_training
    # when flash attention is on, which needs 16-bit inputs (axolotl/utils/models.py, ModelLoader.
    # convert_embedding_modules_dtype, before_kbit_train_or_finetune=False).
    recasts_kbit_for_flash: bool = False
    # FSDP1 (FullyShardedDataParallel with FlatParameters and record_stream) or FSDP2 (fully_shard).
    # accelerate's FullyShardedDataParallelPlugin and Lightning Fabric's FSDPStrategy wrap with FSDP1;
    # torchtune (since v0.2) and torchtitan use fully_shard.
    fsdp1: bool = True
    # FSDP's MixedPrecision param_dtype for a "-mixed" run: accelerate's FullyShardedDataParallelPlugin
    # sets param_dtype = reduce_dtype = buffer_dtype = bf16/fp16 (set_mixed_precision), so embeddings
    # and norms compute in 16-bit and the residual stream is 16-bit, not autocast's fp32. Lightning's
    # FSDPPrecision keeps param_dtype fp32 for "bf16-mixed" and runs autocast instead.
    fsdp_params_16bit: bool = True
    # How the framework's data pipeline shapes a batch when the plan does not say (Plan.padding):
    # - hf-trainer / unsloth: the Trainer's default collator, DataCollatorWithPadding (padding=True, "pad to
    #   the longest sequence in the batch", transformers data/data_collator.py); TRL's SFTConfig has
    #   packing=False by default and its collator pads to the longest sample too. ms-swift (1.x-3.x) runs
    #   the Trainer on unpacked data by default (its --packing is off unless asked for).
    # - torchtune: datasets default to packed=False and the recipes' padded_collate_sft pads each batch to
    #   its longest sample (torchtune/data/_collate.py).
    # - litgpt: the SFT data modules pad each batch to its longest sample (litgpt/data/base.py,
    #   get_sft_collate_fn).
    # - torchtitan: pre-training on a token stream cut into rows of exactly seq_len (HuggingFaceDataset).
    # - axolotl: the project's axolotl defaults follow its example configs, which set sample_packing: true.
    # - pytorch: a hand-written loop's batching is its author's; we assume fixed shapes, the smaller
    #   reserve, and leave varying shapes to an explicit padding: longest.
    padding: Padding = "longest"
    # LitGPT's CausalSelfAttention projects q, k and v with one linear (litgpt/model.py, ``qkv``) and LoRA
    # with one LoRAQKVLinear (litgpt/lora.py): SDPA gets views of the fused output.
    fused_qkv: bool = False
    # Unsloth's LoRA autograd functions fuse the adapters into the base matmuls (unsloth/kernels/fast_lora.py:
    # LoRA_QKV, LoRA_W, LoRA_MLP) and its Triton kernels run the norms, rotary and activation.
    fused_lora_kernels: bool = False
    # The Trainer's use_liger_kernel (the route to a fused loss there) patches RMSNorm, RoPE and SwiGLU with
    # Liger's kernels too (liger_kernel/transformers/monkey_patch.py, apply_liger_kernel_to_llama).
    liger_kernels_with_fused_loss: bool = False
    # torchtune's chunked cross-entropy splits the logits into 8 chunks (CEWithChunkedOutputLoss); 0 means
    # 128-position chunks, as LitGPT's head emits them (lm_head_chunk_size=128).
    loss_chunks: int = 0
    # LitGPT keeps the logits chunks referenced through backward (chunked_cross_entropy over the list).
    loss_keeps_chunks: bool = False
    # FSDP's root unit (embeddings, final norm, head) stays gathered in HF and torchtune wrapping; torchtitan
    # shards the embedding and the head as units of their own (torchtitan parallelize_llama, fully_shard).
    fsdp_root_gathered: bool = True
    # Mixed precision by torch.autocast (cast per matmul, casts kept for backward); torchtitan uses FSDP2's
    # MixedPrecisionPolicy instead.
    mixed_precision_by_autocast: bool = True
    # Offloaded activations still on the GPU at the end of the forward: torchtune's OffloadActivations keeps up
    # to max_fwd_stash_size (default 5) alive until their device-to-host copy finishes
    # (torchtune/training/_activation_offloading.py); Unsloth's offloaded checkpointing copies each block's
    # input non-blocking as the block runs (unsloth_zoo gradient_checkpointing.py): one in flight.
    offload_in_flight_tensors: int = 5
    # Unsloth's Triton cross-entropy (unsloth/kernels/cross_entropy_loss.py, Fast_CrossEntropyLoss) takes the
    # 16-bit logits as they are, keeps them with an fp32 log-sum-exp per row and writes the logits' gradient
    # into them in backward: no fp32 copy and no second tokens x vocab tensor. Used whenever Unsloth
    # materialises the logits (loss "standard": UNSLOTH_RETURN_LOGITS, or releases before its fused loss).
    loss_grad_in_place: bool = False
    # torchtune 0.1.x pinned torchao==0.1 (pyproject.toml @v0.1.1), whose NF4 quantization is whole-tensor.
    nf4_whole_tensor: bool = False
    # bitsandbytes' nested quantization of the NF4 absmax (QLoRA's double quantization): off in transformers'
    # BitsAndBytesConfig (bnb_4bit_use_double_quant=False) and LitGPT's bnb.nf4; Unsloth loads every 4-bit
    # model with bnb_4bit_use_double_quant = True (unsloth/models/llama.py, since its first release).
    # torchao's NF4Tensor always quantizes the scales (quantization.NF4_DOUBLE_QUANT_BYTES).
    bnb_double_quant: bool = False


# Sources, per framework:
# - hf-trainer: transformers Trainer defaults (optim "adamw_torch" = torch AdamW, foreach on CUDA;
#   gradient_accumulation_steps 1; attn_implementation "sdpa"; ForCausalLMLoss upcasts logits to
#   fp32); PEFT LoraConfig(lora_dropout=0.0) and autocast_adapter_dtype=True (adapters in fp32);
#   bitsandbytes Linear4bit saves the layer input for backward; transformers keeps lm_head unquantized.
# - torchtune: recipes/configs (fused AdamW, gradient_accumulation_steps 1, CEWithChunkedOutputLoss
#   with 8 chunks, the decoder upcasts its output to fp32, lora_dropout 0.0, NF4 from torchao whose
#   linear_nf4 saves no input, k/v expanded before SDPA).
# - litgpt: finetune scripts (lm_head_chunk_size=128 with chunked_cross_entropy in the model dtype,
#   torch AdamW, global_batch_size > micro_batch_size so gradients accumulate, lora_dropout 0.05,
#   Lightning's BitsandbytesPrecision converts every Linear including the head, no model dropout).
# - torchtitan: FSDP2 pre-training loop, per-op selective activation checkpointing, fused AdamW,
#   cross_entropy on logits upcast to fp32.
# - axolotl: Hugging Face Trainer underneath (same as hf-trainer), sample packing to seq_len.
# - unsloth: its fused linear cross-entropy (logits never whole), bf16 adapters, its LoRA kernels
#   (memory.unsloth_fused_block) and, where a plan sets activation_offloading, its offloaded checkpointing.
# - pytorch: a plain loop over an HF model (HF loss with fp32 upcast, torch AdamW foreach).
_HF = FrameworkDefaults(
    attention="sdpa",
    loss="standard",
    logits_fp32=True,
    optimizer_impl="foreach",
    checkpoint_granularity="block",
    adapter_fp32=True,
    lora_dropout=0.0,
    quant_backend="bitsandbytes",
    quantize_lm_head=False,
    model_dropout=True,
    grads_persist=False,
    expands_kv=True,
    python_gelu=True,
    note="Hugging Face Trainer + PEFT defaults",
    autocast=True,
    prepares_kbit=True,
    liger_kernels_with_fused_loss=True,
)
_DEFAULTS: dict[Framework, FrameworkDefaults] = {
    "hf-trainer": _HF,
    "pytorch": replace(
        _HF,
        note="a plain PyTorch loop over a transformers model",
        autocast=False,
        padding="max-length",
        liger_kernels_with_fused_loss=False,
    ),
    "axolotl": replace(
        _HF,
        attention="flash",
        grads_persist=True,
        expands_kv=False,
        recasts_kbit_for_flash=True,
        # axolotl's FSDP configs use fsdp_version: 2 (fully_shard). An FSDP2 module has no no_sync()
        # method, and accelerate's Accelerator.no_sync falls back to a null context when the model lacks
        # one (getattr(model, "no_sync", nullcontext)), so every micro-batch reduce-scatters its gradients
        # and only the sharded ones accumulate.
        fsdp_accumulates_unsharded=False,
        padding="packed",
        note="axolotl (Trainer-based; flash attention, gradient accumulation, FSDP2)",
        liger_kernels_with_fused_loss=False,
    ),
    "torchtune": FrameworkDefaults(
        attention="sdpa",
        loss="chunked",
        logits_fp32=True,
        optimizer_impl="fused",
        checkpoint_granularity="block",
        adapter_fp32=False,
        lora_dropout=0.0,
        quant_backend="torchao",
        quantize_lm_head=False,
        model_dropout=False,
        grads_persist=False,
        expands_kv=True,
        python_gelu=False,
        note="torchtune recipe defaults",
        fsdp_accumulates_unsharded=False,
        fsdp1=False,
        loss_chunks=8,
    ),
    "litgpt": FrameworkDefaults(
        attention="sdpa",
        loss="chunked",
        logits_fp32=False,
        optimizer_impl="foreach",
        checkpoint_granularity="block",
        adapter_fp32=False,
        lora_dropout=0.05,
        quant_backend="bitsandbytes",
        quantize_lm_head=True,
        model_dropout=False,
        grads_persist=True,
        expands_kv=True,
        python_gelu=False,
        note="LitGPT finetune defaults",
        fsdp_flat_param_grads=True,
        fsdp_params_16bit=False,
        compiles_loss=False,  # LitGPT computes chunked_cross_entropy outside the model
        unties_embeddings=True,
        bnb_dequantizes_to_fp16=True,
        fused_qkv=True,
        loss_keeps_chunks=True,
    ),
    "torchtitan": FrameworkDefaults(
        attention="sdpa",
        loss="standard",
        logits_fp32=True,
        optimizer_impl="fused",
        checkpoint_granularity="selective",
        adapter_fp32=False,
        lora_dropout=0.0,
        quant_backend="torchao",
        quantize_lm_head=False,
        model_dropout=False,
        grads_persist=False,
        expands_kv=True,
        python_gelu=False,
        note="torchtitan defaults",
        fsdp_accumulates_unsharded=False,
        # torchtitan compiles the loss with the model since #1033 (2025-04-02, first in v0.1.0); v0.2.0's
        # compile.components defaults to ["model", "loss"] (torchtitan/components/loss.py). Earlier trees
        # (version.txt 0.0.2): versioned_defaults.
        compiles_loss=True,
        fsdp1=False,
        padding="packed",
        fsdp_root_gathered=False,
        mixed_precision_by_autocast=False,
    ),
    "unsloth": FrameworkDefaults(
        attention="flash",
        loss="fused",
        logits_fp32=False,
        optimizer_impl="foreach",
        checkpoint_granularity="block",
        adapter_fp32=False,
        lora_dropout=0.0,
        quant_backend="bitsandbytes",
        quantize_lm_head=False,
        model_dropout=False,
        grads_persist=True,
        expands_kv=False,
        python_gelu=False,
        note="Unsloth defaults",
        fused_lora_kernels=True,
        loss_grad_in_place=True,
        bnb_double_quant=True,
        offload_in_flight_tensors=1,
    ),
}


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


# Unsloth 2025.8.5 to 2025.10.4 kept the whole logits for micro-batches of at most this many tokens ("< 1024
# Normal Unsloth uses less VRAM!", unsloth/models/llama.py: ``if bsz*q_len <= 1024: RETURN_LOGITS = True``,
# removed by commit 0ede099ef0, 2025-10-16).
UNSLOTH_WHOLE_LOGITS_MAX_TOKENS = 1024


def versioned_defaults(plan: Plan) -> FrameworkDefaults:
    """The framework's defaults in the release the plan names (``framework_version``; None: the newest).

    What changed, with its source:
    - unsloth before 2025.8.5: the fused cross-entropy needed the optional cut_cross_entropy package
      (``HAS_CUT_CROSS_ENTROPY``, unsloth_zoo/loss_utils.py since 2024.11; Unsloth's pyproject never required
      it) and before 2024.11 did not exist, so a plain install materialises the whole 16-bit logits and runs
      Unsloth's Triton cross-entropy on them. 2025.8.5 (commit 806bee2433, unsloth_zoo>=2025.8.4) calls
      unsloth_zoo's chunked ``unsloth_fused_ce_loss`` instead, but until 2025.10.4 only above
      UNSLOTH_WHOLE_LOGITS_MAX_TOKENS tokens per micro-batch.
    - torchtune before 0.3.0: torch.nn.CrossEntropyLoss on the whole fp32 logits (the configs' ``loss``
      @v0.2.1; CEWithChunkedOutputLoss came with #1390, 2024-08-28) and FSDP1 (the distributed recipes
      import FullyShardedDataParallel @v0.2.1; training.shard_model with fully_shard @v0.3.0); before 0.2.0,
      torchao 0.1's whole-tensor NF4 quantization.
    - torchtitan before 0.1.0: the loss was not compiled with the model (train.py's
      ``# if job_config.training.compile: loss_fn = torch.compile(loss_fn)`` left commented out, #859).
    """
    d = _DEFAULTS[plan.framework]
    if plan.framework_version is None:
        return d
    version = parse_framework_version(plan.framework, plan.framework_version)
    if plan.framework == "unsloth":
        whole_logits = version < Version("2025.8.5") or (
            version < Version("2025.10.5") and plan.tokens_per_micro_batch <= UNSLOTH_WHOLE_LOGITS_MAX_TOKENS
        )
        if whole_logits:
            return replace(d, loss="standard", logits_fp32=False)
    if plan.framework == "torchtune" and version < Version("0.3.0"):
        return replace(d, loss="standard", fsdp1=True, nf4_whole_tensor=version < Version("0.2.0"))
    if plan.framework == "torchtitan" and version < Version("0.1.0"):
        return replace(d, compiles_loss=False)
    return d


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


def framework_note(framework: Framework) -> str:
    return _DEFAULTS[framework].note
