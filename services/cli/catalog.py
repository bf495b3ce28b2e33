"""`gpuplan models` and `gpuplan gpus`: the bundled reference data."""

from __future__ import annotations

import argparse

from services.catalog.gpus import gpu_specs
from services.catalog.models import catalog_models
from services.cli.common import Subparsers


def register(sub: Subparsers) -> None:
    sub.add_parser("models", help="list the bundled model catalog").set_defaults(handler=cmd_models)
    sub.add_parser("gpus", help="list the GPU specs gpuplan knows").set_defaults(handler=cmd_gpus)


def cmd_models(_args: argparse.Namespace) -> int:
    for model in catalog_models():
        params = f"{model.published_params / 1e9:.2f}B" if model.published_params else "?"
        print(f"{model.hf_id:55} {model.config.get('model_type', '?'):12} {params:>9}")
    return 0


def cmd_gpus(_args: argparse.Namespace) -> int:
    for spec in gpu_specs():
        bf16 = f"{spec.bf16_tflops:g}" if spec.bf16_tflops else "-"
        print(
            f"{spec.name:14} {spec.memory_gib:6.1f} GiB  bf16 {bf16:>6} TFLOPs  {spec.hbm_bandwidth_gb_per_s:6g} GB/s"
        )
    return 0
