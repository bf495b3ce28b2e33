"""The catalog parsers and the feed parsers are pure core: importing and running them loads no database,
web, queue or cloud library (STYLE.md); only a feed's fetch touches the network, lazily."""

from __future__ import annotations

import subprocess
import sys

FORBIDDEN = ("sqlalchemy", "fastapi", "celery", "boto3", "redis", "torch", "httpx")


def test_catalog_and_feed_parsers_import_nothing_heavy() -> None:
    code = (
        "import sys\n"
        "from services.catalog.pricelist import parse_price_list, export_csv\n"
        "from services.catalog.offers import bundled_offers\n"
        "from services.catalog.feeds import aws, lambda_cloud, runpod, vast\n"
        "export_csv(parse_price_list('provider,gpu,on_demand_usd_per_hour\\nacme,H100,3\\n', 'csv'))\n"
        "runpod.parse_gpu_types({'data': {'gpuTypes': []}}, '2026-12-01')\n"
        "aws.parse_prices([], {}, '2026-12-01')\n"
        f"bad = [m for m in {FORBIDDEN!r} if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"the catalog parsers imported: {out.stdout.strip()}"
