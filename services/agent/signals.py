"""What the agent reports as busy signals, read from this machine (Linux /proc and utmp via `who`)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

# Command lines of training jobs: launchers and the trainers' own entry points. A job counts as
# running whatever its GPU does (setup, data download, tokenisation keep the GPU idle).
DEFAULT_JOB_PATTERN = (
    r"torchrun|accelerate(-launch| launch)|deepspeed|tune run|litgpt (finetune|pretrain)|axolotl|"
    r"python\S* .*(train|finetune|sft|dpo)\S*\.py"
)


def job_running(pattern: str, proc: Path = Path("/proc"), own_pid: int | None = None) -> bool:
    """Whether any process's command line matches ``pattern`` (this process excluded)."""
    regex = re.compile(pattern)
    own = os.getpid() if own_pid is None else own_pid
    try:
        entries = list(proc.iterdir())
    except OSError:
        return False
    for entry in entries:
        if not entry.name.isdigit() or int(entry.name) == own:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if cmdline and regex.search(cmdline):
            return True
    return False


def parse_who_idle(output: str) -> float | None:
    """Seconds since the most recently active login session, from `who -u` (None: no session).

    `who -u` prints an IDLE column: "." for activity in the last minute, "HH:MM" for older, "old" for
    more than a day (coreutils manual, "who invocation")."""
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
            seconds = 86_400.0
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
