"""Which local process a heartbeat came from, read from Linux /proc (for the ``local`` driver).

The ``local`` driver stops a node by sending SIGTERM to its agent process, so the pid it signals must be
proven, not reported: a heartbeat that carries the node token *and* arrives over a loopback TCP
connection whose client socket is held by the pid it names proves that this pid is the node's agent.
The kernel's socket table (/proc/net/tcp, /proc/net/tcp6) maps the connection's client address to a
socket inode, and /proc/<pid>/fd shows whether that process holds it (proc(5): "/proc/net/tcp",
"/proc/pid/fd"). The process's start time (/proc/<pid>/stat field 22, clock ticks after boot) is kept
with it, so a pid reused by another process later no longer matches.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

PROC = Path("/proc")


def start_ticks(pid: int, proc: Path = PROC) -> int | None:
    """The process's start time in clock ticks after boot (None: no such process or no /proc)."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    # Field 2 (the command name) is in parentheses and may hold spaces; fields after it split cleanly.
    fields = stat.rsplit(")", 1)[-1].split()
    try:
        return int(fields[19])  # field 22 overall: starttime
    except (IndexError, ValueError):
        return None


def cmdline(pid: int, proc: Path = PROC) -> list[str]:
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def is_gpuplan_agent(args: list[str]) -> bool:
    """Whether a command line runs `gpuplan agent` (the console script, or ``python -m services.cli.main``)."""
    for index, arg in enumerate(args):
        if os.path.basename(arg) == "gpuplan" or arg == "services.cli.main":
            return "agent" in args[index + 1 :]
    return False


def _hex_address(ip: str, port: int) -> set[str]:
    """The forms /proc/net/tcp{,6} write a local address in (host byte order words, x86 little-endian)."""
    address = ipaddress.ip_address(ip)
    forms = set()
    if address.version == 4:
        forms.add(f"{int.from_bytes(address.packed, 'little'):08X}:{port:04X}")
        mapped = ipaddress.IPv6Address(b"\0" * 10 + b"\xff\xff" + address.packed)
        forms.add(_v6_hex(mapped) + f":{port:04X}")
    else:
        forms.add(_v6_hex(address) + f":{port:04X}")
    return forms


def _v6_hex(address: ipaddress.IPv6Address) -> str:
    packed = address.packed
    return "".join(f"{int.from_bytes(packed[i : i + 4], 'little'):08X}" for i in range(0, 16, 4))


def socket_inodes(client_ip: str, client_port: int, server_port: int, proc: Path = PROC) -> set[str]:
    """Inodes of the sockets whose local end is the client address and whose peer is the server port."""
    try:
        locals_ = _hex_address(client_ip, client_port)
    except ValueError:
        return set()
    inodes = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10:
                continue
            local, remote, inode = fields[1], fields[2], fields[9]
            if local in locals_ and remote.rsplit(":", 1)[-1] == f"{server_port:04X}" and inode != "0":
                inodes.add(inode)
    return inodes


def holds_socket(pid: int, inodes: set[str], proc: Path = PROC) -> bool:
    """Whether the process has one of these socket inodes open (needs the same user, or root)."""
    if not inodes:
        return False
    wanted = {f"socket:[{inode}]" for inode in inodes}
    try:
        fds = list((proc / str(pid) / "fd").iterdir())
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(fd) in wanted:
                return True
        except OSError:
            continue
    return False


def connection_is_from(pid: int, client_ip: str, client_port: int, server_port: int, proc: Path = PROC) -> bool:
    """Whether the TCP connection from ``client_ip:client_port`` to ``server_port`` belongs to ``pid``."""
    try:
        if not ipaddress.ip_address(client_ip).is_loopback:
            return False  # another machine's process: nothing here can prove it
    except ValueError:
        return False
    return holds_socket(pid, socket_inodes(client_ip, client_port, server_port, proc), proc)
