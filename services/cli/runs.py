"""`gpuplan sync`, `gpuplan restore` and the agent's run options: thin edges over services/runs."""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from pathlib import Path
from typing import Any

import httpx
from botocore.exceptions import BotoCoreError, ClientError

from services.agent.signals import JOB_PID_FILE
from services.cli.common import (
    CliError,
    Subparsers,
    add_api_option,
    add_key_options,
    api_key,
    float_arg,
    id_arg,
    int_arg,
)
from services.core.errors import ConfigurationError
from services.runs.client import RunApi, RunApiError
from services.runs.restore import RestoreError, restore_checkpoint
from services.runs.retention import StoredCheckpoint, best_step
from services.runs.sync import (
    BucketOnly,
    SyncError,
    SyncOptions,
    checkpoint_dirs,
    read_manifest,
    stored_steps,
    sync_pass,
    wait_settled,
)
from services.storage.s3 import make_s3_client

MiB = 2**20
# The largest pid Linux gives (PID_MAX_LIMIT, the most /proc/sys/kernel/pid_max takes). --job-pid 0 or 99999999999
# names no process: it was accepted, and the job it meant to keep the node busy was never watched.
PID_MAX = 2**22


def _connection(parser: argparse.ArgumentParser) -> None:
    add_api_option(parser)
    add_key_options(parser)
    parser.add_argument(
        "--run", type=id_arg("--run"), required=True, metavar="ID", help="the run (POST /v1/plans/{id}/runs)"
    )


def register(sub: Subparsers) -> None:
    sync = sub.add_parser("sync", help="one checkpoint sync pass to the run's bucket (what the agent does)")
    _connection(sync)
    sync.add_argument("--dir", required=True, metavar="DIR", help="the trainer's output directory")
    sync.add_argument("--final", action="store_true", help="mark the newest checkpoint as the run's final one")
    sync.add_argument(
        "--settle-s",
        type=float_arg("--settle-s", 0),
        default=60.0,
        metavar="S",
        help="also wait until a complete checkpoint has been quiet for S seconds",
    )
    sync.add_argument(
        "--part-mib",
        # S3 takes parts of 5 MiB to 5 GiB (docs.aws.amazon.com/AmazonS3/latest/userguide/qfacts.html): below 5 is
        # read as 5; above 5,120 every file past it would fail each pass on S3 (moto does not check).
        type=int_arg("--part-mib", 0, 5120),
        default=64,
        metavar="MIB",
        help="multipart part size in MiB (5 to 5120, S3's limits; smaller values are read as 5)",
    )
    sync.add_argument("--json", action="store_true")
    # cmd_sync prints these outcomes of the pass itself (stdout, lost steps as its own error line); a refused step's
    # warning stays the stderr line of its failing exit.
    sync.set_defaults(handler=cmd_sync, log_printed=("in_progress", "changed", "repaired", "lost"))

    restore = sub.add_parser("restore", help="download and verify a durable checkpoint of a run")
    _connection(restore)
    restore.add_argument("--to", required=True, metavar="DIR", help="where to put the checkpoint directory")
    which = restore.add_mutually_exclusive_group()
    which.add_argument("--step", type=int_arg("--step", 0), metavar="N", help="this step (default: the latest)")
    which.add_argument("--best", action="store_true", help="the best by the reported evaluation metric")
    restore.add_argument(
        "--from-bucket",
        action="store_true",
        help="choose from the manifests in the bucket (a checkpoint the node made durable "
        "while the service was unreachable)",
    )
    restore.set_defaults(handler=cmd_restore)


def _regex(value: str) -> str:
    try:
        re.compile(value)
    except re.error as exc:
        raise argparse.ArgumentTypeError(f"not a regular expression ({exc})") from None
    return value


def add_agent_options(agent: argparse.ArgumentParser) -> None:
    agent.add_argument(
        "--instance-id",
        help="the provider's id of this machine, for the server's stop driver (EC2, RunPod, Lambda, Vast.ai, http)",
    )
    agent.add_argument(
        "--run", type=id_arg("--run"), metavar="ID", help="sync this run's checkpoints and report its progress"
    )
    agent.add_argument("--checkpoint-dir", metavar="DIR", help="the trainer's output directory (default: the run's)")
    agent.add_argument("--sync-interval", type=float_arg("--sync-interval", 0), default=60.0, metavar="S")
    agent.add_argument("--settle-s", type=float_arg("--settle-s", 0), default=60.0, metavar="S")
    agent.add_argument(
        "--idle-minutes",
        # IdlePolicy's bounds: beyond 7 days the guard failed to start; below 1 minute it was read as 1, silently.
        type=float_arg("--idle-minutes", 1, 7 * 24 * 60),
        default=15.0,
        metavar="M",
        help="node-side guard: idle this long ...",
    )
    agent.add_argument(
        "--unreachable-minutes",
        type=float_arg("--unreachable-minutes", 0),
        default=30.0,
        metavar="M",
        help="... while the service is unreachable this long: final sync, then stop",
    )
    agent.add_argument(
        "--stop-command",
        metavar="CMD",
        help="how the guard stops this machine, e.g. 'sudo shutdown -h now' (default: exit)",
    )
    agent.add_argument(
        "--job-pid",
        type=int_arg("--job-pid", 1, PID_MAX),
        action="append",
        default=[],
        metavar="PID",
        help="a training job's process: it and its children keep the node busy (repeatable); a script can "
        f"also write its pids to {JOB_PID_FILE} in the checkpoint folder",
    )
    agent.add_argument(
        "--job-pattern",
        type=_regex,
        metavar="REGEX",
        help="opt-in: any process on the host whose command line matches counts as a running job",
    )
    agent.add_argument(
        "job",
        nargs=argparse.REMAINDER,
        metavar="-- CMD ...",
        help="launch the training job (after --): its process tree keeps the node busy while it runs",
    )


