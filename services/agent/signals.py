"""What the agent reports as busy signals, read from this machine (Linux /proc, NVML and utmp via `who`)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

JOB_PID_FILE = "gpuplan_job.pid"  # in the run's checkpoint folder: pids a training script registers


def _stat(pid: int, proc: Path) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of a live process, from /proc/<pid>/stat (proc(5));
    None when it is gone or a zombie (its work is over)."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    # Field 2 (the command name) is in parentheses and may hold spaces; split what follows it.
    fields = stat.rsplit(")", 1)[-1].split()
    try:
        state, ppid, start = fields[0], int(fields[1]), int(fields[19])
    except (IndexError, ValueError):
        return None
    return None if state in ("Z", "X") else (ppid, start)


class JobWatch:
    """Whether the node's training job is running, from the processes the job is made of.

    The roots are the job the agent launched itself (``gpuplan agent ... -- CMD``), pids named with
    ``--job-pid``, and pids a training script writes to ``gpuplan_job.pid`` in its checkpoint folder (one
    per line). Every descendant of a root counts too, and stays counted once seen even after its parent
    exits (a launcher that forks workers and returns), identified by pid and start time so a reused pid
    never does. Processes holding a GPU context (NVML's compute processes) count as a job whoever started
    them. A command-line regex (``--job-pattern``) is an explicit opt-in only: matching every process on
    the host counts a ``pip install deepspeed`` as training.
    """

    def __init__(
        self,
        pids: list[int] | None = None,
        pid_file: Path | None = None,
        pattern: str | None = None,
        proc: Path = Path("/proc"),
        own_pid: int | None = None,
    ) -> None:
        self.proc = proc
        self.pid_file = pid_file
        self.pattern = re.compile(pattern) if pattern else None
        self.own_pid = os.getpid() if own_pid is None else own_pid
        self.known: dict[int, int] = {}  # pid -> start ticks of every job process seen alive
        for pid in pids or []:
            self.add(pid)

    def add(self, pid: int) -> None:
        stat = _stat(pid, self.proc)
        if stat is not None and pid != self.own_pid:
            self.known[pid] = stat[1]

    def _registered(self) -> None:
        if self.pid_file is None:
            return
        try:
            lines = self.pid_file.read_text().split()
        except OSError:
            return
        for line in lines:
            if line.isdigit() and int(line) not in self.known:
                self.add(int(line))

    def _table(self) -> dict[int, tuple[int, int]]:
        table = {}
        try:
            entries = [e.name for e in self.proc.iterdir() if e.name.isdigit()]
        except OSError:
            return {}
        for name in entries:
            stat = _stat(int(name), self.proc)
            if stat is not None:
                table[int(name)] = stat
        return table

    def running(self, gpu_pids: set[int] | None = None) -> bool:
        """Whether any job process is alive (pruning the ones gone), or any process holds a GPU."""
        self._registered()
        table = self._table()
        alive = {pid for pid, start in self.known.items() if pid in table and table[pid][1] == start}
        grew = True
        while grew:  # children of job processes are job processes
            grew = False
            for pid, (ppid, start) in table.items():
                if ppid in alive and pid not in alive and pid != self.own_pid:
                    alive.add(pid)
                    self.known[pid] = start
                    grew = True
        self.known = {pid: start for pid, start in self.known.items() if pid in alive}
        if alive or (gpu_pids and gpu_pids - {self.own_pid}):
            return True
        return self.pattern is not None and self._pattern_matches(table)

    def _pattern_matches(self, table: dict[int, tuple[int, int]]) -> bool:
        assert self.pattern is not None
        for pid in table:
            if pid == self.own_pid:
                continue
            try:
                raw = (self.proc / str(pid) / "cmdline").read_bytes()
            except OSError:
                continue
            line = raw.replace(b"\0", b" ").decode(errors="replace").strip()
            if line and self.pattern.search(line):
                return True
        return False


def _unreadable(index: int) -> dict[str, Any]:
    return {"index": index, "utilisation_pct": None, "memory_used_gib": None, "memory_total_gib": None}


# NVML return codes (nvml.h): a query the device does not support, and an empty slot.
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6


def _nvml_code(exc: BaseException) -> int | None:
    return getattr(exc, "value", None)  # pynvml's NVMLError carries the return code


def _read_gpu(nvml: Any, index: int) -> tuple[dict[str, Any], set[int]]:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    try:
        utilisation = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        mig = None
    except Exception as exc:
        # A MIG-enabled GPU (or a slice of one, as some providers rent) has no utilisation figure ("On MIG-enabled
        # GPUs, querying device utilization rates is not currently supported": NVML API reference,
        # nvmlDeviceGetUtilizationRates). That is no failure: the compute processes (on MIG, those of its instances)
        # say whether it is busy, and it reads as 0 %. Any other error leaves its state unknown.
        if _nvml_code(exc) != NVML_ERROR_NOT_SUPPORTED:
            raise
        utilisation, mig = 0.0, _mig_processes(nvml, handle)
    pids = mig if mig is not None else {int(p.pid) for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)}
    status = {
        "index": index,
        "utilisation_pct": utilisation,
        "memory_used_gib": memory.used / 2**30,
        "memory_total_gib": memory.total / 2**30,
    }
    return status, pids


def _mig_processes(nvml: Any, handle: Any) -> set[int] | None:
    """Pids holding a compute context on the GPU's MIG instances (with MIG on, processes run on those, never on the
    GPU itself); None where MIG is off or the card has none."""
    try:
        if nvml.nvmlDeviceGetMigMode(handle)[0] != 1:  # NVML_DEVICE_MIG_ENABLE
            return None
    except Exception as exc:
        if _nvml_code(exc) != NVML_ERROR_NOT_SUPPORTED:  # a card without MIG
            raise
        return None
    pids: set[int] = set()
    for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            instance = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except Exception as exc:
            if _nvml_code(exc) != NVML_ERROR_NOT_FOUND:  # an empty slot
                raise
            continue
        pids |= {int(p.pid) for p in nvml.nvmlDeviceGetComputeRunningProcesses(instance)}
    return pids


def read_gpus(registered: int) -> tuple[list[dict[str, Any]], set[int]]:
    """Each GPU's utilisation and memory (the heartbeat's ``gpus``) and the pids holding a compute context on
    any of them, from NVML. A GPU whose utilisation, memory or processes NVML cannot read is reported with null
    figures, its state unknown; so is each of the ``registered`` GPUs NVML no longer counts. A node that
    registered none (CPU-only) reports none when NVML fails, as before."""
    gpus: list[dict[str, Any]] = []
    pids: set[int] = set()
    # Any failure (an NVMLError, the library gone after an update, a missing symbol) leaves the state unknown,
    # never idle: reported as 0 % with no processes, a failed read let the sweep stop a node mid-run (a probe).
    try:
        import pynvml

        count = pynvml.nvmlDeviceGetCount()
    except Exception:
        return [_unreadable(index) for index in range(registered)], pids
    for index in range(count):
        try:
            status, held = _read_gpu(pynvml, index)
        except Exception:
            status, held = _unreadable(index), set()
        gpus.append(status)
        pids |= held
    gpus.extend(_unreadable(index) for index in range(count, registered))
    return gpus, pids


# Idle seconds of a session `who` calls "old": the most a heartbeat carries (services/nodes/schemas.py
# interactive_idle_s), past every idle window (at most a week, IdlePolicy).
OLD_SESSION_S = 1e9


def parse_who_idle(output: str) -> float | None:
    """Seconds since the most recently active login session, from `who -u` (None: no session).

    `who -u` prints an IDLE column: "." for activity in the last minute, "HH:MM" for older, "old" for
    more than a day (coreutils manual, "who invocation"). "old" is read as idle for good (OLD_SESSION_S): read as
    one day, a forgotten session kept a node whose idle window is longer than a day from ever being stopped (a
    probe of the node lifecycle)."""
    best: float | None = None
    for line in output.splitlines():
        # LOGIN-TIME IDLE PID: the idle field follows the login clock time and precedes the PID.
        match = re.search(r"\d{1,2}:\d{2}\s+(\.|old|\d{1,2}:\d{2})\s+\d+(\s|$)", line)
        if not match:
            continue
        idle = match.group(1)
        if idle == ".":
            seconds = 0.0
        elif idle == "old":
            seconds = OLD_SESSION_S
        else:
            hours, minutes = idle.split(":")
            seconds = int(hours) * 3600.0 + int(minutes) * 60.0
        best = seconds if best is None else min(best, seconds)
    return best


def interactive_idle_s() -> float | None:
    who = shutil.which("who")
    if who is None:
        return None
    try:
        output = subprocess.run([who, "-u"], capture_output=True, text=True, timeout=5, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_who_idle(output)
