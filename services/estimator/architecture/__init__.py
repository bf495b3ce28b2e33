"""Model architecture from a Hugging Face ``config.json``: layer shapes and exact parameter counts.

``model`` holds the architecture types, ``config`` the typed reading of config.json, the family
modules (``dense``, ``classic``, ``moe``, ``remote``, ``generic``) one parser per family with the
``transformers`` modelling file it mirrors, and ``parse`` the family table and the entry point.
"""

from services.estimator.architecture.model import (
    Architecture,
    Block,
    BlockKind,
    Linear,
    NormKind,
    ParameterCounts,
    Role,
    checkpoint_bytes,
    parameter_counts,
)
from services.estimator.architecture.moe import MXFP4_BITS_PER_PARAM
from services.estimator.architecture.parse import SUPPORTED_MODEL_TYPES, architecture_from_config

__all__ = [
    "MXFP4_BITS_PER_PARAM",
    "SUPPORTED_MODEL_TYPES",
    "Architecture",
    "Block",
    "BlockKind",
    "Linear",
    "NormKind",
    "ParameterCounts",
    "Role",
    "architecture_from_config",
    "checkpoint_bytes",
    "parameter_counts",
]
