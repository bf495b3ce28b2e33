"""What the Hub client returns and reads its settings from, without huggingface_hub: the service's caches and the
CLI import these, and only a fetch imports the client (huggingface_hub costs ~0.4 s of a command's start)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from services.hub.errors import HubModelNotFound
from services.hub.ids import is_hub_id

DEFAULT_ENDPOINT = "https://huggingface.co"
FIELD = "model.name"


@dataclass(frozen=True)
class Checkpoint:
    """What the Hub stores for the weights: bytes and the storage format, exact from the safetensors headers
    where they could be read (``parameters_by_dtype``), else read from the weight names."""

    stored_bytes: int | None
    dtype: str | None  # "bf16", "fp8 + bf16", "mxfp4 + bf16", "bitsandbytes", "int4 (GPTQ/AWQ)", ...
    source: str  # which file told
    # Elements per safetensors dtype ("BF16", "F8_E4M3", "U8", ...), summed over every tensor of every shard.
    parameters_by_dtype: dict[str, int] | None = None
    tensor_bytes: int | None = None  # the tensors' exact size from their dtypes and shapes

    def as_dict(self) -> dict[str, Any]:
        return {
            "stored_bytes": self.stored_bytes,
            "dtype": self.dtype,
            "source": self.source,
            "parameters_by_dtype": self.parameters_by_dtype,
            "tensor_bytes": self.tensor_bytes,
        }


@dataclass(frozen=True)
class HubModel:
    repo_id: str
    revision: str
    config: dict[str, Any]
    checkpoint: Checkpoint | None


@dataclass(frozen=True)
class HubSettings:
    timeout_s: float = 10.0
    max_file_bytes: int = 32 * 2**20  # DeepSeek-V3's index of 91,991 tensors is about 9 MB

    @classmethod
    def from_environment(cls) -> HubSettings:
        """GPUPLAN_HUB_TIMEOUT_S and GPUPLAN_HUB_MAX_FILE_BYTES (services/core/settings.py)."""
        from services.core.settings import Settings

        settings = Settings()
        return cls(timeout_s=settings.hub_timeout_s, max_file_bytes=settings.hub_max_file_bytes)

    @property
    def endpoint(self) -> str:
        return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")

    @property
    def token(self) -> str | None:
        return os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN") or None


def check_repo_id(name: str) -> str:
    """The name as a Hub repo id, or a 422 naming model.name."""
    repo_id = name.strip()
    if not is_hub_id(repo_id):
        raise HubModelNotFound(f"{name!r:.120} is not a Hugging Face model id (owner/name)", field=FIELD)
    return repo_id
