"""The exported arguments against the real libraries, where the trace extra installed them (skipped otherwise)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.export.helpers import export, llama_plan

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _restore_environment() -> Iterator[None]:
    # TrainingArguments exports FSDP settings to os.environ (FSDP_CPU_RAM_EFFICIENT_LOADING), which would
    # change how later tests load models.
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.mark.parametrize(("method", "fields"), [("full", {}), ("lora", {"gpus": 4, "sharding": "fsdp"}), ("qlora", {})])
def test_trainer_peft_and_bitsandbytes_accept_the_arguments(
    method: str, fields: dict[str, Any], tmp_path: Path
) -> None:
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    bundle = export(llama_plan("hf-trainer", method, **fields), "hf-trainer", checkpoint_interval_s=900, step_seconds=3)
    sections = json.loads(bundle.files["hf_args.json"])
    # This machine has no GPU: bf16 needs use_cpu to pass the Trainer's device check.
    args = {**sections["training_args"], "output_dir": str(tmp_path), "use_cpu": True}
    transformers.TrainingArguments(**args)
    if sections["lora_config"] is not None:
        peft.LoraConfig(**sections["lora_config"])
    if sections["quantization_config"] is not None:
        transformers.BitsAndBytesConfig(**sections["quantization_config"])


@pytest.mark.parametrize(("gpus", "sharding"), [(1, "none"), (4, "none"), (4, "fsdp"), (4, "zero3")])
def test_accelerate_reads_its_config(gpus: int, sharding: str, tmp_path: Path) -> None:
    config_args = pytest.importorskip("accelerate.commands.config.config_args")
    bundle = export(llama_plan("accelerate", "lora", gpus=gpus, sharding=sharding), "accelerate")
    path = tmp_path / "accelerate.yaml"
    path.write_text(bundle.files["accelerate.yaml"])
    config = config_args.ClusterConfig.from_yaml_file(str(path))
    assert config.num_processes == gpus
