"""Writing and reading the exported files: the header every file carries, YAML/JSON, and launch.sh.

JSON has no comments, so a JSON file carries its header as a ``"_comment"`` list of lines (DeepSpeed and
the generated script ignore the key).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from services.estimator.plan import CONTROL_CHARACTERS
from services.export.errors import ExportError
from services.export.target import Target

LAUNCH_FILE = "launch.sh"
MASTER_PORT = 29500  # rendezvous port of multi-node launches
# launch.sh checks the installed versions before it starts training (services/export/versions.py).
CHECK_COMMAND = "python check_versions.py"
M = TypeVar("M", bound=BaseModel)
# launch.sh lines before the command: the checkpoint folder and resume.py's arguments (services/export/resume.py).
_SETUP_PREFIXES = ("export ", "mapfile ")


def header_lines(target: Target, command: str, assumed: Sequence[str] = ()) -> list[str]:
    """What the setup was sized for, what the estimate assumed, and how to start it: every file's header."""
    plan = target.plan
    offload = ", CPU offload" if plan.cpu_offload else ""
    nodes = f"{target.nodes} nodes of {target.gpus_per_node}" if target.nodes > 1 else "1 node"
    return [
        f"gpuplan export ({target.fmt}): {target.model_id}, {plan.method} fine-tuning",
        f"Setup: {plan.gpus} x {target.gpu} ({nodes}), sharding {plan.sharding}{offload}, "
        f"micro-batch {plan.micro_batch_size} x {plan.seq_len} tokens",
        f"Predicted peak memory: {target.peak_gib_per_gpu:.2f} GiB per GPU of {target.gpu_memory_gib:.2f} GiB "
        f"(sized with {target.headroom_gib:.2f} GiB headroom)",
        f"Start training: {command}",
        "Batch, sequence length, precision, optimizer, LoRA and sharding settings set the memory: "
        "re-run gpuplan before changing them.",
        *target.replan_notes,
        *assumed,
    ]


def one_line(text: str) -> str:
    """``text`` as one line of a comment: a line break (or any control character) in a name or a note would end
    the comment, and the rest would run as a command of launch.sh or code of train.py."""
    return CONTROL_CHARACTERS.sub(" ", text)


def comment_block(lines: list[str]) -> str:
    return "".join(f"# {one_line(line)}\n" for line in lines)


def yaml_text(header: list[str], data: Mapping[str, Any]) -> str:
    """A YAML document with the header as comments, keys in the given order."""
    body = yaml.safe_dump(dict(data), sort_keys=False, default_flow_style=False, width=1000)
    return comment_block(header) + "\n" + body


def json_text(header: list[str], data: Mapping[str, Any]) -> str:
    """A JSON object whose first key ``_comment`` holds the header."""
    return json.dumps({"_comment": header, **data}, indent=2) + "\n"


def launch_text(header: list[str], command: str, prelude: list[str] | None = None, setup: Sequence[str] = ()) -> str:
    """A bash script that starts training (``prelude`` lines are comments printed before the command;
    ``setup`` lines, ``export`` or ``mapfile`` only, run before the version check and the command)."""
    lines = ["#!/usr/bin/env bash", *(f"# {one_line(line)}" for line in header)]
    lines += [f"# {one_line(line)}" for line in prelude or []]
    # The version check right before the command: the setup lines only name a folder and run resume.py (stdlib).
    lines += ["set -euo pipefail", *setup, CHECK_COMMAND, command]
    return "\n".join(lines) + "\n"


def file_of(files: Mapping[str, str], name: str) -> str:
    text = files.get(name)
    if text is None:
        raise ExportError(name, f"missing; the export has {', '.join(sorted(files)) or 'no files'}")
    return text


def load_yaml(files: Mapping[str, str], name: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(file_of(files, name))
    except yaml.YAMLError as exc:
        raise ExportError(name, f"not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ExportError(name, "must be a YAML mapping")
    return data


def load_json(files: Mapping[str, str], name: str) -> dict[str, Any]:
    try:
        data = json.loads(file_of(files, name))
    except json.JSONDecodeError as exc:
        raise ExportError(name, f"not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ExportError(name, "must be a JSON object")
    data.pop("_comment", None)
    return data


def validated(model: type[M], data: Any, name: str) -> M:
    """``data`` as ``model``; a mismatch names the file and the key."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ExportError(f"{name}:{where}" if where else name, first["msg"]) from exc


def launch_argv(files: Mapping[str, str]) -> list[str]:
    """The command of launch.sh as argv (comments and ``set`` lines skipped, continuations joined)."""
    text = file_of(files, LAUNCH_FILE).replace("\\\n", " ")
    commands = [
        line.strip()
        for line in text.splitlines()
        if line.strip()
        and not line.lstrip().startswith(("#", "set ", *_SETUP_PREFIXES))
        and line.strip() != CHECK_COMMAND
    ]
    if len(commands) != 1:
        raise ExportError(LAUNCH_FILE, f"expected one command, found {len(commands)}")
    return shlex.split(commands[0])


def flag_int(argv: list[str], flag: str, default: int) -> int:
    """The integer after ``flag`` (``--flag N`` or ``--flag=N``) in argv, or ``default``."""
    for i, arg in enumerate(argv):
        value: str | None = None
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
        if value is not None:
            if not value.isdigit() or int(value) < 1:
                raise ExportError(f"{LAUNCH_FILE}:{flag}", f"must be a positive integer, got {value!r}")
            return int(value)
    return default
