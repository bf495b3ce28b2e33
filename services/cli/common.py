"""What every command module shares: the one-line user error, the parser that raises it, and small
readers for the files and numbers users pass."""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import re
import stat
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn, Protocol

from services.core import json_limits

EXIT_BAD_INPUT = 2


class CliError(Exception):
    """A user error: printed as one line, exit status 2."""


class Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors become a `CliError` (one line, exit 2), that takes options only as
    written in full, and that refuses an option of one value given twice: argparse keeps the last, so `--format
    axolotl --format torchtune` exported torchtune and exited 0, where the API refuses a repeated parameter (a probe
    of the exports)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # No abbreviated options: `--form torchtune` after `--format axolotl` was read as a second --format and passed
        # the check below (its count reads options as written), exporting torchtune (a probe of the CLI).
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise CliError(message)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        if args is not None and not any(isinstance(a, argparse._SubParsersAction) for a in self._actions):
            given = list(args)[: list(args).index("--")] if "--" in args else list(args)
            for action in self._actions:
                if type(action) is not argparse._StoreAction:  # one value, the last kept
                    continue
                for option in action.option_strings:
                    count = sum(1 for a in given if a == option or a.startswith(option + "="))
                    if count > 1:
                        self.error(f"{option} given more than once: give it once")
        return super().parse_known_args(args, namespace)


class Subparsers(Protocol):
    """What `register(subparsers)` receives: the group returned by `add_subparsers`."""

    def add_parser(self, name: str, **kwargs: Any) -> Parser: ...


def regular_file(path: Path) -> bool:
    """Whether ``path`` is a regular file; a name the system refuses (too long, say) is not one. Path.is_file raises
    OSError for ENAMETOOLONG: a traceback."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def read_regular_file(path: str, what: str) -> bytes:
    """The bytes of a regular file named by ``what``. A FIFO blocked for ever waiting for a writer and /dev/zero
    read until memory ran out; the check is made on the opened descriptor (no race with a swapped path), which is
    opened non-blocking so that opening a FIFO itself cannot wait."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise CliError(f"{what} {path[:200]}: cannot read ({exc.strerror or exc})") from None
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise CliError(f"{what} {path[:200]}: not a regular file")
    with os.fdopen(descriptor, "rb") as fh:
        try:
            return fh.read()
        except OSError as exc:
            raise CliError(f"{what} {path[:200]}: cannot read ({exc.strerror or exc})") from None


def read_json(path: str, what: str) -> Any:
    """Parse a JSON file named on the command line; errors name the flag and the position."""
    try:
        text = read_regular_file(path, what).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CliError(f"{what} {path}: not UTF-8 text (byte {exc.start}): a JSON file is UTF-8") from None
    try:
        return json_limits.loads(text)
    except json_limits.JsonSyntaxError as exc:
        raise CliError(f"{what} {path}: {exc.message}") from None
    except json_limits.JsonInputError as exc:  # too deep, Infinity/NaN, NUL, lone surrogates
        raise CliError(f"{what} {path}: {exc.field}: {exc.message}") from None


def read_plan_file(path: str) -> dict[str, Any]:
    """A plan JSON file; a benchmark case ({"plan": ..., "measured": ...}) is accepted as well."""
    data = read_json(path, "--plan")
    if isinstance(data, dict) and isinstance(data.get("plan"), dict) and "model" not in data:
        data = data["plan"]
    if not isinstance(data, dict):
        raise CliError(f"--plan {path}: must hold a JSON object")
    return dict(data)


def int_arg(name: str, low: int | None = None, high: int | None = None) -> Callable[[str], int]:
    """An argparse type for an integer flag (from ``low`` to ``high`` where given) whose error names the flag."""

    def parse(value: str) -> int:
        try:
            number = int(_ascii_number(value))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer (ASCII digits), got {value!r}") from None
        _in_range(name, number, low, high, value)
        return number

    return parse


# What a service id looks like (services.core.db.new_id: 32 hex digits; runs and data sets alike): an id goes into a
# URL path, so '../' or '?' in it would name another resource.
_ID = re.compile(r"[0-9A-Za-z_-]{1,64}")


def id_arg(name: str) -> Callable[[str], str]:
    """An argparse type for a service id (a plan, run or data set) whose error names the flag."""

    def parse(value: str) -> str:
        if not _ID.fullmatch(value):
            raise argparse.ArgumentTypeError(f"{name}: {value[:80]!r} is not an id (letters, digits, '-' and '_')")
        return value

    return parse


