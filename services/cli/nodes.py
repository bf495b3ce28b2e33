"""`gpuplan agent`: run on a GPU node: register it, heartbeat, run its calibrations and sync a run."""

from __future__ import annotations

import argparse
import logging
import sys

from services.cli import runs as runs_cli
from services.cli.common import CliError, Subparsers, add_key_options, api_key, api_url, examples, float_arg
from services.nodes.idle import HEARTBEAT_INTERVAL_S


def register(sub: Subparsers) -> None:
    agent = sub.add_parser("agent", help="run on a GPU node: register it, heartbeat, run its calibrations")
    examples(
        agent,
        "GPUPLAN_API_KEY=$KEY gpuplan agent --api http://planner:8000 --once",
        "gpuplan agent --api http://planner:8000 --key-file ~/.gpuplan-key --run RUN_ID -- accelerate launch train.py",
    )
    agent.add_argument(
        "--api", required=True, type=api_url, metavar="URL", help="the gpuplan service, e.g. http://planner:8000"
    )
    add_key_options(agent)
    agent.add_argument("--name", type=_node_name, help="node name (default: the host name)")
    agent.add_argument(
        "--gpu",
        help="GPU model only where NVML cannot tell (ignored where it can); such a node's calibrations are "
        "stored but used by no estimate",
    )
    agent.add_argument("--provider", help="who rents the node")
    agent.add_argument(
        "--price-usd-per-hour",
        type=float_arg("--price-usd-per-hour", 0, 100_000),  # the service's bound (NodeRegistration)
        metavar="X",
        help="what the node costs per hour",
    )
    agent.add_argument(
        "--interval",
        # Idle time accrues only across gaps up to the service's lost threshold (300 s by default, cadence_gap_s):
        # beyond half of it every gap restarted the idle timer, and an idle node was never stopped (a probe).
        type=float_arg("--interval", 0.1, 150.0),
        default=HEARTBEAT_INTERVAL_S,
        metavar="S",
        help="seconds between heartbeats (idle time accrues only across gaps of up to three of them plus 30 s)",
    )
    agent.add_argument("--once", action="store_true", help="one heartbeat and at most one job, then exit")
    runs_cli.add_agent_options(agent)
    # INFO: a long-running agent's log says what it does (a job launched, a checkpoint waiting, a sync failing). The
    # sync outcomes its RunSync logs once per change (services/agent/node.py) are left out of each pass's own log.
    agent.set_defaults(
        handler=cmd_agent, log_level=logging.INFO, log_printed=("in_progress", "changed", "repaired", "refused")
    )


def _node_name(value: str) -> str:
    """--name without the spaces around it (the service trims it too); one of spaces alone names no node."""
    name = value.strip()
    if not name:
        raise argparse.ArgumentTypeError(f"--name: {value!r} is blank: give the node a name (default: the host name)")
    return name


def cmd_agent(args: argparse.Namespace) -> int:
    import httpx

    from services.agent.agent import Agent

    key = api_key(args, "agent", warn_argument=True, local=False)
    with httpx.Client(base_url=args.api, timeout=60) as client:
        agent = Agent(client, key)
        runs_cli.agent_run_check(args, client, key)
        try:
            node = agent.register(
                name=args.name,
                gpu=args.gpu,
                provider=args.provider,
                usd_per_hour=args.price_usd_per_hour,
                instance_id=args.instance_id,
            )
        except (httpx.HTTPError, RuntimeError) as exc:
            raise CliError(f"agent: cannot register with {args.api}: {exc}") from None
        print(f"gpuplan agent: node {node} registered with {args.api}", file=sys.stderr)
        runs_cli.agent_run_setup(args, agent, client, key)
        job = args.job[1:] if args.job[:1] == ["--"] else args.job
        if job:
            try:
                agent.launch(job)  # its INFO line says the job's pid (services/agent/agent.py)
            except OSError as exc:
                raise CliError(f"agent: cannot start {job[0]}: {exc.strerror or exc}") from None
        ended = agent.run(args.interval, once=args.once)
        print(f"gpuplan agent: stopped ({ended})", file=sys.stderr)
    # Checkpoints the final sync left on this node only (its line is logged): a supervisor must see a failure.
    return 1 if agent.final_sync_error else 0
