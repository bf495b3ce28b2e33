from __future__ import annotations

import pytest

from services.catalog.gpus import find_gpu, gpu_specs
from services.estimator.errors import EstimatorError

REQUIRED = [
    "T4",
    "L4",
    "A10G",
    "RTX 4090",
    "A40",
    "L40S",
    "RTX PRO 6000",
    "A100 40GB",
    "A100 80GB",
    "H100 SXM",
    "H100 PCIe",
    "H200",
    "B200",
]


def test_required_cards_have_specs() -> None:
    names = {s.name for s in gpu_specs()}
    assert set(REQUIRED) <= names
    for spec in gpu_specs():
        assert spec.memory_gib > 0 and spec.fp16_tflops > 0 and spec.hbm_bandwidth_gb_per_s > 0
        assert spec.source


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("A100 80GB", "A100 80GB"),
        ("a100-80gb", "A100 80GB"),
        ("A100-SXM4-80GB", "A100 80GB"),
        ("A100 40GB", "A100 40GB"),
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("h100 pcie", "H100 PCIe"),
        ("RTX 4090", "RTX 4090"),
        ("GeForce RTX 4090", "RTX 4090"),
        ("l40s", "L40S"),
        ("H200 141GB", "H200"),
        ("A6000 48GB", "RTX A6000"),
        ("rtx pro 6000", "RTX PRO 6000"),
        ("Tesla T4", "T4"),
    ],
)
def test_forgiving_names(given: str, expected: str) -> None:
    assert find_gpu(given).name == expected


def test_unknown_gpu_suggests_close_names() -> None:
    with pytest.raises(EstimatorError) as err:
        find_gpu("A100 90GB x")
    assert err.value.field == "gpu"
    assert "A100" in err.value.message


def test_bf16_falls_back_to_fp16_rate_on_turing() -> None:
    t4 = find_gpu("T4")
    assert t4.bf16_tflops is None
    assert t4.dense_tflops("bf16") == t4.fp16_tflops
