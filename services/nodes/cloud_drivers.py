"""Shutdown drivers for the providers gpuplan prices: AWS EC2 (boto3), RunPod, Lambda Cloud and Vast.ai
(their REST APIs). Each checks the instance id against its provider's format before it builds a call
(services/nodes/instance_ids.py), puts the id in the URL only percent-encoded as one path segment or in
a JSON body, and keeps its credential out of every error message and log line.

The calls, from each provider's API reference:
- AWS EC2: ``StopInstances`` / ``TerminateInstances`` / ``StartInstances`` with ``InstanceIds=[id]``
  (Amazon EC2 API Reference), through boto3.
- RunPod REST API (base https://rest.runpod.io/v1, ``Authorization: Bearer <key>``):
  ``POST /pods/{podId}/stop``, ``DELETE /pods/{podId}`` (terminate), ``POST /pods/{podId}/start``.
- Lambda Cloud API (base https://cloud.lambdalabs.com/api/v1, ``Authorization: Bearer <key>``):
  ``POST /instance-operations/terminate`` with ``{"instance_ids": [id]}``. Lambda instances cannot be
  stopped, only terminated (and not started again), so this driver needs ``provider_stop_action=terminate``.
- Vast.ai API (base https://console.vast.ai/api/v0, ``Authorization: Bearer <key>``):
  ``PUT /instances/{id}/`` with ``{"state": "stopped"}`` (``"running"`` to start), ``DELETE /instances/{id}/``
  (destroy).
"""

from __future__ import annotations

from typing import Any, Literal
from urllib.parse import quote

import httpx

from services.nodes.drivers import DriverError, NodeTarget
from services.nodes.instance_ids import InstanceIdError, check_instance_id

StopAction = Literal["stop", "terminate"]


def _checked_id(driver: str, node: NodeTarget) -> str:
    if not node.instance_id:
        raise DriverError(f"node {node.name} reported no instance id; the agent needs --instance-id")
    try:
        return check_instance_id(node.instance_id, driver)
    except InstanceIdError as exc:
        raise DriverError(str(exc)) from None


def _scrub(text: str, secret: str) -> str:
    """The provider's answer, short, with the credential removed should the provider have echoed it."""
    return text.replace(secret, "***")[:200] if secret else text[:200]


class RestDriver:
    """A provider API with a bearer key: one request per stop/start, JSON in and out."""

    name = "rest"
    default_url = ""

    def __init__(
        self,
        api_key: str,
        action: StopAction = "stop",
        base_url: str | None = None,
        timeout_s: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if not api_key:
            raise DriverError(f"GPUPLAN_PROVIDER_DRIVER={self.name} needs GPUPLAN_PROVIDER_API_KEY")
        self._key = api_key
        self.action = action
        self._client = httpx.Client(
            base_url=(base_url or self.default_url).rstrip("/"),
            timeout=timeout_s,
            transport=transport,
            headers={"Authorization": f"Bearer {api_key}", "Accept": "application/json"},
        )

    def _request(self, method: str, path: str, what: str, body: dict[str, Any] | None = None) -> str:
        try:
            response = self._client.request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise DriverError(f"{self.name} {what} request failed: {type(exc).__name__}") from None
        if response.status_code >= 300:
            detail = _scrub(response.text, self._key)
            raise DriverError(f"{self.name} answered {what} with HTTP {response.status_code}: {detail}")
        return f"{self.name} {what}: {method} {path} -> HTTP {response.status_code}"

    def stop(self, node: NodeTarget) -> str:
        raise NotImplementedError

    def start(self, node: NodeTarget) -> str:
        raise NotImplementedError


class RunPodDriver(RestDriver):
    name = "runpod"
    default_url = "https://rest.runpod.io/v1"

    def stop(self, node: NodeTarget) -> str:
        pod = quote(_checked_id(self.name, node), safe="")
        if self.action == "terminate":
            return self._request("DELETE", f"/pods/{pod}", "terminate")
        return self._request("POST", f"/pods/{pod}/stop", "stop")

    def start(self, node: NodeTarget) -> str:
        pod = quote(_checked_id(self.name, node), safe="")
        return self._request("POST", f"/pods/{pod}/start", "start")


class LambdaDriver(RestDriver):
    name = "lambda"
    default_url = "https://cloud.lambdalabs.com/api/v1"

    def __init__(self, api_key: str, action: StopAction = "terminate", **kwargs: Any) -> None:
        if action != "terminate":
            raise DriverError(
                "Lambda Cloud instances cannot be stopped, only terminated: set GPUPLAN_PROVIDER_STOP_ACTION=terminate"
            )
        super().__init__(api_key, action, **kwargs)

    def stop(self, node: NodeTarget) -> str:
        instance = _checked_id(self.name, node)
        return self._request("POST", "/instance-operations/terminate", "terminate", {"instance_ids": [instance]})

    def start(self, node: NodeTarget) -> str:
        raise DriverError("a terminated Lambda Cloud instance cannot be started again; launch a new one")


class VastDriver(RestDriver):
    name = "vast"
    default_url = "https://console.vast.ai/api/v0"

    def stop(self, node: NodeTarget) -> str:
        instance = quote(_checked_id(self.name, node), safe="")
        if self.action == "terminate":
            return self._request("DELETE", f"/instances/{instance}/", "destroy")
        return self._request("PUT", f"/instances/{instance}/", "stop", {"state": "stopped"})

    def start(self, node: NodeTarget) -> str:
        instance = quote(_checked_id(self.name, node), safe="")
        return self._request("PUT", f"/instances/{instance}/", "start", {"state": "running"})


class Ec2Driver:
    """AWS EC2 through boto3; the credentials come from the settings or boto3's usual chain."""

    name = "aws"

    def __init__(
        self,
        region: str,
        action: StopAction = "stop",
        endpoint_url: str | None = None,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        import boto3
        from botocore.config import Config

        self.action = action
        self._secret = secret_access_key or ""
        self._client: Any = boto3.client(
            "ec2",
            region_name=region,
            endpoint_url=endpoint_url,
            aws_access_key_id=access_key_id,
            aws_secret_access_key=secret_access_key,
            # One try per attempt: the sweep retries a failed stop with its own backoff, and a call stays
            # within the sweep's bound (services/nodes/lifecycle.py).
            config=Config(
                retries={"total_max_attempts": 1, "mode": "standard"},
                connect_timeout=min(timeout_s, 10.0),
                read_timeout=timeout_s,
            ),
        )

    def _call(self, operation: str, node: NodeTarget) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        instance = _checked_id(self.name, node)
        try:
            return getattr(self._client, operation)(InstanceIds=[instance])
        except ClientError as exc:
            error = exc.response.get("Error", {})
            message = _scrub(str(error.get("Message", "")), self._secret)
            raise DriverError(f"aws {operation} failed: {error.get('Code', 'error')}: {message}") from None
        except BotoCoreError as exc:
            raise DriverError(f"aws {operation} failed: {type(exc).__name__}") from None

    def stop(self, node: NodeTarget) -> str:
        if self.action == "terminate":
            answer = self._call("terminate_instances", node)
            changes = answer.get("TerminatingInstances", [])
        else:
            answer = self._call("stop_instances", node)
            changes = answer.get("StoppingInstances", [])
        state = changes[0]["CurrentState"]["Name"] if changes else "unknown"
        return f"aws {self.action} {node.instance_id}: {state}"

    def start(self, node: NodeTarget) -> str:
        changes = self._call("start_instances", node).get("StartingInstances", [])
        state = changes[0]["CurrentState"]["Name"] if changes else "unknown"
        return f"aws start {node.instance_id}: {state}"
