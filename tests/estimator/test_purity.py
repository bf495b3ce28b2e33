"""The pure core imports no I/O or heavy library (STYLE.md: pure core, thin edges)."""

from __future__ import annotations

import subprocess
import sys

FORBIDDEN = ("sqlalchemy", "fastapi", "celery", "boto3", "redis", "torch")


def test_estimator_and_catalog_import_nothing_heavy() -> None:
    code = (
        "import sys\n"
        "import services.estimator.estimate, services.estimator.memory, services.estimator.throughput\n"
        "import services.catalog.gpus, services.catalog.models, services.catalog.offers\n"
        "from services.estimator.estimate import estimate\n"
        "from services.estimator.plan import Plan\n"
        "estimate(Plan.model_validate({'model': {'name': 'meta-llama/Llama-3.1-8B'}}), 'A100 80GB')\n"
        f"bad = [m for m in {FORBIDDEN!r} if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"pure core imported: {out.stdout.strip()}"