def _s3() -> Any:
    """The S3 client from the GPUPLAN_S3_* settings; a bad one is one line naming it."""
    from services.cli.server import load_settings

    try:
        return make_s3_client(load_settings())
    except ConfigurationError as exc:
        raise CliError(exc.message) from None


def _run_info(api: RunApi) -> dict[str, Any]:
    try:
        return api.run()
    except RunApiError as exc:
        raise CliError(str(exc)) from None


def cmd_sync(args: argparse.Namespace) -> int:
    options = SyncOptions(
        part_size=max(5, args.part_mib) * MiB, multipart_threshold=max(5, args.part_mib) * MiB, settle_s=args.settle_s
    )
    with httpx.Client(base_url=args.api, timeout=60) as client:
        api = RunApi(client, api_key(args, args.command), args.run)
        run = _run_info(api)
        s3, root = _s3(), Path(args.dir)
        try:
            result = sync_pass(s3, run["bucket"], run["prefix"], args.run, root, api, options, final=args.final)
            if args.final and result.unsettled and wait_settled(root, result.unsettled, args.settle_s):
                # After training: what is still being written settles within --settle-s, and is made durable then (a
                # final pass that skipped it exited 0, the finished model left behind: a lifecycle probe).
                earlier = result
                result = sync_pass(s3, run["bucket"], run["prefix"], args.run, root, api, options, final=True)
                result.uploaded[:0] = earlier.uploaded
                result.deleted[:0] = earlier.deleted
                result.repaired = {**earlier.repaired, **result.repaired}
            newest = max((step for step, _ in checkpoint_dirs(root)), default=None) if args.final else None
        except (SyncError, RunApiError) as exc:
            raise CliError(f"sync: {exc}; nothing local was touched, run it again to resume") from None
        except (BotoCoreError, ClientError) as exc:  # credentials, connection and store errors
            raise CliError(f"sync: {exc}; run it again to resume") from None
        except OSError as exc:  # the checkpoint folder unreadable
            raise CliError(f"sync: {exc.filename or args.dir}: {exc.strerror or exc}") from None
    uploaded = [u.manifest.step for u in result.uploaded]
    if args.json:
        import json

        print(
            json.dumps(
                {
                    "uploaded": uploaded,
                    "already_durable": result.already_durable,
                    "unsettled": result.unsettled,
                    "in_progress": {str(k): v for k, v in result.in_progress.items()},
                    "changed": {str(k): v for k, v in result.changed.items()},
                    "superseded": result.superseded,
                    "deleted": result.deleted,
                    "repaired": {str(k): v for k, v in result.repaired.items()},
                    "lost": {str(k): v for k, v in result.lost.items()},
                    "refused": {str(k): v for k, v in result.refused.items()},
                }
            )
        )
    else:
        for upload in result.uploaded:
            sent = upload.bytes_sent / MiB
            print(
                f"step {upload.manifest.step}: durable ({len(upload.files)} files, "
                f"{upload.manifest.total_bytes / MiB:.1f} MiB, {sent:.1f} MiB sent, {upload.seconds:.1f} s)"
            )
        for step, reason in result.in_progress.items():
            print(f"step {step}: in progress, not complete yet ({reason})")
        for step, reason in result.refused.items():
            print(f"step {step}: complete, but not stored ({reason})")
        if result.unsettled:
            print(f"still being written (next pass): steps {result.unsettled}")
        for step, files in result.changed.items():
            print(f"step {step}: local files changed after it was made durable ({', '.join(files[:5])}); "
                  "the bucket keeps the verified upload")  # fmt: skip
        if result.deleted:
            print(f"retention deleted from the bucket: steps {result.deleted}")
        for step, files in result.repaired.items():
            print(f"step {step}: the bucket had lost {', '.join(files[:5])}; put back from the local copy")
        if not uploaded and not result.repaired and not result.refused and not result.lost:
            print("nothing new to sync")  # a lost step is the stderr line below, and the exit's failure
    for reason in result.lost.values():
        print(f"gpuplan sync: {reason}", file=sys.stderr)
    durable = {*result.already_durable, *uploaded}
    if newest is not None and newest not in durable:
        why = result.in_progress.get(newest) or result.refused.get(newest) or result.lost.get(newest)
        if why is None:
            why = f"still written to after {args.settle_s:g} s" if newest in result.unsettled else "not uploaded"
        print(f"gpuplan sync: --final: the newest checkpoint, step {newest}, is not durable ({why})", file=sys.stderr)
        return 1
    # A refused step is also logged (a warning on stderr, as the agent shows it), so it is printed here only on stdout;
    # the pass's other logged outcomes are left out of the log (register: log_printed), printed here alone.
    return 1 if result.lost or result.refused else 0


