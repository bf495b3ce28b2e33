"""Framework defaults: what each training framework does where the plan is silent, per release.

Each default names the framework code or documentation it comes from. services.estimator.recipe resolves a
plan's :class:`~services.estimator.recipe.Recipe` from them, where an explicit plan field always wins; the rest of
the estimator reads the recipe, and only the estimate's assumptions quote ``framework_note``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from packaging.version import Version

from services.estimator.plan import Attention, CheckpointGranularity, Framework, Loss, OptimizerImpl, Padding, Plan
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
    # Whether the framework runs DeepSpeed ZeRO (the Trainer and axolotl through accelerate's DeepSpeed plugin). The
    # others shard with FSDP only: torchtune's distributed recipes call training.shard_model (fully_shard), LitGPT's
    # finetune scripts take Fabric's FSDPStrategy for several devices (litgpt/finetune/lora.py), and torchtitan
    # composes FSDP2 with tensor and pipeline parallelism; a ZeRO setup of theirs is one the user cannot run.
    runs_deepspeed: bool = True
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
        runs_deepspeed=False,
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
        runs_deepspeed=False,
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
        runs_deepspeed=False,
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


def framework_note(framework: Framework) -> str:
    return _DEFAULTS[framework].note
