"""`gpuplan models` and `gpuplan gpus`: the bundled reference data."""

from __future__ import annotations

import argparse

from services.catalog.gpus import gpu_specs
from services.catalog.models import CatalogModel, catalog_models
from services.cli.common import Subparsers
from services.cli.render import table
from services.estimator.architecture import architecture_from_config, parameter_counts
from services.estimator.errors import EstimatorError


def register(sub: Subparsers) -> None:
    sub.add_parser("models", help="list the bundled model catalog").set_defaults(handler=cmd_models)
    sub.add_parser("gpus", help="list the GPU specs gpuplan knows").set_defaults(handler=cmd_gpus)


def _params(model: CatalogModel) -> tuple[str, str]:
    """The parameter count shown for a model and where it comes from: the published total, else the
    count the estimator derives from the model's config.json (the same count its estimates use)."""
    if model.published_params:
        return f"{model.published_params / 1e9:.2f}B", "published"
    try:
        counted = parameter_counts(architecture_from_config(model.config)).total
    except EstimatorError:
        return "-", "-"
    return f"{counted / 1e9:.2f}B", "config.json"


def cmd_models(_args: argparse.Namespace) -> int:
    rows = []
    for model in catalog_models():
        params, source = _params(model)
        rows.append([model.hf_id, str(model.config.get("model_type", "-")), params, source])
    print(table(["model", "type", "params", "params from"], rows, right={2}))
    return 0


def cmd_gpus(_args: argparse.Namespace) -> int:
    rows = [
        [
            spec.name,
            f"{spec.memory_gib:.1f}",
            f"{spec.bf16_tflops:g}" if spec.bf16_tflops else "-",
            f"{spec.hbm_bandwidth_gb_per_s:g}",
        ]
        for spec in gpu_specs()
    ]
    print(table(["GPU", "memory GiB", "bf16 TFLOPs", "memory GB/s"], rows, right={1, 2, 3}))
    return 0
