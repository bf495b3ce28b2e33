"""The planner is pure core: importing and running it loads no I/O or heavy library (STYLE.md)."""

from __future__ import annotations

import subprocess
import sys

FORBIDDEN = ("sqlalchemy", "fastapi", "celery", "boto3", "redis", "torch")


def test_planner_imports_nothing_heavy() -> None:
    code = (
        "import sys\n"
        "import services.planner\n"
        "from services.planner import plan_setups\n"
        "from services.estimator.plan import Plan\n"
        "plan_setups(Plan.model_validate({'model': {'name': 'meta-llama/Llama-3.1-8B'}, 'method': 'qlora',\n"
        "    'data': {'tokens': 1000000}}))\n"
        f"bad = [m for m in {FORBIDDEN!r} if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"planner imported: {out.stdout.strip()}"
