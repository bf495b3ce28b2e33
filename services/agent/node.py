"""The run side of `gpuplan agent`: busy signals, checkpoint sync on a schedule, and the node-side
guard that stops an idle machine when the control plane has been unreachable for too long.

The sync runs in a background thread so heartbeats go on during a long upload (and report it as
busy). On SIGTERM (what the ``local`` provider driver sends) the agent runs a final sync, heartbeating meanwhile, and
exits; non-zero when that sync failed.
"""

from __future__ import annotations

import json
import logging
import math
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from services.agent.signals import JobWatch, interactive_idle_s
from services.core.json_limits import INT32_MAX
from services.nodes.idle import IdlePolicy, Signals, gpu_reading, next_idle_since
from services.runs.client import RunApi, RunApiError
from services.runs.sync import (
    BucketOnly,
    ControlPlane,
    SyncError,
    SyncOptions,
    SyncResult,
    checkpoint_dirs,
    pending_steps,
    sync_pass,
    wait_settled,
)

log = logging.getLogger("gpuplan.agent")


@dataclass
class RunSync:
    """What the agent syncs: a run's checkpoint directory into the run's bucket and prefix."""

    api: RunApi
    s3: Any
    bucket: str
    prefix: str
    checkpoint_dir: Path
    options: SyncOptions = field(default_factory=SyncOptions)
    interval_s: float = 60.0
    durable: set[int] = field(default_factory=set)
    deleted: set[int] = field(default_factory=set)
    last_error: str | None = None
    failing_since: datetime | None = None  # the first failed pass of the current streak
    in_progress: dict[int, str] = field(default_factory=dict)  # from the last pass: not complete yet
    changed: dict[int, list[str]] = field(default_factory=dict)  # durable steps whose local files changed
    lost: dict[int, str] = field(default_factory=dict)  # durable steps whose objects the bucket lost for good
    refused: dict[int, str] = field(default_factory=dict)  # complete steps the bucket cannot hold as they are

    def pass_once(self, control: ControlPlane, final: bool = False) -> SyncResult:
        result = sync_pass(
            self.s3, self.bucket, self.prefix, self.api.run_id, self.checkpoint_dir, control, self.options, final=final
        )
        self.durable.update(u.manifest.step for u in result.uploaded)
        self.durable.update(result.already_durable)
        self.deleted.update(result.deleted)
        # A lost step (its manifest damaged, its objects gone) is not durable: where it is the newest, the node holds
        # the only copy a resume could take, and is kept, as for a changed one.
        self.durable.difference_update(result.deleted, result.lost)
        # The agent log says when a checkpoint starts or stops waiting, and when a durable one's local
        # files changed: once per change, not every pass.
        for step, reason in result.in_progress.items():
            if self.in_progress.get(step) != reason:
                log.info("checkpoint step %d in progress (kept unsynced): %s", step, reason)
        for step, files in result.changed.items():
            if self.changed.get(step) != files:
                log.warning("checkpoint step %d changed locally after it was made durable: %s", step, files)
        for step, files in result.repaired.items():
            log.warning("checkpoint step %d: the bucket had lost %s; put back from the local copy", step, files)
        for step, reason in result.refused.items():
            if self.refused.get(step) != reason:
                log.warning("checkpoint step %d is complete but not stored: %s", step, reason)
        self.in_progress, self.changed, self.lost = dict(result.in_progress), dict(result.changed), dict(result.lost)
        self.refused = dict(result.refused)
        return result

    def _unsynced_steps(self) -> set[int]:
        # Not durable yet (in progress included), and durable steps whose local files differ from the bucket's copy
        # (resumed from an older step, training wrote that step anew): the node holds what the bucket does not.
        return set(pending_steps(self.checkpoint_dir, self.durable, self.deleted)) | set(self.changed)

    def unsynced(self) -> int:
        """Local checkpoints the bucket does not hold: the node is kept while any."""
        return len(self._unsynced_steps())

    def pending_bytes(self) -> int:
        """Bytes of the local checkpoints the bucket does not hold (what a lost node would lose)."""
        try:
            folders = dict(checkpoint_dirs(self.checkpoint_dir))
        except SyncError:
            return 0
        total = 0
        for step in sorted(self._unsynced_steps()):
            for path in folders[step].rglob("*") if step in folders else ():
                try:
                    total += path.stat().st_size if path.is_file() else 0
                except OSError:
                    continue  # removed while counting
        return total

    def failed(self, error: str, at: datetime | None = None) -> None:
        self.last_error = error
        if self.failing_since is None:
            self.failing_since = at or datetime.now(UTC)

    def succeeded(self) -> None:
        """A pass ended without an error. Durable steps the bucket lost for good, complete steps it cannot hold as
        they are (a file name, the step), and durable steps whose local files changed are still reported as the
        sync's error (an alert once it lasts): only a person can act on them (restore an older step; rename the file
        or folder; resume into a new output directory, or a new run)."""
        if self.lost:
            self.failed("; ".join(self.lost[step] for step in sorted(self.lost)))
            return
        if self.refused:
            refused = sorted(self.refused)
            self.failed("; ".join(f"step {step}: complete, but not stored ({self.refused[step]})" for step in refused))
            return
        if self.changed:
            steps = ", ".join(str(step) for step in sorted(self.changed))
            self.failed(
                f"local checkpoint step(s) {steps} differ from their durable copies in the bucket and are not "
                "uploaded over them: the node is kept; train into a new output directory or start a new run"
            )
            return
        self.last_error = None
        self.failing_since = None

    def health(self) -> dict[str, Any]:
        """The heartbeat's ``sync`` report (services/nodes/schemas.py SyncHealth)."""
        return {
            "last_error": self.last_error[:2000] if self.last_error else None,
            "pending_bytes": self.pending_bytes(),
            "failing_since": self.failing_since.isoformat() if self.failing_since else None,
        }


