"""The ``gpuplan`` command line: thin argument handling over the estimator and the catalogs.

Each command group lives in its own module whose `register(subparsers)` builds its parser and binds
its handler with `set_defaults(handler=...)`; `main` only parses and calls that handler, so no
command can be left unreachable. Every error is one readable line on stderr and a non-zero exit
(2 for bad input), never a traceback.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Sequence

from pydantic import ValidationError

from services.cli.common import EXIT_BAD_INPUT, CliError, Parser, command_log
from services.core.errors import GpuplanError
from services.estimator.errors import EstimatorError, UnknownModelError
from services.estimator.validation import PlanError

# The command modules in the order `gpuplan --help` lists them, each with the top-level commands it registers
# (tests/cli/test_console.py checks this against what the modules register).
COMMANDS: dict[str, tuple[str, ...]] = {
    "estimate": ("estimate",),
    "trace": ("trace",),
    "export": ("export",),
    "catalog": ("models", "gpus", "catalog"),
    "server": ("serve", "migrate", "worker", "beat"),
    "data": ("data",),
    "plans": ("plans",),
    "nodes": ("agent",),
    "runs": ("sync", "restore"),
    "admin": ("admin",),
    "completion": ("completion",),
}
_MODULE_OF = {command: module for module, commands in COMMANDS.items() for command in commands}


def build_parser(command: str | None = None) -> Parser:
    """The `gpuplan` parser; every leaf command carries its handler. Given the command a command line starts with,
    only the module that registers it is imported: `gpuplan estimate` starts in about half the time of importing
    every command's dependencies (the exports, the data checks, boto3). The completion script and the top-level
    help need the whole parser."""
    parser = Parser(prog="gpuplan", description="Plan LLM fine-tuning runs: memory, speed and cost per GPU.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    only = _MODULE_OF.get(command or "")
    for name in COMMANDS if only in (None, "completion") else (only,):
        importlib.import_module(f"services.cli.{name}").register(sub)
    if "completion" in sub.choices:
        from services.cli.completion import hand_in

        hand_in(parser)
    return parser


# What a shell reports for a process ended by SIGPIPE (128 + 13) and by SIGINT (128 + 2).
EXIT_BROKEN_PIPE = 141
EXIT_INTERRUPTED = 130


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's final flush of a closed pipe raises nothing
    (docs.python.org/3/library/signal.html, "Note on SIGPIPE")."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(words[0] if words else None)
    try:
        args = parser.parse_args(words)
        # A command's log lines: WARNING and above, INFO for a long-running one (the agent sets log_level).
        log_level = getattr(args, "log_level", logging.WARNING)
        with command_log(args.command, log_level, getattr(args, "log_printed", ())):
            code: int = args.handler(args)
        sys.stdout.flush()  # inside the try: a reader that stopped early (`| head`) surfaces here
        return code
    except KeyboardInterrupt:
        # Ctrl-C while waiting (plans submit --wait, data upload, agent): a line, not a traceback.
        print("gpuplan: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader closed the pipe (`gpuplan estimate ... | head`): stop quietly, as `cat` would.
        _quiet_stdout()
        return EXIT_BROKEN_PIPE
    except CliError as exc:
        print(f"gpuplan: error: {exc}", file=sys.stderr)
    except PlanError as exc:
        print(f"gpuplan: error: {'; '.join(exc.problems)}", file=sys.stderr)
    except UnknownModelError as exc:
        hint = "Give its Hugging Face id (owner/name), or its config.json with --config FILE."
        print(f"gpuplan: error: {exc} {hint}", file=sys.stderr)
    except EstimatorError as exc:
        print(f"gpuplan: error: {exc}", file=sys.stderr)
    except GpuplanError as exc:
        details = f" ({'; '.join(map(str, exc.details[:5]))})" if isinstance(exc.details, list) else ""
        print(f"gpuplan: error: {exc.message}{details}", file=sys.stderr)
    except ValidationError as exc:
        # The settings read deeper down (the Hub client's GPUPLAN_HUB_*, and with them every other GPUPLAN_* value)
        # than server.load_settings, which commands call first; any other model's error is a bug: its traceback.
        if exc.title != "Settings":
            raise
        from services.cli.server import settings_problem

        print(f"gpuplan: error: {settings_problem(exc)}", file=sys.stderr)
    return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
