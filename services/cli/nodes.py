"""`gpuplan agent`: run on a GPU node: register it, heartbeat, run its calibrations and sync a run."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from services.cli import runs as runs_cli
from services.cli.common import CliError, Subparsers

# Where the agent reads its API key from when no --key-file is given: an argument is visible to every user
# of the machine in `ps` and /proc/<pid>/cmdline, a file (mode 0600) or the environment is not.
KEY_ENV = "GPUPLAN_API_KEY"


def register(sub: Subparsers) -> None:
    agent = sub.add_parser("agent", help="run on a GPU node: register it, heartbeat, run its calibrations")
    agent.add_argument("--api", required=True, metavar="URL", help="the gpuplan service, e.g. http://planner:8000")
    agent.add_argument(
        "--key-file", metavar="PATH", help=f"a file holding the organization's API key (default: ${KEY_ENV})"
    )
    agent.add_argument(
        "--key", help=f"the API key itself: visible in ps to every user; prefer --key-file or ${KEY_ENV}"
    )
    agent.add_argument("--name", help="node name (default: the host name)")
    agent.add_argument(
        "--gpu",
        help="GPU model only where NVML cannot tell (ignored where it can); such a node's calibrations are "
        "stored but used by no estimate",
    )
    agent.add_argument("--provider", help="who rents the node")
    agent.add_argument("--price-usd-per-hour", type=float, metavar="X", help="what the node costs per hour")
    agent.add_argument("--interval", type=float, default=15.0, metavar="S", help="seconds between polls")
    agent.add_argument("--once", action="store_true", help="one heartbeat and at most one job, then exit")
    runs_cli.add_agent_options(agent)
    agent.set_defaults(handler=cmd_agent)


def agent_key(args: argparse.Namespace, environ: dict[str, str] | None = None) -> str:
    """The API key from --key-file, else $GPUPLAN_API_KEY, else --key (warned about); one readable error."""
    env = os.environ if environ is None else environ
    if args.key_file:
        try:
            key = Path(args.key_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise CliError(f"--key-file {args.key_file}: cannot read ({exc.strerror or exc})") from None
        if not key:
            raise CliError(f"--key-file {args.key_file}: the file is empty")
        return key
    if env.get(KEY_ENV, "").strip():
        return env[KEY_ENV].strip()
    if args.key:
        print(f"gpuplan agent: --key shows the key in ps; use --key-file or ${KEY_ENV}", file=sys.stderr)
        return str(args.key)
    raise CliError(f"agent: no API key: give --key-file PATH or set ${KEY_ENV}")


def cmd_agent(args: argparse.Namespace) -> int:
    import httpx

    from services.agent.agent import Agent

    key = agent_key(args)
    with httpx.Client(base_url=args.api, timeout=60) as client:
        agent = Agent(client, key)
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
        runs_cli.agent_run_setup(args, agent, client)
        ended = agent.run(args.interval, once=args.once)
        print(f"gpuplan agent: stopped ({ended})", file=sys.stderr)
    return 0