def read_progress(checkpoint_dir: Path) -> tuple[int | None, float | None]:
    """Training progress: ``gpuplan_progress.json`` ({"step": n, "loss": x}) in the checkpoint directory
    if the training script writes one, else the newest checkpoint's transformers trainer_state.json."""
    if not checkpoint_dir.is_dir():
        return None, None
    try:
        explicit = checkpoint_dir / "gpuplan_progress.json"
        if explicit.is_file():
            data = json.loads(explicit.read_text())
            return _reportable(int(data["step"]), float(data["loss"]) if data.get("loss") is not None else None)
        dirs = checkpoint_dirs(checkpoint_dir)
        if dirs:
            state = dirs[-1][1] / "trainer_state.json"
            if state.is_file():
                data = json.loads(state.read_text())
                losses = [e["loss"] for e in data.get("log_history", []) if "loss" in e]
                return _reportable(int(data.get("global_step", dirs[-1][0])), float(losses[-1]) if losses else None)
            return _reportable(dirs[-1][0], None)
    except (OSError, ValueError, KeyError, TypeError):
        log.debug("unreadable progress in %s", checkpoint_dir)
    return None, None


def _reportable(step: int, loss: float | None) -> tuple[int | None, float | None]:
    """Progress as the heartbeat can carry it (services/nodes/schemas.py RunProgress): a diverged run's NaN or
    infinite loss (the Trainer logs NaN) and a step out of range are sent as unknown. JSON has no NaN, so one sent
    as it was failed the heartbeat's encoding, and the exception ended the agent (a probe of the node lifecycle);
    a step out of range had every heartbeat refused."""
    return (step if 0 <= step <= INT32_MAX else None), (loss if loss is not None and math.isfinite(loss) else None)


class NodeGuard:
    """Decides, on the node, when to stop itself: idle (the same busy signals and threshold as the
    control plane) past the threshold *and* the control plane unreachable for ``unreachable_after_s``."""

    def __init__(self, policy: IdlePolicy, unreachable_after_s: float, clock: Callable[[], float] = time.time) -> None:
        self.policy = policy
        self.unreachable_after_s = unreachable_after_s
        self.clock = clock
        self.last_contact = clock()
        self.idle_since: datetime | None = None

    def contact(self) -> None:
        self.last_contact = self.clock()

    def observe(self, signals: Signals) -> None:
        now = datetime.fromtimestamp(self.clock(), UTC)
        self.idle_since = next_idle_since(self.idle_since, signals, self.policy, now)

    def should_stop(self) -> str | None:
        """The reason to stop now, or None."""
        now = self.clock()
        unreachable = now - self.last_contact
        if unreachable < self.unreachable_after_s or self.idle_since is None:
            return None
        idle_min = (now - self.idle_since.timestamp()) / 60
        if idle_min < self.policy.idle_minutes:
            return None
        return (
            f"idle {idle_min:.0f} min >= {self.policy.idle_minutes:g} min and the control plane unreachable for "
            f"{unreachable / 60:.0f} min >= {self.unreachable_after_s / 60:.0f} min"
        )


def local_signals(
    jobs: JobWatch,
    calibrating: bool,
    uploading: bool,
    unsynced: int,
    gpus: list[dict[str, Any]],
    gpu_pids: set[int] | None = None,
) -> Signals:
    """The busy signals of this node, from its GPUs and their processes as ``read_gpus`` returned them."""
    utilisation, readable = gpu_reading(gpus)
    return Signals(
        job_running=calibrating or jobs.running(gpu_pids),
        gpu_utilisation_pct=utilisation,
        gpu_readable=readable,
        uploading=uploading,
        interactive_idle_s=interactive_idle_s(),
        unsynced_checkpoints=unsynced,
    )


def stop_machine(command: list[str] | None) -> None:
    """Stop this machine with the configured command (e.g. ``sudo shutdown -h now``); without one, the
    agent exits, which stops machines whose provider ties them to their main process."""
    if command:
        log.warning("stopping this machine: %s", " ".join(command))
        subprocess.run(command, check=False, timeout=120)


