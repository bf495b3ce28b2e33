"""A data set check in a child process with a capped address space, so that a file the readers' limits
miss kills the check and not the API process (the embedded default runs tasks in it) or the worker.

The parent starts `python -m services.datasets.isolation LIMIT`, writes the job to its stdin (pickle:
parent to child only, the child never sends pickles) and reads JSON lines from its stdout: progress,
then the report or an error. The child caps itself with RLIMIT_AS before it reads anything (setrlimit(2);
subprocess, not fork, since the parent has threads). A plain subprocess rather than multiprocessing:
Celery's prefork workers are daemonic, and multiprocessing refuses children there.
"""

from __future__ import annotations

import json
import os
import pickle
import resource
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from botocore.exceptions import BotoCoreError, ClientError

from services.core.settings import Settings
from services.datacheck import DataCheckError, Limits, check_source, counter_from_json, size_text
from services.datasets.storage import S3RowSource, s3_client, storage_error

TOKENIZER_MAX_BYTES = 64 * 2**20
# The report is small (each list holds at most max_listed rows); a longer line is not a report.
MAX_MESSAGE_BYTES = 64 * 2**20
_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class CheckJob:
    """One uploaded file to check, and where it is."""

    settings: Settings
    label: str
    file_format: str
    gzipped: bool
    size_bytes: int
    bucket: str
    key: str
    tokenizer_key: str | None
    max_listed: int
    model: str | None = None  # counted with this model's Hub tokenizer unless a tokenizer.json was uploaded


def limits_from(settings: Settings) -> Limits:
    """The check's Limits from the GPUPLAN_DATACHECK_* settings."""
    return Limits(
        record_bytes=settings.datacheck_max_record_bytes,
        cell_bytes=settings.datacheck_max_cell_bytes,
        column_chunk_bytes=settings.datacheck_max_column_chunk_bytes,
        row_group_bytes=settings.datacheck_max_row_group_bytes,
        expansion_ratio=settings.datacheck_expansion_ratio,
        expansion_floor_bytes=settings.datacheck_expansion_floor_bytes,
    )


def run_job(job: CheckJob, progress: Callable[[int, int], None]) -> dict[str, Any]:
    """Check the file in this process: the report as stored (JSON), or DataCheckError / a storage error."""
    client = s3_client(job.settings)
    counter, tokenizer = None, None
    if job.tokenizer_key is not None:
        body = client.get_object(Bucket=job.bucket, Key=job.tokenizer_key)["Body"]
        counter = counter_from_json(body.read(TOKENIZER_MAX_BYTES + 1).decode("utf-8"), "the uploaded tokenizer.json")
    elif job.model is not None:
        # The worker's Hub settings (HF_ENDPOINT, HF_TOKEN, GPUPLAN_HUB_*) and its disk cache.
        from services.hub.models import HubSettings
        from services.hub.tokenizer import model_counter

        counter, tokenizer = model_counter(job.model, settings=HubSettings.from_environment())
    source = S3RowSource(
        client,
        job.bucket,
        job.key,
        job.file_format,
        job.gzipped,
        job.size_bytes,
        limits=limits_from(job.settings),
        label=job.label,
    )
    report = check_source(
        source,
        label=job.label,
        file_format=job.file_format,
        counter=counter,
        progress=progress,
        max_listed=job.max_listed,
        tokenizer=tokenizer,
        model=job.model,  # its chat template's default system prompt (datacheck.training), also with an upload
    )
    data = report.model_dump(mode="json")
    data.pop("path", None)
    return data


def out_of_memory(limit_bytes: int) -> str:
    return (
        f"out of memory for the check: it needed more than its {size_text(limit_bytes)} memory limit "
        "(GPUPLAN_DATACHECK_MEMORY_LIMIT_BYTES)"
    )


def run_in_child(
    job: CheckJob, progress: Callable[[int, int], None], memory_limit_bytes: int, time_limit_s: float
) -> dict[str, Any]:
    """Run the check in a child process capped at `memory_limit_bytes` and `time_limit_s`: the report,
    or DataCheckError with a readable reason (the limit it ran out of, the error it met)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.datasets.isolation", str(memory_limit_bytes)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        close_fds=True,
    )
    timed_out = threading.Event()

    def kill() -> None:
        timed_out.set()
        proc.kill()

    timer = threading.Timer(time_limit_s, kill)
    timer.daemon = True
    timer.start()
    result: dict[str, Any] | None = None
    try:
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(pickle.dumps(job))
            proc.stdin.close()
        except BrokenPipeError:
            pass  # the child died at once; its exit status says why
        while True:
            line = proc.stdout.readline(MAX_MESSAGE_BYTES)
            if not line:
                break
            try:
                message = json.loads(line)
            except json.JSONDecodeError:
                proc.kill()
                raise DataCheckError("internal error while checking: the check process sent a broken answer") from None
            if "progress" in message:
                done, total = message["progress"]
                progress(int(done), int(total))
            else:
                result = message
        code = proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if timed_out.is_set():
        raise DataCheckError(f"the check ran past its time limit of {time_limit_s:g} s (GPUPLAN_TASK_TIME_LIMIT_S)")
    if result is not None and "report" in result:
        report: dict[str, Any] = result["report"]
        return report
    if result is not None and "error" in result:
        raise DataCheckError(str(result["error"]))
    how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
    raise DataCheckError(f"the check process {how} without an answer: most likely {out_of_memory(memory_limit_bytes)}")


def _child(argv: list[str], stdin: IO[bytes], out: IO[str]) -> int:
    limit = int(argv[0])
    if limit:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    oom = out_of_memory(limit)  # formatted now: there may be no memory for it later
    job: CheckJob = pickle.load(stdin)

    def progress(done: int, total: int) -> None:  # every PROGRESS_EVERY_ROWS rows; the parent throttles
        out.write(json.dumps({"progress": [done, total]}) + "\n")
        out.flush()

    answer: dict[str, Any] | None = None
    ran_out = False
    try:
        answer = {"report": run_job(job, progress)}
    except MemoryError:
        ran_out = True  # answered below, once the frames holding the data are gone
    except (DataCheckError, ValueError) as exc:
        answer = {"error": str(exc)}
    except (ClientError, BotoCoreError) as exc:
        answer = {"error": storage_error(exc)}
    except Exception as exc:
        traceback.print_exc()
        answer = {"error": f"internal error while checking: {type(exc).__name__}"}
    if ran_out:
        answer = {"error": oom}
    out.write(json.dumps(answer) + "\n")
    out.flush()
    return 0


if __name__ == "__main__":
    # The answer goes to a copy of stdout; anything else printed goes to stderr.
    channel = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.exit(_child(sys.argv[1:], sys.stdin.buffer, channel))
