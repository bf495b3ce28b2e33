"""A loopback fake of the providers' offer APIs: serves generated responses (shaped as each API documents
them) and records every request, so tests check what was sent and what a failure looks like."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

RESPONSES = Path(__file__).parent / "responses"


def response(name: str) -> Any:
    return json.loads((RESPONSES / name).read_text(encoding="utf-8"))


@dataclass
class Call:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class FakeProviders:
    """Routes (method, path) to (status, JSON body); ``calls`` records what arrived."""

    url: str = ""
    routes: dict[tuple[str, str], tuple[int, Any]] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)


def _aws_price_list(products: list[dict[str, Any]], target: str) -> tuple[int, Any]:
    if target != "AWSPriceListService.GetProducts":
        return 400, {"__type": "UnknownOperationException"}
    return 200, {"FormatVersion": "aws_v1", "PriceList": [json.dumps(p) for p in products]}


@contextmanager
def fake_providers() -> Iterator[FakeProviders]:
    state = FakeProviders()

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = raw.decode("utf-8", "replace")
            state.calls.append(Call(self.command, self.path, dict(self.headers.items()), body))
            target = self.headers.get("X-Amz-Target")
            if target is not None and ("AWS", "price-list") in state.routes:
                status, payload = _aws_price_list(state.routes[("AWS", "price-list")][1], target)
                content_type = "application/x-amz-json-1.1"
            else:
                status, payload = state.routes.get((self.command, self.path), (404, {"error": "no such route"}))
                content_type = "application/json"
            data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _answer

        def log_message(self, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


def aws_product(
    instance_type: str, region: str, usd_per_hour: float, os: str = "Linux", memory: str | None = None
) -> dict[str, Any]:
    """One Price List entry as the AWS Price List API documents it (product attributes + OnDemand terms)."""
    sku = f"SKU{abs(hash((instance_type, region, os))) % 10**8:08d}"
    return {
        "product": {
            "productFamily": "Compute Instance",
            "attributes": {
                "instanceType": instance_type,
                "regionCode": region,
                "operatingSystem": os,
                "tenancy": "Shared",
                "preInstalledSw": "NA",
                "capacitystatus": "Used",
                "instanceFamily": "GPU instance",
                **({"memory": memory} if memory is not None else {}),
            },
            "sku": sku,
        },
        "serviceCode": "AmazonEC2",
        "terms": {
            "OnDemand": {
                f"{sku}.JRTCKXETXF": {
                    "offerTermCode": "JRTCKXETXF",
                    "sku": sku,
                    "priceDimensions": {
                        f"{sku}.JRTCKXETXF.6YS6EN2CT7": {
                            "unit": "Hrs",
                            "description": f"${usd_per_hour} per On Demand Linux {instance_type} Instance Hour",
                            "pricePerUnit": {"USD": f"{usd_per_hour:.10f}"},
                        }
                    },
                }
            }
        },
        "version": "20261101000000",
        "publicationDate": "2026-11-01T00:00:00Z",
    }
