"""The ``gpuplan`` command line: thin argument handling over the estimator and the catalogs.

Each command group lives in its own module whose `register(subparsers)` builds its parser and binds
its handler with `set_defaults(handler=...)`; `main` only parses and calls that handler, so no
command can be left unreachable. Every error is one readable line on stderr and a non-zero exit
(2 for bad input), never a traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from services.cli import admin, catalog, data, estimate, export, nodes, plans, runs, server, trace
from services.cli.common import EXIT_BAD_INPUT, CliError, Parser
from services.core.errors import GpuplanError
from services.estimator.errors import EstimatorError
from services.estimator.validation import PlanError

# In the order `gpuplan --help` lists them.
COMMAND_MODULES = (estimate, trace, export, catalog, server, data, plans, nodes, runs, admin)


def build_parser() -> Parser:
    """The whole `gpuplan` parser; every leaf command carries its handler."""
    parser = Parser(prog="gpuplan", description="Plan LLM fine-tuning runs: memory, speed and cost per GPU.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for module in COMMAND_MODULES:
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        code: int = args.handler(args)
        return code
    except (CliError, runs.RunCliError) as exc:
        print(f"gpuplan: error: {exc}", file=sys.stderr)
    except PlanError as exc:
        print(f"gpuplan: error: {'; '.join(exc.problems)}", file=sys.stderr)
    except EstimatorError as exc:
        print(f"gpuplan: error: {exc}", file=sys.stderr)
    except GpuplanError as exc:
        details = f" ({'; '.join(map(str, exc.details[:5]))})" if isinstance(exc.details, list) else ""
        print(f"gpuplan: error: {exc.message}{details}", file=sys.stderr)
    return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
