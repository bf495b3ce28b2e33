"""Provider drivers: how gpuplan stops (and starts) a node, behind one interface.

- ``http``: any provider with an HTTP API. Stop/start URL templates with ``{instance_id}``,
  ``{node_id}`` and ``{name}``, a configurable method and auth header (the token is a secret: never
  logged, never in an error message). Every value is checked against the provider's id format and
  percent-encoded as one path segment, so no tenant input changes the URL's path, query or host.
- ``local``: the node is this machine; stopping it means stopping its agent process (SIGTERM, which
  makes the agent run a final sync and exit). For a workstation, a test, or a provider whose machines
  shut down when their main process exits. Only a pid proven by the node's token over a connection
  that process holds (services/nodes/processes.py), still alive, still the same process and still a
  `gpuplan agent`, is ever signalled; once that process has exited (or its pid is another's), the stop is done.
- ``aws``, ``runpod``, ``lambda``, ``vast``: the providers' own APIs (services/nodes/cloud_drivers.py).
- ``none``: the default; a stop decision is recorded, and the node keeps running.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import quote, urlsplit

import httpx

from services.nodes.instance_ids import InstanceIdError, check_instance_id
from services.nodes.processes import cmdline, is_gpuplan_agent, start_ticks


class DriverError(Exception):
    pass


@dataclass(frozen=True)
class NodeTarget:
    id: str
    name: str
    instance_id: str
    hostname: str
    agent_pid: int | None  # only a pid proven with the node token (None: none proven)
    agent_pid_start_ticks: int | None = None


class ProviderDriver(Protocol):
    name: str

    def stop(self, node: NodeTarget) -> str: ...

    def start(self, node: NodeTarget) -> str: ...


class NoDriver:
    name = "none"

    def stop(self, node: NodeTarget) -> str:
        raise DriverError("no provider driver configured (GPUPLAN_PROVIDER_DRIVER=http or local); left running")

    def start(self, node: NodeTarget) -> str:
        raise DriverError("no provider driver configured")


class UnusableDriver(NoDriver):
    """A driver the settings name but cannot build (a key or a URL missing): every stop is refused with why, so the
    sweep still decides, marks lost nodes and asks for final syncs, and each idle node's events say what to set."""

    def __init__(self, name: str, problem: str) -> None:
        self.name, self._problem = name, problem

    def stop(self, node: NodeTarget) -> str:
        raise DriverError(f"the {self.name} driver is not usable ({self._problem}); left running")

    def start(self, node: NodeTarget) -> str:
        raise DriverError(f"the {self.name} driver is not usable ({self._problem})")


class HttpDriver:
    name = "http"

    def __init__(
        self,
        stop_url: str,
        start_url: str | None = None,
        method: str = "POST",
        auth_header: str = "Authorization",
        auth_value: str | None = None,
        timeout_s: float = 30.0,
        transport: httpx.BaseTransport | None = None,
        instance_id_pattern: str | None = None,
    ) -> None:
        self._stop_url, self._start_url, self._method = stop_url, start_url, method.upper()
        self._headers = {auth_header: auth_value} if auth_value else {}
        # httpx applies the timeout to each phase (connect, write, read, pool): a provider that hangs
        # fails the attempt instead of holding the sweep (services/nodes/lifecycle.py bounds the total).
        self._client = httpx.Client(timeout=timeout_s, transport=transport)
        self._id_pattern = instance_id_pattern

    def url_for(self, template: str, node: NodeTarget) -> str:
        """The template filled with the node's values, each checked and encoded as one path segment."""
        if "{instance_id}" in template:
            if not node.instance_id:
                raise DriverError(f"node {node.name} reported no instance id; the agent needs --instance-id")
            try:
                check_instance_id(node.instance_id, "http", self._id_pattern)
            except InstanceIdError as exc:
                raise DriverError(str(exc)) from None
        values = {"instance_id": node.instance_id, "node_id": node.id, "name": node.name}
        url = template.format(**{k: quote(v, safe="") for k, v in values.items()})
        # Encoding keeps every value inside its segment; check the result anyway (belt and braces).
        base, built = urlsplit(template.split("{", 1)[0]), urlsplit(url)
        if (built.scheme, built.netloc) != (base.scheme, base.netloc):
            raise DriverError(
                "the stop URL template does not keep the provider's host; check GPUPLAN_PROVIDER_STOP_URL"
            )
        return url

    def _call(self, template: str, node: NodeTarget, what: str) -> str:
        url = self.url_for(template, node)
        try:
            response = self._client.request(self._method, url, headers=self._headers)
        except httpx.HTTPError as exc:
            raise DriverError(f"{what} request to the provider failed: {type(exc).__name__}") from None
        if response.status_code >= 300:
            raise DriverError(f"the provider answered {what} with HTTP {response.status_code}")
        return f"{what}: {self._method} {url} -> HTTP {response.status_code}"

    def stop(self, node: NodeTarget) -> str:
        return self._call(self._stop_url, node, "stop")

    def start(self, node: NodeTarget) -> str:
        if not self._start_url:
            raise DriverError("no start URL configured (GPUPLAN_PROVIDER_START_URL)")
        return self._call(self._start_url, node, "start")


def _alive(pid: int) -> bool:
    """Whether a process runs (an exited child nobody has reaped yet, a zombie, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _exited(pid: int, ticks: int) -> bool:
    """Whether the process that started at ``ticks`` has exited: its pid is gone, a zombie, or another process's."""
    return start_ticks(pid) != ticks or not _alive(pid)


class LocalDriver:
    name = "local"

    def __init__(self, wait_s: float = 60.0) -> None:
        self._wait_s = wait_s

    def check_target(self, node: NodeTarget) -> int | None:
        """The pid to signal, None when the process that authenticated has exited (a stop has nothing left to do), or
        DriverError saying why none may be signalled."""
        if node.hostname != socket.gethostname():
            raise DriverError(f"node {node.name} runs on {node.hostname!r}, not on this machine")
        pid, ticks = node.agent_pid, node.agent_pid_start_ticks
        if pid is None:
            raise DriverError(
                f"node {node.name}: no agent process proved itself with the node token over a local connection; "
                "refusing to signal a reported pid"
            )
        if pid <= 1 or pid == os.getpid():
            raise DriverError(f"node {node.name}: refusing to signal pid {pid}")
        if ticks is None:
            raise DriverError(f"node {node.name}: pid {pid} was proven without its start time; refusing to signal it")
        if _exited(pid, ticks):
            # The agent that authenticated is gone (an earlier attempt's SIGTERM outlived its wait while the final sync
            # ran): the stop is done. Refusing here failed every retry until stop_failed, though the agent had stopped.
            return None
        if not is_gpuplan_agent(cmdline(pid)):
            raise DriverError(f"node {node.name}: pid {pid} is not a `gpuplan agent` process")
        return pid

    def stop(self, node: NodeTarget) -> str:
        pid, ticks = self.check_target(node), node.agent_pid_start_ticks
        if pid is None or ticks is None:  # ticks: check_target refused a pid without them
            return f"agent process {node.agent_pid} had already exited"
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return f"agent process {pid} had already exited"
        deadline = time.monotonic() + self._wait_s
        while time.monotonic() < deadline:
            if _exited(pid, ticks):
                return f"agent process {pid} stopped (SIGTERM, final sync included)"
            time.sleep(0.1)
        raise DriverError(f"agent process {pid} did not exit within {self._wait_s:g} s")

    def start(self, node: NodeTarget) -> str:
        raise DriverError("the local driver cannot start a node; run `gpuplan agent` again")
