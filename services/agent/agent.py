"""`gpuplan agent`: runs on a GPU node, registers it, sends heartbeats, runs its calibration jobs, and
(with ``--run``) syncs the run's checkpoints and guards against an idle machine nobody stops.

It talks to the API only (HTTP with the organization's key) and to the bucket: the node needs no
database or broker access. Its queue is the node's list of calibrations, claimed one at a time.
Registration returns the node's token once; the agent keeps it in memory and sends it as
``X-Node-Token`` on every heartbeat and report (a restarted agent registers again and gets a new one),
with its own pid, which the server accepts for the ``local`` driver only when it can see the request
came from that process.

The GPU it registers is the one NVML reports, sent as ``nvml_gpu`` too; a GPU named by hand (``--gpu``)
counts only where NVML cannot tell, and the server then uses none of the node's calibrations
(services/nodes/calibration.py). Each heartbeat reports every GPU registered; one NVML cannot read then is
sent with null figures, and the node is kept while its GPU state is unknown (services/nodes/idle.py).

A calibration runs in the agent's thread while another keeps the loop's heartbeats (and due sync passes) going, each
reporting the node busy: one calibration outlasting the lost threshold got the node marked lost, and none of its
heartbeats said the GPU was in use.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import threading
import time
from typing import Any

import httpx

from services.agent.node import NodeGuard, RunSync, Syncer, every, local_signals, read_progress, stop_machine
from services.agent.signals import JobWatch, read_gpus
from services.catalog.gpus import find_gpu
from services.catalog.models import find_model
from services.estimator.errors import EstimatorError
from services.estimator.plan import Plan
from services.nodes.idle import HEARTBEAT_INTERVAL_S
from services.runs.sync import BucketOnly

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


def same_gpu(a: str, b: str) -> bool:
    """Whether two GPU names are the same catalog card (names the catalog does not know compare as text)."""
    try:
        return find_gpu(a).name == find_gpu(b).name
    except EstimatorError:
        return a.strip().lower() == b.strip().lower()


def _message(response: httpx.Response) -> str:
    """The service's one-line message of an error answer (its JSON body was printed whole, braces and all)."""
    try:
        body = response.json()
    except ValueError:
        return response.text
    return str(body.get("message") or body) if isinstance(body, dict) else response.text