def float_arg(name: str, low: float | None = None, high: float | None = None) -> Callable[[str], float]:
    """An argparse type for a finite number flag (from ``low`` to ``high`` where given) whose error names the
    flag: float() reads 'nan' and 'inf', which no setting means."""

    def parse(value: str) -> float:
        try:
            number = float(_ascii_number(value))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number (ASCII digits), got {value!r}") from None
        if not math.isfinite(number):
            raise argparse.ArgumentTypeError(f"{name} must be a finite number, got {value!r}")
        _in_range(name, number, low, high, value)
        return number

    return parse


def _ascii_number(value: str) -> str:
    """``value`` where it is written in ASCII without '_'; else ValueError. int() and float() read any Unicode
    decimal digit ('１' full-width, '٣' Arabic-Indic), Unicode spaces around it and '_' between digits: a flag
    given such a number was taken as the number, where the API's JSON reads ASCII digits alone (a fuzz)."""
    if not value.isascii() or "_" in value:
        raise ValueError(value)
    return value


def _bound(number: float | None) -> str:
    """A range's end as written: a whole number in full (:g wrote --job-pid's 4194304 as 4.1943e+06)."""
    if number is not None and float(number).is_integer() and abs(number) < 1e15:
        return str(int(number))
    return f"{number:g}"


def _in_range(name: str, number: float, low: float | None, high: float | None, given: str) -> None:
    if (low is not None and number < low) or (high is not None and number > high):
        span = f"from {_bound(low)} to {_bound(high)}" if low is not None and high is not None else ""
        span = span or (f"at least {_bound(low)}" if low is not None else f"at most {_bound(high)}")
        raise argparse.ArgumentTypeError(f"{name} must be {span}, got {given!r}")


def api_error(response: Any) -> str:
    """The service's error message from an HTTP response, or its status."""
    try:
        body = response.json()
        return str(body.get("message") or body)
    except ValueError:
        return f"HTTP {response.status_code}"


def service_json(response: Any, api: str, *fields: str) -> dict[str, Any]:
    """The JSON object a gpuplan service answered, with ``fields`` in it. Anything else (another server's HTML page on
    that port, a proxy's login form) is one line naming --api, where it was a JSONDecodeError or KeyError traceback."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict) or any(field not in body for field in fields):
        kind = response.headers.get("content-type") or "no content type"
        raise CliError(f"--api {api}: the answer ({kind}) is not a gpuplan service's; check the URL")
    return body


# Where a command reads the organization's API key from when no --key-file is given: an argument is visible
# to every user of the machine in `ps` and /proc/<pid>/cmdline, a file (mode 0600) or the environment is not.
KEY_ENV = "GPUPLAN_API_KEY"


def add_key_options(parser: argparse.ArgumentParser) -> None:
    """--key-file and --key; without either the key comes from $GPUPLAN_API_KEY (see `api_key`)."""
    parser.add_argument(
        "--key-file", metavar="PATH", help=f"a file holding the organization's API key (default: ${KEY_ENV})"
    )
    parser.add_argument(
        "--key", help=f"the API key itself (visible in ps to every user; --key-file or ${KEY_ENV} is not)"
    )


# Where the embedded `gpuplan serve` keeps the 'local' organization's admin key (relative to where it runs).
LOCAL_KEY_FILE = Path(".gpuplan") / "local-key"


def api_key(
    args: argparse.Namespace,
    command: str,
    *,
    warn_argument: bool = False,
    local: bool = True,
    environ: Mapping[str, str] | None = None,
) -> str:
    """The API key from --key-file, else --key, else $GPUPLAN_API_KEY, else (``local``) the embedded
    service's own key file in this directory; one readable error naming where to give it. A long-running
    command (the agent) warns that --key shows the key in ps for as long as it runs."""
    env = os.environ if environ is None else environ
    if getattr(args, "key_file", None):
        try:
            key = read_regular_file(args.key_file, "--key-file").decode("utf-8").strip()
        except UnicodeDecodeError as exc:
            raise CliError(f"--key-file {args.key_file}: not UTF-8 text (byte {exc.start})") from None
        if not key:
            raise CliError(f"--key-file {args.key_file}: the file is empty")
        return _header_key(key, f"--key-file {args.key_file}")
    if getattr(args, "key", None):
        if warn_argument:
            print(f"gpuplan {command}: --key shows the key in ps; use --key-file or ${KEY_ENV}", file=sys.stderr)
        return _header_key(str(args.key), "--key")
    if env.get(KEY_ENV, "").strip():
        return _header_key(env[KEY_ENV].strip(), f"${KEY_ENV}")
    if local and LOCAL_KEY_FILE.is_file():
        try:
            key = LOCAL_KEY_FILE.read_text(encoding="utf-8").strip()
        except OSError:
            key = ""
        if key:
            return key
    where = (
        f", set ${KEY_ENV} or run it where `gpuplan serve` wrote {LOCAL_KEY_FILE}" if local else f" or set ${KEY_ENV}"
    )
    raise CliError(f"{command}: no API key: give --key-file PATH{where}")


def _header_key(key: str, where: str) -> str:
    """The key as it goes into the Authorization header: printable ASCII without spaces (a key is gp_ and URL-safe
    base64). Anything else (a pasted 'é', two lines of a file) raised UnicodeEncodeError in httpx: a traceback."""
    if not (key.isascii() and key.isprintable()) or any(c.isspace() for c in key):
        raise CliError(f"{where}: not an API key (printable ASCII without spaces, such as gp_...)")
    return key


def api_url(value: str) -> str:
    """An argparse type for the service's address (--api, $GPUPLAN_API): an http(s) URL with a host. httpx raised
    InvalidURL ('http://[::1') or UnicodeError (a host label over 63 characters) while connecting: a traceback."""
    import httpx

    try:
        url = httpx.URL(value)
        url.host.encode("idna")  # what the socket layer does with the host before looking it up
    except (httpx.InvalidURL, UnicodeError):
        url = None
    port_ok = url is not None and (url.port is None or 0 < url.port < 65536)
    if url is None or not port_ok or url.scheme not in ("http", "https") or not url.host:
        raise argparse.ArgumentTypeError(
            f"{value[:100]!r} is not the http(s) URL of a service (e.g. http://127.0.0.1:8000)"
        )
    return value


def examples(parser: argparse.ArgumentParser, *lines: str) -> None:
    """Examples at the end of the command's --help, printed as written."""
    parser.epilog = "examples:\n" + "\n".join(f"  {line}" for line in lines)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter


# The service the client commands talk to: --api, else $GPUPLAN_API, else the embedded default's address.
API_ENV = "GPUPLAN_API"


def add_api_option(parser: argparse.ArgumentParser, *aliases: str) -> None:
    parser.add_argument(
        "--api",
        *aliases,
        dest="api",
        type=api_url,
        default=os.environ.get(API_ENV) or "http://127.0.0.1:8000",
        metavar="URL",
        help=f"the gpuplan service (default ${API_ENV}, else http://127.0.0.1:8000)",
    )


# The CLI's log: one handler on the "gpuplan" logger, never the root one (httpx and botocore log each request there).
LOGGER = "gpuplan"


class _OneLine(logging.Formatter):
    """``gpuplan COMMAND: [warning: ]message``, one line per record: an exception is its class and message, never a
    traceback."""

    def __init__(self, command: str) -> None:
        super().__init__()
        self.command = command

    def format(self, record: logging.LogRecord) -> str:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):  # arguments that do not fit the message: still say something
            message = f"{record.msg} {record.args}"
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            message = f"{message}: {type(exc).__name__}: {exc}" if str(exc) else f"{message}: {type(exc).__name__}"
        level = f"{record.levelname.lower()}: " if record.levelno >= logging.WARNING else ""
        return " ".join(f"gpuplan {self.command}: {level}{message}".splitlines())


class _CliHandler(logging.Handler):
    """Writes to sys.stderr as it is at each record (a test's capture replaces it), as logging.lastResort does."""

    def __init__(self) -> None:
        super().__init__()
        self.printed: frozenset[str] = frozenset()  # SyncResult fields the command reports itself

    def filter(self, record: logging.LogRecord) -> bool:
        # A record saying what the command prints itself (services/runs/sync.py marks them) would say it twice.
        if getattr(record, "sync_result", None) in self.printed:
            return False
        return bool(super().filter(record))

    def emit(self, record: logging.LogRecord) -> None:
        line = self.format(record)
        try:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()
        except (OSError, ValueError):  # stderr closed: nowhere left to say it
            pass


_handler = _CliHandler()
_users = 0
_users_lock = threading.Lock()


@contextlib.contextmanager
def command_log(command: str, level: int | None, printed: Iterable[str] = ()) -> Iterator[None]:
    """While a command runs, the "gpuplan" logger's records at ``level`` and above go to stderr as one line each
    (None: the command configures logging itself, as Celery does). ``printed``: the sync result's fields the command
    reports itself, whose records are left out. One handler however often main() runs in a process, removed after."""
    global _users
    if level is None:
        yield
        return
    logger = logging.getLogger(LOGGER)
    with _users_lock:
        _users += 1
        if _handler not in logger.handlers:
            logger.addHandler(_handler)
        previous = logger.level
        _handler.setFormatter(_OneLine(command))
        _handler.setLevel(level)
        _handler.printed = frozenset(printed)
        if logger.getEffectiveLevel() > level:
            logger.setLevel(level)  # the root's WARNING would drop the agent's INFO records before any handler
    try:
        yield
    finally:
        with _users_lock:
            _users -= 1
            logger.setLevel(previous)
            if _users == 0:
                logger.removeHandler(_handler)