def cmd_restore(args: argparse.Namespace) -> int:
    with httpx.Client(base_url=args.api, timeout=60) as client:
        api = RunApi(client, api_key(args, args.command), args.run)
        run = _run_info(api)
        s3 = _s3()
        try:
            if args.from_bucket:
                step = args.step if args.step is not None else _bucket_step(s3, run, args.best)
                manifest = read_manifest(s3, run["bucket"], run["prefix"], step)
                if manifest is None:
                    steps = sorted(stored_steps(s3, run["bucket"], run["prefix"]))
                    raise CliError(f"step {step} has no manifest in the bucket; steps there: {steps}")
            else:
                manifest = api.choose(args.step, args.best)
            target = Path(args.to)
            target.mkdir(parents=True, exist_ok=True)
            result = restore_checkpoint(s3, run["bucket"], run["prefix"], manifest, target)
        except (RestoreError, RunApiError, SyncError) as exc:
            raise CliError(f"restore: {exc}") from None
        except (BotoCoreError, ClientError) as exc:
            raise CliError(f"restore: {exc}; run it again to resume the download") from None
        except OSError as exc:
            raise CliError(f"restore: {args.to}: {exc.strerror or exc}") from None
    print(f"step {result.step}: {result.files} files, {result.bytes / MiB:.1f} MiB verified in {result.directory}")
    return 0


def _bucket_step(s3: Any, run: dict[str, Any], best: bool) -> int:
    """The step `restore --from-bucket` takes: the newest with a manifest in the bucket, or with ``best`` the best by
    the metric the manifests carry (ranked as the run's retention ranks it: --best used to restore the newest)."""
    durable = BucketOnly(s3, run["bucket"], run["prefix"]).done_steps()[0]
    if not durable:
        raise CliError(f"no durable checkpoint in s3://{run['bucket']}/{run['prefix']}")
    if not best:
        return max(durable)
    manifests = [(s, read_manifest(s3, run["bucket"], run["prefix"], s)) for s in sorted(durable)]
    stored = [StoredCheckpoint(s, True, m.metric, m.final) for s, m in manifests if m is not None]
    mode = run["schedule"].get("retention", {}).get("metric_mode", "min")
    step = best_step(stored, "max" if mode == "max" else "min")
    if step is None:
        where = f"s3://{run['bucket']}/{run['prefix']}"
        raise CliError(f"no checkpoint in {where} has a metric; use --step or the latest")
    return step


def agent_run_check(args: argparse.Namespace, client: httpx.Client, key: str) -> None:
    """The run ``--run`` names, read before the node registers: an unknown run (or another organization's) stops the
    agent with nothing left behind, where it registered an active node first and then failed to join."""
    if args.run is None:
        return
    try:
        RunApi(client, key, args.run).run()
    except RunApiError as exc:
        raise CliError(f"agent: cannot join run {args.run}: {exc}") from None


def agent_run_setup(args: argparse.Namespace, agent: Any, client: httpx.Client, key: str) -> None:
    """Attach the run and the guard the agent's flags ask for."""
    from services.agent.node import NodeGuard, RunSync
    from services.agent.signals import JobWatch
    from services.nodes.idle import IdlePolicy

    agent.jobs = JobWatch(pids=args.job_pid, pattern=args.job_pattern)
    if args.stop_command:
        agent.stop_command = shlex.split(args.stop_command)
    agent.guard = NodeGuard(IdlePolicy(idle_minutes=args.idle_minutes), args.unreachable_minutes * 60)
    if args.run is None:
        return
    api = RunApi(client, key, args.run)
    try:
        run = api.join(agent.node_id, agent.node_token)
    except RunApiError as exc:
        raise CliError(f"agent: cannot join run {args.run}: {exc}") from None
    checkpoint_dir = args.checkpoint_dir or run["checkpoint_dir"]
    agent.jobs.pid_file = Path(checkpoint_dir) / JOB_PID_FILE
    agent.attach_run(
        RunSync(
            api=api,
            s3=_s3(),
            bucket=run["bucket"],
            prefix=run["prefix"],
            checkpoint_dir=Path(checkpoint_dir),
            options=SyncOptions(settle_s=args.settle_s),
            interval_s=args.sync_interval,
        )
    )
    print(
        f"gpuplan agent: syncing run {args.run} from {checkpoint_dir} to s3://{run['bucket']}/{run['prefix']}",
        file=sys.stderr,
    )