class Agent:
    def __init__(
        self,
        client: httpx.Client,
        key: str,
        *,
        jobs: JobWatch | None = None,
        guard: NodeGuard | None = None,
        stop_command: list[str] | None = None,
    ) -> None:
        self.client = client
        self.headers = {"Authorization": f"Bearer {key}"}
        self.node_id: str | None = None
        self.node_token = ""  # issued by the registration, sent with every heartbeat and report
        self.busy = False  # a calibration is running
        self.jobs = jobs if jobs is not None else JobWatch()  # the training job's processes
        self.guard = guard
        self.stop_command = stop_command
        self.syncer: Syncer | None = None
        self.stopping = threading.Event()
        self.job: subprocess.Popen[bytes] | None = None  # the training job this agent launched
        self.gpu_count = 0  # the GPUs NVML reported at registration: each is reported, unreadable or not
        self.interval_s = HEARTBEAT_INTERVAL_S  # seconds between heartbeats, declared in each (run() sets it)
        self.final_sync_error: str | None = None  # set by run() when its final sync left checkpoints not durable
        self.reachable = True  # the last heartbeat reached the control plane (a due sync pass goes through the API)

    def _post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        headers = {**self.headers, "X-Node-Token": self.node_token} if self.node_token else self.headers
        response = self.client.post(path, json=body, headers=headers)
        if response.status_code >= 400:
            raise RuntimeError(f"{path}: HTTP {response.status_code}: {_message(response)[:300]}")
        return response

    def register(self, **overrides: Any) -> str:
        detected = detect_gpus()
        named = overrides.pop("gpu", None)
        info = {
            "name": socket.gethostname()[:100],
            "hostname": socket.gethostname()[:255],
            "agent_pid": os.getpid(),
            **detected,
            **{k: v for k, v in overrides.items() if v is not None},
        }
        if detected["gpu"] != "cpu":  # NVML tells: what it reports is the node's GPU
            info["nvml_gpu"] = detected["gpu"]
            if named is not None and not same_gpu(named, detected["gpu"]):
                log.warning("--gpu %r ignored: NVML reports %r", named, detected["gpu"])
        elif named is not None:
            info["gpu"] = named  # NVML cannot tell: registered as named, its calibrations unverified
            log.warning("NVML reports no GPU; registering as %r (unverified: its calibrations stay unused)", named)
        self.node_token = ""
        self.gpu_count = int(detected["gpu_count"])
        answer = self._post("/v1/nodes", info).json()
        self.node_id, self.node_token = str(answer["id"]), str(answer["node_token"])
        return self.node_id

    def launch(self, command: list[str]) -> int:
        """Start the training job (its output goes where the agent's does); its process tree is the
        node's busy signal until it exits."""
        self.job = subprocess.Popen(command)
        self.jobs.add(self.job.pid)
        log.info("launched job %d: %s", self.job.pid, " ".join(command))
        return self.job.pid

    def _reap_job(self) -> None:
        if self.job is not None and self.job.poll() is not None:
            # A job that succeeded is news, not a warning (gpuplan agent shows INFO lines); a failure is one.
            level = logging.INFO if self.job.returncode == 0 else logging.WARNING
            log.log(level, "job %d exited with status %s", self.job.pid, self.job.returncode)
            self.job = None

    def attach_run(self, run: RunSync) -> None:
        self.syncer = Syncer(run)

    def heartbeat(self) -> bool:
        """Report the node's state; False when the control plane could not be reached."""
        self.reachable = self._heartbeat()
        return self.reachable

    def _heartbeat(self) -> bool:
        self._reap_job()
        gpus, gpu_pids = read_gpus(self.gpu_count)
        syncer = self.syncer
        unsynced = syncer.run.unsynced() if syncer else 0
        signals = local_signals(self.jobs, self.busy, bool(syncer and syncer.uploading), unsynced, gpus, gpu_pids)
        if self.guard is not None:
            self.guard.observe(signals)
        body: dict[str, Any] = {
            "gpus": gpus,
            "job_running": signals.job_running,
            "uploading": signals.uploading,
            "interactive_idle_s": signals.interactive_idle_s,
            "unsynced_checkpoints": unsynced,
            "agent_pid": os.getpid(),
            "heartbeat_interval_s": float(self.interval_s),
        }
        if syncer is not None:
            step, loss = read_progress(syncer.run.checkpoint_dir)
            body["progress"] = {"run_id": syncer.run.api.run_id, "step": step, "loss": loss}
            body["sync"] = syncer.run.health()
        try:
            answer = self._post(f"/v1/nodes/{self.node_id}/heartbeat", body).json()
        except (httpx.HTTPError, RuntimeError, ValueError) as exc:
            # ValueError: a body JSON cannot carry (a non-finite number). The loop goes on: an agent that ended
            # here would leave its node unwatched and its checkpoints unsynced.
            log.warning("heartbeat failed: %s", exc)
            return False
        if self.guard is not None:
            self.guard.contact()
        if "sync" in answer.get("commands", []) and syncer is not None:
            syncer.start(syncer.run.api)
        return True

    def sync_if_due(self) -> None:
        """Start the periodic sync pass when it is due: through the API when the last heartbeat reached it, else
        against the bucket alone."""
        if self.syncer is not None and self.syncer.due(time.time()):
            run = self.syncer.run
            self.syncer.start(run.api if self.reachable else BucketOnly(run.s3, run.bucket, run.prefix))

    def _tick(self) -> None:
        """What the loop does every interval while a calibration holds it: a heartbeat and a due sync pass."""
        self.heartbeat()
        self.sync_if_due()

    def poll_once(self) -> bool:
        """Claim and run the node's next calibration; False when there was none. The node reports itself busy until
        the result is sent, and heartbeats every interval while the calibration runs."""
        response = self._post(f"/v1/nodes/{self.node_id}/calibrations/next", {})
        if response.status_code == 204:
            return False
        job = response.json()
        self.busy = True
        try:
            result, error = self._calibrate(job)
            if error is not None:
                self._post(f"/v1/calibrations/{job['id']}/failure", {"error": error})
            else:
                try:
                    self._post(f"/v1/calibrations/{job['id']}/result", result)
                except ValueError as exc:  # a figure JSON cannot carry (NaN): the job fails, the agent goes on
                    log.warning("calibration %s result not sent: %s", job["id"], exc)
                    self._post(f"/v1/calibrations/{job['id']}/failure", {"error": f"unsendable result: {exc}"[:2000]})
        finally:
            self.busy = False
            self.heartbeat()
        return True

    def _calibrate(self, job: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
        """Run the calibration in this thread while another makes the loop's heartbeats (the first at once, each
        reporting the node busy) and starts due sync passes; (the result, None) or ({}, why it failed). The reports
        are sent after the heartbeats end, so no two requests of this agent run at once."""
        end = every(self._tick, self.interval_s, "heartbeat during a calibration", "gpuplan-calibration-heartbeats")
        try:
            from services.agent.calibrate import run_calibration

            request = dict(job["plan"])
            for key in ("dataset", "epochs", "constraints"):
                request.pop(key, None)
            plan = Plan.model_validate(request)
            config = plan.model.config or find_model(plan.model.name or "").config
            return run_calibration(plan, dict(config), job["warmup_steps"], job["timed_steps"]), None
        except Exception as exc:
            log.exception("calibration %s failed", job["id"])
            return {}, f"{type(exc).__name__}: {exc}"[:2000]
        finally:
            end()

    def _on_sigterm(self, _signum: int, _frame: Any) -> None:
        log.warning("SIGTERM: final sync, then exit")
        self.stopping.set()

    def run(self, interval_s: float = HEARTBEAT_INTERVAL_S, once: bool = False) -> str:
        """The agent loop; returns why it ended ('once', 'sigterm' or the guard's reason). A final sync that failed is
        left in ``final_sync_error``."""
        self.interval_s = interval_s
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_sigterm)
        reachable = True
        while not self.stopping.is_set():
            reachable = self.heartbeat()
            ran = False
            if reachable:
                try:
                    ran = self.poll_once()
                except (httpx.HTTPError, RuntimeError, ValueError) as exc:
                    log.warning("calibration poll failed: %s", exc)
            self.sync_if_due()
            reason = self.guard.should_stop() if self.guard is not None else None
            if reason is not None:
                log.warning("node-side guard: %s; final sync, then stop", reason)
                if self.syncer is not None:
                    # No heartbeats meanwhile: the service has been unreachable past the guard's threshold.
                    self.final_sync_error = self.syncer.final(reachable=False)
                stop_machine(self.stop_command)
                return reason
            if once:
                return "once"
            if not ran:
                self.stopping.wait(interval_s)
        if self.syncer is not None:
            # Heartbeats go on during it (reporting the upload): a long final sync must not get the node marked lost.
            self.final_sync_error = self.syncer.final(reachable, self.heartbeat, interval_s)
        return "sigterm"
