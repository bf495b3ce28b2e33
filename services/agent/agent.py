"""`gpuplan agent`: runs on a GPU node, registers it, sends heartbeats, and runs its calibration jobs.

It talks to the API only (HTTP with the organization's key): the node needs no database or broker
access. Its queue is the node's list of calibrations, claimed one at a time.
"""

from __future__ import annotations

import logging
import socket
import time
from typing import Any

import httpx

from services.catalog.models import find_model
from services.estimator.plan import Plan

log = logging.getLogger("gpuplan.agent")


def detect_gpus() -> dict[str, Any]:
    """GPU model, count, memory and driver from NVML; a CPU-only node when there is none."""
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(handle)
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total / 2**30
        driver = pynvml.nvmlSystemGetDriverVersion()
        cuda = pynvml.nvmlSystemGetCudaDriverVersion()  # e.g. 12040 for CUDA 12.4
        return {
            "gpu": str(name),
            "gpu_count": count,
            "gpu_memory_gib": round(memory, 1),
            "driver": str(driver),
            "cuda": f"{cuda // 1000}.{cuda % 1000 // 10}",
        }
    except Exception:  # no NVML library or no NVIDIA driver: a CPU-only node
        return {"gpu": "cpu", "gpu_count": 0, "gpu_memory_gib": 0.0, "driver": ""}


def gpu_status() -> list[dict[str, Any]]:
    try:
        import pynvml

        out = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            out.append(
                {
                    "index": index,
                    "utilisation_pct": float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu),
                    "memory_used_gib": memory.used / 2**30,
                    "memory_total_gib": memory.total / 2**30,
                }
            )
        return out
    except Exception:
        return []


class Agent:
    def __init__(self, client: httpx.Client, key: str) -> None:
        self.client = client
        self.headers = {"Authorization": f"Bearer {key}"}
        self.node_id: str | None = None
        self.busy = False

    def _post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        response = self.client.post(path, json=body, headers=self.headers)
        if response.status_code >= 400:
            raise RuntimeError(f"{path}: {response.status_code} {response.text[:300]}")
        return response

    def register(self, **overrides: Any) -> str:
        info = {
            "name": socket.gethostname()[:100],
            **detect_gpus(),
            **{k: v for k, v in overrides.items() if v is not None},
        }
        self.node_id = str(self._post("/v1/nodes", info).json()["id"])
        return self.node_id

    def heartbeat(self) -> None:
        self._post(f"/v1/nodes/{self.node_id}/heartbeat", {"gpus": gpu_status(), "job_running": self.busy})

    def poll_once(self) -> bool:
        """Claim and run the node's next calibration; False when there was none."""
        response = self._post(f"/v1/nodes/{self.node_id}/calibrations/next", {})
        if response.status_code == 204:
            return False
        job = response.json()
        self.busy = True
        self.heartbeat()
        try:
            from services.agent.calibrate import run_calibration

            request = dict(job["plan"])
            for key in ("dataset", "epochs", "constraints"):
                request.pop(key, None)
            plan = Plan.model_validate(request)
            config = plan.model.config or find_model(plan.model.name or "").config
            result = run_calibration(plan, dict(config), job["warmup_steps"], job["timed_steps"])
        except Exception as exc:
            log.exception("calibration %s failed", job["id"])
            self._post(f"/v1/calibrations/{job['id']}/failure", {"error": f"{type(exc).__name__}: {exc}"[:2000]})
        else:
            self._post(f"/v1/calibrations/{job['id']}/result", result)
        finally:
            self.busy = False
            self.heartbeat()
        return True

    def run(self, interval_s: float = 15.0, once: bool = False) -> None:
        while True:
            self.heartbeat()
            ran = self.poll_once()
            if once:
                return
            if not ran:
                time.sleep(interval_s)
