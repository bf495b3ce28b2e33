"""Exact element counts per dtype from the safetensors headers the fake Hub serves (range requests)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from services.hub.client import DTYPE_BITS, fetch_model
from services.hub.service import DiskCache, checkpoint_note, resolve_model
from tests.hub.conftest import QWEN_1_8B
from tests.hub.fake_hub import FakeHub

Tensors = dict[str, tuple[str, list[int]]]  # name: (safetensors dtype, shape)


def safetensors_file(tensors: Tensors) -> bytes:
    """A safetensors file as the format defines it (github.com/huggingface/safetensors, "Format"): an 8-byte
    little-endian header length, the JSON header (space-padded to 8 bytes), then the zeroed tensor data."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        elements = 1
        for dim in shape:
            elements *= dim
        size = elements * DTYPE_BITS[dtype] // 8
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + b"\0" * offset


# gpt-oss's layout: MoE weights as MXFP4 (U8 blocks of 16 bytes = 32 FP4 values, one U8 E8M0 scale per block),
# attention, router and embeddings in BF16 (openai/gpt-oss-20b's model.safetensors.index.json).
GPT_OSS_LIKE_1: Tensors = {
    "model.layers.0.mlp.experts.gate_up_proj_blocks": ("U8", [4, 128, 2, 16]),
    "model.layers.0.mlp.experts.gate_up_proj_scales": ("U8", [4, 128, 2]),
    "model.layers.0.self_attn.q_proj.weight": ("BF16", [64, 64]),
}
GPT_OSS_LIKE_2: Tensors = {
    "model.embed_tokens.weight": ("BF16", [1000, 64]),
    "model.layers.0.mlp.router.weight": ("BF16", [4, 64]),
}
# DeepSeek-V3's layout: F8_E4M3 linear weights with an F32 weight_scale_inv per 128x128 block, BF16 norms.
FP8_LIKE: Tensors = {
    "model.layers.0.mlp.down_proj.weight": ("F8_E4M3", [256, 128]),
    "model.layers.0.mlp.down_proj.weight_scale_inv": ("F32", [2, 1]),
    "model.layers.0.input_layernorm.weight": ("BF16", [128]),
}


def test_a_sharded_mxfp4_and_bf16_checkpoint_is_counted_per_dtype(hub: FakeHub) -> None:
    shards = {
        "model-00001-of-00002.safetensors": safetensors_file(GPT_OSS_LIKE_1),
        "model-00002-of-00002.safetensors": safetensors_file(GPT_OSS_LIKE_2),
    }
    total = sum(len(f) for f in shards.values())
    index = {
        "metadata": {"total_size": total},
        "weight_map": {
            name: file
            for file, tensors in zip(shards, (GPT_OSS_LIKE_1, GPT_OSS_LIKE_2), strict=True)
            for name in tensors
        },
    }
    repo = hub.add_model("acme/oss-like", QWEN_1_8B, index=index)
    repo.files.update(shards)
    repo.lfs = frozenset(shards)
    checkpoint = fetch_model("acme/oss-like").checkpoint
    assert checkpoint is not None
    u8 = 4 * 128 * 2 * 16 + 4 * 128 * 2
    bf16 = 64 * 64 + 1000 * 64 + 4 * 64
    assert checkpoint.parameters_by_dtype == {"BF16": bf16, "U8": u8}
    assert checkpoint.tensor_bytes == u8 + 2 * bf16
    assert checkpoint.dtype == "mxfp4 + bf16" and checkpoint.source == "safetensors headers"
    assert checkpoint.stored_bytes == total
    # Only the headers were read: ranged GETs of each shard, never a whole one.
    shard_gets = [(m, p) for m, p, _ in hub.requests if p.endswith(".safetensors") and m.startswith("GET")]
    assert len(shard_gets) == 2 and all(m == "GET 0-100000" for m, _ in shard_gets)


def test_a_single_fp8_file_with_a_long_header_takes_a_second_range(hub: FakeHub) -> None:
    tensors = dict(FP8_LIKE)
    # Past the first 100,000 bytes the header needs its second range request (bytes=8-N).
    tensors.update({f"model.layers.{i}.post_attention_layernorm.weight": ("BF16", [128]) for i in range(1500)})
    repo = hub.add_model("acme/fp8-like", QWEN_1_8B)
    repo.files["model.safetensors"] = safetensors_file(tensors)
    repo.lfs = frozenset({"model.safetensors"})
    checkpoint = fetch_model("acme/fp8-like").checkpoint
    assert checkpoint is not None
    assert checkpoint.parameters_by_dtype == {"BF16": 128 * 1501, "F32": 2, "F8_E4M3": 256 * 128}
    assert checkpoint.dtype == "fp8 + bf16 + fp32"
    assert checkpoint.stored_bytes == len(repo.files["model.safetensors"])
    assert any(m.startswith("GET 8-") for m, _, _ in hub.requests)


def test_unreadable_headers_fall_back_to_the_weight_names(hub: FakeHub) -> None:
    repo = hub.add_model("acme/zeros", QWEN_1_8B)
    repo.files["model.safetensors"] = b"\0" * 4096  # a header length of 0: not JSON
    checkpoint = fetch_model("acme/zeros").checkpoint
    assert checkpoint is not None
    assert (checkpoint.stored_bytes, checkpoint.dtype, checkpoint.source) == (4096, "bf16", "model.safetensors")
    assert checkpoint.parameters_by_dtype is None


def test_the_counts_are_cached_and_noted(hub: FakeHub, tmp_path: Path) -> None:
    repo = hub.add_model("acme/fp8-cached", QWEN_1_8B)
    repo.files["model.safetensors"] = safetensors_file(FP8_LIKE)
    cache = DiskCache(tmp_path / "cache")
    resolve_model("acme/fp8-cached", cache)
    again = resolve_model("acme/fp8-cached", cache)
    assert again.origin == "cache" and again.checkpoint is not None
    assert again.checkpoint.parameters_by_dtype == {"BF16": 128, "F32": 2, "F8_E4M3": 32768}
    (note,) = checkpoint_note(again)
    assert "as fp8 + bf16 + fp32" in note and "[32,768 F8_E4M3 (99.6%), 128 BF16 (0.4%), 2 F32 (0.0%)]" in note
