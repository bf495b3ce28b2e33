"""The node's side of the runs API: what `gpuplan sync`, `gpuplan restore` and the agent call (HTTP)."""

from __future__ import annotations

from typing import Any

import httpx

from services.runs.manifest import Manifest


class RunApiError(Exception):
    pass


class RunApi:
    """Implements services.runs.sync.ControlPlane over HTTP with the organization's key."""

    def __init__(self, client: httpx.Client, key: str, run_id: str) -> None:
        self.client = client
        self.headers = {"Authorization": f"Bearer {key}"}
        self.run_id = run_id
        self._recorded: dict[int, dict[str, Any]] = {}

    def _call(
        self, method: str, path: str, body: dict[str, Any] | None = None, extra_headers: dict[str, str] | None = None
    ) -> Any:
        try:
            response = self.client.request(method, path, json=body, headers={**self.headers, **(extra_headers or {})})
        except httpx.HTTPError as exc:
            raise RunApiError(f"the gpuplan service is unreachable ({type(exc).__name__}: {exc})") from None
        if response.status_code >= 400:
            try:
                message = response.json().get("message") or response.text
            except ValueError:
                message = response.text
            raise RunApiError(f"{method} {path}: HTTP {response.status_code}: {str(message)[:300]}")
        return response.json()

    def run(self) -> dict[str, Any]:
        return dict(self._call("GET", f"/v1/runs/{self.run_id}"))

    def join(self, node_id: str, node_token: str) -> dict[str, Any]:
        """Join the run as this node (its agent proves itself with the node's token)."""
        headers = {"X-Node-Token": node_token}
        return dict(self._call("POST", f"/v1/runs/{self.run_id}/nodes", {"node_id": node_id}, headers))

    def done_steps(self) -> tuple[set[int], set[int]]:
        checkpoints = self.run()["checkpoints"]
        # What durable_manifest answers later in the same pass without asking again.
        self._recorded = {int(c["step"]): c["manifest"] for c in checkpoints if c["status"] == "durable"}
        return set(self._recorded), {int(c["step"]) for c in checkpoints if c["status"] == "deleted"}

    def report_durable(self, manifest: Manifest, upload_bytes_per_s: float | None) -> list[int]:
        body = {"manifest": manifest.model_dump(mode="json"), "upload_bytes_per_s": upload_bytes_per_s}
        answer = self._call("POST", f"/v1/runs/{self.run_id}/checkpoints", body)
        return [int(s) for s in answer["delete_steps"]]

    def report_deleted(self, step: int) -> None:
        self._call("POST", f"/v1/runs/{self.run_id}/checkpoints/{step}/deleted")

    def durable_manifest(self, step: int) -> Manifest | None:
        if step not in self._recorded:
            self.done_steps()
        recorded = self._recorded.get(step)
        return None if recorded is None else Manifest.model_validate(recorded)

    def choose(self, step: int | None, best: bool) -> Manifest:
        """The manifest to restore: a given step, the best by metric, or the last durable one."""
        run = self.run()
        durable = {int(c["step"]): c for c in run["checkpoints"] if c["status"] == "durable"}
        if not durable:
            raise RunApiError(f"run {self.run_id} has no durable checkpoint yet")
        if best:
            if run["best_step"] is None:
                raise RunApiError(f"run {self.run_id}: no checkpoint reported a metric; use --step or the latest")
            step = int(run["best_step"])
        elif step is None:
            step = max(durable)
        if step not in durable:
            raise RunApiError(f"run {self.run_id} has no durable checkpoint at step {step}; durable: {sorted(durable)}")
        return Manifest.model_validate(durable[step]["manifest"])
