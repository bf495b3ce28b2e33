"""Busy detection follows the training job's process tree (and GPU contexts), not a regex over the host."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest

from services.agent.node import local_signals
from services.agent.signals import JOB_PID_FILE, JobWatch


def _proc(root: Path, pid: int, ppid: int, cmd: bytes, start: int = 100, state: str = "S") -> None:
    entry = root / str(pid)
    entry.mkdir(exist_ok=True)
    # /proc/<pid>/stat: pid (comm) state ppid ... field 22 is the start time (proc(5)).
    rest = [state, str(ppid)] + ["0"] * 17 + [str(start)] + ["0"] * 5
    (entry / "stat").write_text(f"{pid} (some name) {' '.join(rest)}\n")
    (entry / "cmdline").write_bytes(cmd)


def _gone(root: Path, pid: int) -> None:
    for child in (root / str(pid)).iterdir():
        child.unlink()
    (root / str(pid)).rmdir()


def test_a_host_process_that_merely_names_a_framework_is_not_a_job(tmp_path: Path) -> None:
    _proc(tmp_path, 10, 1, b"pip\0install\0deepspeed\0axolotl")
    _proc(tmp_path, 11, 1, b"torchrun\0--nproc-per-node=8\0train.py")  # someone else's, not this node's job
    watch = JobWatch(proc=tmp_path, own_pid=1)
    assert not watch.running()
    # The regex is an explicit opt-in, and then it means what it says.
    assert JobWatch(proc=tmp_path, own_pid=1, pattern=r"torchrun").running()


def test_the_launched_job_and_its_children_keep_the_node_busy_until_the_last_exits(tmp_path: Path) -> None:
    _proc(tmp_path, 20, 1, b"bash\0setup.sh")  # a launcher gpuplan knows nothing about: long setup
    watch = JobWatch(pids=[20], proc=tmp_path, own_pid=1)
    assert watch.running()
    _proc(tmp_path, 21, 20, b"python\0-m\0my_trainer")  # it forks the trainer
    _proc(tmp_path, 22, 21, b"python\0-c\0worker")
    assert watch.running()
    _gone(tmp_path, 20)  # the launcher returns; the trainer (re-parented to init) goes on
    _proc(tmp_path, 21, 1, b"python\0-m\0my_trainer")
    _proc(tmp_path, 22, 1, b"python\0-c\0worker")
    assert watch.running()
    _gone(tmp_path, 21)
    assert watch.running()  # one worker left
    _proc(tmp_path, 22, 1, b"python\0-c\0worker", state="Z")  # a zombie has done its work
    assert not watch.running()
    # A new process that reuses a watched pid (another start time) is not the job.
    _proc(tmp_path, 22, 1, b"sleep\0999", start=999)
    assert not watch.running()


def test_pids_a_script_registers_in_the_checkpoint_folder_count(tmp_path: Path) -> None:
    proc, ckpt = tmp_path / "proc", tmp_path / "out"
    proc.mkdir()
    ckpt.mkdir()
    _proc(proc, 30, 1, b"python\0loop.py")
    watch = JobWatch(pid_file=ckpt / JOB_PID_FILE, proc=proc, own_pid=1)
    assert not watch.running()
    (ckpt / JOB_PID_FILE).write_text("30\nnot-a-pid\n")
    assert watch.running()
    _gone(proc, 30)
    assert not watch.running()


def test_a_gpu_context_is_a_job_whoever_started_it(tmp_path: Path) -> None:
    watch = JobWatch(proc=tmp_path, own_pid=1)
    assert watch.running(gpu_pids={4242})
    assert not watch.running(gpu_pids={1})  # the agent's own calibration context is reported as calibrating
    assert not watch.running(gpu_pids=set())


def test_a_real_process_tree_on_this_machine() -> None:
    # A shell that starts a child and exits before it: the child keeps the job running.
    launcher = subprocess.Popen(["sh", "-c", "sleep 3 & echo $! ; sleep 0.5"], stdout=subprocess.PIPE, text=True)
    watch = JobWatch(pids=[launcher.pid])
    assert launcher.stdout is not None
    child = int(launcher.stdout.readline())
    assert watch.running() and child in watch.known
    launcher.wait(10)
    assert watch.running()  # the launcher is reaped, its child lives on
    signals = local_signals(watch, calibrating=False, uploading=False, unsynced=0, gpus=[])
    assert signals.job_running
    deadline = time.monotonic() + 15
    while watch.running() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not watch.running()


def test_gpuplan_agent_launches_the_job_after_a_double_dash(tmp_path: Path) -> None:
    from services.agent.agent import Agent
    from services.cli.main import build_parser

    args = build_parser().parse_args(["agent", "--api", "http://x", "--", sys.executable, "-c", "pass"])
    assert args.job == ["--", sys.executable, "-c", "pass"]
    agent = Agent(client=None, key="k")  # type: ignore[arg-type]
    pid = agent.launch([sys.executable, "-c", "import time; time.sleep(1)"])
    assert agent.jobs.running() and pid in agent.jobs.known
    assert agent.job is not None
    agent.job.wait(10)
    agent._reap_job()
    assert not agent.jobs.running()
    assert agent.job is None


@pytest.mark.parametrize(("code", "level"), [(0, logging.INFO), (3, logging.WARNING)])
def test_a_jobs_exit_is_a_warning_only_when_it_failed(code: int, level: int, caplog: pytest.LogCaptureFixture) -> None:
    # `gpuplan agent` shows its INFO lines: a job that finished well was reported as "warning: job N exited".
    from services.agent.agent import Agent

    agent = Agent(client=None, key="k")  # type: ignore[arg-type]
    agent.launch([sys.executable, "-c", f"raise SystemExit({code})"])
    assert agent.job is not None
    agent.job.wait(10)
    with caplog.at_level(logging.INFO, logger="gpuplan.agent"):
        agent._reap_job()
    (record,) = [r for r in caplog.records if "exited with status" in r.getMessage()]
    assert record.levelno == level and record.getMessage().endswith(f"status {code}")