class Syncer:
    """Runs sync passes in a background thread, one at a time, marking the node as uploading while one has local
    checkpoints to upload."""

    def __init__(self, run: RunSync) -> None:
        self.run = run
        self.uploading = False
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._finishing = False  # the final sync runs: no other pass starts
        self.last_started = 0.0

    def due(self, now: float) -> bool:
        return now - self.last_started >= self.run.interval_s

    def start(self, control: ControlPlane, final: bool = False) -> bool:
        with self._lock:
            if self._finishing or (self._thread is not None and self._thread.is_alive()):
                return False
            self.last_started = time.time()
            self._thread = threading.Thread(target=self._pass, args=(control, final), daemon=True)
            # Uploading only with something to upload: a pass that only checks the bucket (slow or unreachable,
            # each pass outlasting a heartbeat) kept an idle node from ever being stopped (a probe of stop 50).
            self.uploading = self.run.unsynced() > 0
            self._thread.start()
            return True

    def _pass(self, control: ControlPlane, final: bool, what: str = "sync pass") -> None:
        try:
            self.run.pass_once(control, final)
            self.run.succeeded()
        except Exception as exc:  # logged, reported with the next heartbeat, and retried at the next interval
            self.run.failed(f"{type(exc).__name__}: {exc}")
            log.warning("%s failed: %s", what, self.run.last_error)
        finally:
            self.uploading = False

    def wait(self, timeout_s: float | None = None) -> None:
        thread = self._thread
        if thread is not None:
            thread.join(timeout_s)

    def final(
        self, reachable: bool, heartbeat: Callable[[], object] | None = None, interval_s: float = 30.0
    ) -> str | None:
        """A last pass, in this thread, after any running one: through the API when it answers, else against the
        bucket alone (the API learns of those checkpoints at the next pass that reaches it). ``heartbeat`` runs every
        ``interval_s`` from a thread meanwhile: a long final upload went unheard, and the node was marked lost.
        Returns None when the pass ended without an error, else the line it logged (the agent's exit fails on it)."""
        with self._lock:
            self._finishing = True  # a heartbeat's "sync" command starts no pass beside this one
        end = (
            every(heartbeat, interval_s, "heartbeat during the final sync", "gpuplan-final-heartbeats")
            if heartbeat is not None
            else None
        )
        unsettled: list[int] = []
        try:
            self.wait()
            self.uploading = self.run.unsynced() > 0
            if reachable:
                try:
                    unsettled = self._settled_pass(self.run.api)
                    self.run.succeeded()
                except RunApiError as exc:
                    log.warning("final sync: the service is unreachable (%s); syncing to the bucket alone", exc)
                    reachable = False
                except Exception as exc:
                    # The bucket or the folder failed it (S3 down, no checkpoint folder): one line and a failing
                    # exit, not a traceback out of the SIGTERM handling.
                    self.run.failed(f"{type(exc).__name__}: {exc}")
            if not reachable:
                try:
                    unsettled = self._settled_pass(BucketOnly(self.run.s3, self.run.bucket, self.run.prefix))
                    self.run.succeeded()
                except Exception as exc:
                    self.run.failed(f"{type(exc).__name__}: {exc}")
        finally:
            self.uploading = False
            if end is not None:
                end()
        if self.run.last_error is not None:
            why = self.run.last_error
        elif unsettled:
            why = f"step(s) {unsettled} still written to after {self.run.options.settle_s:g} s"
        else:
            return None
        line = (
            f"final sync failed: {why}; {self.run.unsynced()} local checkpoint(s), "
            f"{self.run.pending_bytes() / 2**20:.1f} MiB, not made durable in {self.run.checkpoint_dir}"
        )
        log.error("%s", line)
        return line

    def _settled_pass(self, control: ControlPlane) -> list[int]:
        """A pass, and where a complete checkpoint was too new to count as settled (``SyncOptions.settle_s``), another
        once it has settled, waiting at most that long: the node is going away, and a checkpoint the final sync
        skipped went with it while the agent exited 0. Returns the steps still unsettled."""
        unsettled = self.run.pass_once(control).unsettled
        if not unsettled:
            return []
        if not wait_settled(self.run.checkpoint_dir, unsettled, self.run.options.settle_s):
            return unsettled
        return self.run.pass_once(control).unsettled


def _every(call: Callable[[], object], interval_s: float, done: threading.Event, what: str) -> None:
    """``call`` now and every ``interval_s`` until ``done`` is set; one that raises is logged, the next one made."""
    while True:
        try:
            call()
        except Exception as exc:
            log.warning("%s failed: %s: %s", what, type(exc).__name__, exc)
        if done.wait(interval_s):
            return


def every(call: Callable[[], object], interval_s: float, what: str, name: str) -> Callable[[], None]:
    """Start calling ``call`` now and every ``interval_s`` from a thread; returns what ends it (and waits for a call
    in flight: bounded, as a heartbeat in flight ends within the HTTP client's timeout)."""
    done = threading.Event()
    thread = threading.Thread(target=_every, args=(call, interval_s, done, what), name=name, daemon=True)
    thread.start()

    def end() -> None:
        done.set()
        thread.join()

    return end
