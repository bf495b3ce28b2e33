"""Provider id formats and the /proc helpers the local driver relies on (pure, or this process only)."""

from __future__ import annotations

import os
import socket
import subprocess

import pytest

from services.nodes.instance_ids import InstanceIdError, check_instance_id
from services.nodes.processes import connection_is_from, is_gpuplan_agent, start_ticks


@pytest.mark.parametrize(
    ("driver", "good", "bad"),
    [
        ("aws", ["i-0abc1234", "i-0abc1234def567890"], ["i-0ABC1234", "i-0abc12345", "x/../i-0abc1234", ""]),
        ("runpod", ["ozz7oaeg7phj7w", "abc123xyz456"], ["OZZ7", "a/b", "pod_1", "a" * 33]),
        ("lambda", ["0920582c7ff041399e34823a0be62549"], ["0920582c7ff041399e34823a0be6254g", "a" * 31]),
        ("vast", ["2459368", "1"], ["-1", "12a", "1" * 13, "1/../2"]),
        ("http", ["vm-42", "node.1:a_b"], [".", "..", "../x", "a/b", "a?b", "a#b", "a b", "-x", "a\x00b"]),
    ],
)
def test_each_provider_accepts_its_ids_and_nothing_else(driver: str, good: list[str], bad: list[str]) -> None:
    for instance_id in good:
        assert check_instance_id(instance_id, driver) == instance_id
    for instance_id in bad:
        with pytest.raises(InstanceIdError, match=f"not a {driver} instance id"):
            check_instance_id(instance_id, driver)


def test_a_custom_pattern_never_lets_a_dot_segment_through() -> None:
    assert check_instance_id("anything/at all", "http", ".*") == "anything/at all"
    for dots in (".", ".."):
        with pytest.raises(InstanceIdError):
            check_instance_id(dots, "http", ".*")


def test_a_gpuplan_agent_is_recognised_by_its_command_line() -> None:
    assert is_gpuplan_agent(["/venv/bin/python", "/venv/bin/gpuplan", "agent", "--api", "x"])
    assert is_gpuplan_agent(["/usr/bin/python3", "-m", "services.cli.main", "agent"])
    assert not is_gpuplan_agent(["/venv/bin/gpuplan", "serve"])
    assert not is_gpuplan_agent(["sleep", "300", "agent"])
    assert not is_gpuplan_agent([])


def test_a_connection_is_attributed_to_the_process_that_holds_it() -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    client = socket.create_connection(server.getsockname())
    accepted, (host, port) = server.accept()
    other = subprocess.Popen(["sleep", "30"])
    try:
        assert connection_is_from(os.getpid(), host, port, server.getsockname()[1])
        assert not connection_is_from(other.pid, host, port, server.getsockname()[1])
        assert not connection_is_from(os.getpid(), "10.0.0.1", port, server.getsockname()[1])  # not loopback
        assert start_ticks(other.pid) is not None
    finally:
        other.kill()
        other.wait()
        for sock in (client, accepted, server):
            sock.close()
    assert start_ticks(other.pid) is None  # reaped: gone
