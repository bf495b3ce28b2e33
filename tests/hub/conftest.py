from __future__ import annotations

from collections.abc import Iterator

import pytest
from huggingface_hub import constants

from tests.hub.fake_hub import FakeHub

# Qwen-1.8B's config (first-generation Qwen), served under a fine-tune's id outside the bundled catalog.
QWEN_1_8B = {
    "model_type": "qwen",
    "architectures": ["QWenLMHeadModel"],
    "hidden_size": 2048,
    "intermediate_size": 11008,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "kv_channels": 128,
    "vocab_size": 151936,
    "max_position_embeddings": 8192,
    "no_bias": True,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
INDEX = {
    "metadata": {"total_size": 3_673_657_344},
    "weight_map": {"transformer.wte.weight": "model-00001-of-00002.safetensors"},
}


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeHub]:
    """The fake Hub on loopback as HF_ENDPOINT, with no token set; huggingface_hub's own cache (where
    get_safetensors_metadata keeps a shard index) in a temporary folder."""
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path_factory.mktemp("hf-cache")))
    fake = FakeHub()
    monkeypatch.setenv("HF_ENDPOINT", fake.url)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    yield fake
    fake.close()
