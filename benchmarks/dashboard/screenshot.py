"""The README's dashboard picture, made from the README's own plan: serves gpuplan on a fresh SQLite file,
submits the plan of the README's API example, and has Debian's Chromium photograph the plan's page into
docs/img/plan.png, so the picture shows the numbers gpuplan gives today.

Run: ``python -m benchmarks.dashboard.screenshot`` (needs /usr/bin/chromium and Playwright, the dev extra).
"""

from __future__ import annotations

import socket
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "docs" / "img" / "plan.png"
# The plan of the README's API example (README.md, "API").
README_PLAN = {
    "model": {"name": "meta-llama/Llama-3.1-8B"},
    "method": "qlora",
    "lora": {"rank": 16},
    "micro_batch_size": 4,
    "seq_len": 512,
    "gradient_checkpointing": True,
    "dataset": {"examples": 10000, "avg_tokens": 512},
    "epochs": 3,
}


def main() -> int:
    import uvicorn
    from playwright.sync_api import sync_playwright

    from services.api.app import create_app
    from services.core.db import make_engine, make_sessionmaker, unit_of_work
    from services.core.migrate import upgrade
    from services.core.settings import Settings
    from services.orgs.service import create_key, create_organization

    with tempfile.TemporaryDirectory(prefix="gpuplan-screenshot-") as tmp:
        url = f"sqlite:///{Path(tmp) / 'gpuplan.db'}"
        upgrade(url)
        with unit_of_work(make_sessionmaker(make_engine(url))) as session:
            create_organization(session, "local")
            key = create_key(session, "local")
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        server = uvicorn.Server(
            uvicorn.Config(create_app(Settings(database_url=url)), host="127.0.0.1", port=port, log_level="warning")
        )
        threading.Thread(target=server.run, daemon=True).start()
        base = f"http://127.0.0.1:{port}"
        while not server.started:
            time.sleep(0.05)
        auth = {"Authorization": f"Bearer {key}"}
        plan_id = httpx.post(f"{base}/v1/plans", json=README_PLAN, headers=auth, timeout=60).json()["id"]
        while httpx.get(f"{base}/v1/plans/{plan_id}", headers=auth, timeout=60).json()["status"] != "done":
            time.sleep(0.2)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--headless", "--no-sandbox"])
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(f"{base}/dashboard/login")
            page.get_by_label("API key").fill(key)
            page.get_by_role("button", name="Sign in").click()
            page.wait_for_url(f"{base}/dashboard/plans")
            page.goto(f"{base}/dashboard/plans/{plan_id}")
            page.screenshot(path=str(OUT), full_page=False)
            browser.close()
        server.should_exit = True
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
