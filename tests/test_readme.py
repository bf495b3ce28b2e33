"""Every fenced shell example in README.md and docs/*.md runs as written.

A shell block (fenced as ```bash, ```sh, ```shell, ```console or with no language) is either run here,
against a fresh `gpuplan serve` on a free port with its own SQLite file, or is marked right above its
fence with `<!-- not-run: REASON -->`. A runnable block carries one or more `<!-- expect: TEXT -->`
lines: it must exit 0 and print every TEXT (on stdout or stderr). Placeholders filled in: the documented
address `127.0.0.1:8000` (or `localhost:8000`) becomes the test server's, `$KEY` is the `local`
organization's key, `$API` the server's URL, `PLAN_ID` a finished plan's id, `gpuplan` is the installed
console script (`.venv/bin` on PATH) and the admin commands reach the server's database. Blocks of one
page share a working directory and run in page order, so a later block may read a file an earlier one
wrote."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.conftest import _free_port, require_service

ROOT = Path(__file__).resolve().parents[1]
SHELL_LANGUAGES = {"", "bash", "sh", "shell", "console"}
BLOCK_TIMEOUT_S = 120
_FENCE = re.compile(r"^(\s*)```\s*([\w+-]*)\s*$")
_NOT_RUN = re.compile(r"^<!--\s*not-run:\s*(.*?)\s*-->$")
_EXPECT = re.compile(r"^<!--\s*expect:\s*(.*?)\s*-->$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    language: str
    code: str
    not_run: str | None
    expects: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{_shown(self.path)}:{self.line}"


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def parse_blocks(path: Path) -> list[Block]:
    """The fenced blocks of one Markdown file with the marker comments right above each fence."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent, language = opening.group(1), opening.group(2).lower()
        end = i + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        if end == len(lines):
            raise AssertionError(f"{_shown(path)}:{i + 1}: the fence is never closed")
        not_run: str | None = None
        expects: list[str] = []
        above = i - 1
        while above >= 0 and lines[above].strip().startswith("<!--"):
            comment = lines[above].strip()
            if (found := _NOT_RUN.match(comment)) is not None:
                not_run = found.group(1)
            elif (found := _EXPECT.match(comment)) is not None:
                expects.insert(0, found.group(1))
            above -= 1
        code = "\n".join(line.removeprefix(indent) for line in lines[i + 1 : end]) + "\n"
        blocks.append(Block(path, i + 1, language, code, not_run, tuple(expects)))
        i = end + 1
    return blocks


def shell_blocks() -> list[Block]:
    return [b for doc in documents() for b in parse_blocks(doc) if b.language in SHELL_LANGUAGES]


def runnable_blocks() -> list[Block]:
    return [b for b in shell_blocks() if b.not_run is None]


def test_every_shell_block_is_run_or_says_why_not() -> None:
    problems = []
    for block in shell_blocks():
        if block.not_run is not None:
            if not block.not_run:
                problems.append(f"{block.name}: `<!-- not-run: -->` needs a reason")
            if block.expects:
                problems.append(f"{block.name}: a not-run block cannot have expect lines")
        elif not block.expects:
            problems.append(
                f"{block.name}: add `<!-- expect: TEXT -->` (a key part of its output) above the fence, or "
                "`<!-- not-run: REASON -->`; fence blocks that are not shell as ```text, ```json, ..."
            )
    assert not problems, "\n".join(problems)


def test_the_parser_reads_markers_fences_and_languages(tmp_path: Path) -> None:
    doc = tmp_path / "page.md"
    doc.write_text(
        "intro\n\n<!-- not-run: needs a GPU node -->\n```bash\ngpuplan agent\n```\n\n"
        "<!-- expect: a -->\n<!-- expect: b c -->\n```\necho a b c\n```\n\n"
        "```json\n{}\n```\n\n- item\n\n  ```sh\n  echo indented\n  ```\n",
        encoding="utf-8",
    )
    blocks = parse_blocks(doc)
    assert [(b.line, b.language, b.not_run, b.expects) for b in blocks] == [
        (4, "bash", "needs a GPU node", ()),
        (10, "", None, ("a", "b c")),
        (14, "json", None, ()),
        (20, "sh", None, ()),
    ]
    assert blocks[1].code == "echo a b c\n"
    assert blocks[3].code == "echo indented\n"
    doc.write_text("```bash\necho never closed\n", encoding="utf-8")
    with pytest.raises(AssertionError, match="never closed"):
        parse_blocks(doc)


@dataclass(frozen=True)
class Service:
    url: str
    workdir: Path
    env: dict[str, str]
    plan_id: str


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """`gpuplan serve` on its embedded defaults, started in a scratch directory the way a user starts it
    in a clone: ./gpuplan.db and .gpuplan/local-key appear there, and .venv and infra/ are reachable."""
    require_service("curl", shutil.which("curl") is not None, "apt-get install -y curl")
    gpuplan = ROOT / ".venv" / "bin" / "gpuplan"
    require_service("the gpuplan console script", gpuplan.exists(), "bash infra/dev.sh test")
    workdir = tmp_path_factory.mktemp("readme")
    for name in (".venv", "infra"):
        (workdir / name).symlink_to(ROOT / name)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPLAN_")}
    env["PYTHONPATH"] = str(ROOT)
    port = _free_port()
    log = (workdir / "serve.log").open("wb")
    server = subprocess.Popen(
        [str(workdir / ".venv" / "bin" / "gpuplan"), "serve", "--port", str(port)],
        cwd=workdir,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    try:
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"gpuplan serve did not start: {(workdir / 'serve.log').read_text()}")
            time.sleep(0.2)
        key = (workdir / ".gpuplan" / "local-key").read_text(encoding="utf-8").strip()
        plan_id = _finished_plan(url, key)
        block_env = {
            **env,
            "KEY": key,
            "API": url,
            "PATH": f"{workdir / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}",
            "GPUPLAN_DATABASE_URL": f"sqlite:///{workdir / 'gpuplan.db'}",
        }
        yield Service(url=url, workdir=workdir, env=block_env, plan_id=plan_id)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()


def _finished_plan(url: str, key: str) -> str:
    """A plan estimated by the server, for the examples that read one (`PLAN_ID`)."""
    headers = {"Authorization": f"Bearer {key}"}
    plan = {
        "model": {"name": "Qwen/Qwen2.5-0.5B"},
        "method": "lora",
        "seq_len": 512,
        "dataset": {"examples": 1000, "avg_tokens": 400},
    }
    plan_id = str(httpx.post(f"{url}/v1/plans", json=plan, headers=headers, timeout=30).json()["id"])
    deadline = time.monotonic() + 60
    while (status := httpx.get(f"{url}/v1/plans/{plan_id}", headers=headers, timeout=30).json()["status"]) != "done":
        if status == "failed" or time.monotonic() > deadline:
            raise RuntimeError(f"the examples' plan ended {status}")
        time.sleep(0.2)
    return plan_id


def fill_placeholders(code: str, service: Service) -> str:
    address = service.url.removeprefix("http://")
    code = code.replace("127.0.0.1:8000", address).replace("localhost:8000", address)
    return re.sub(r"\bPLAN_ID\b", service.plan_id, code)


@pytest.mark.slow
@pytest.mark.parametrize("block", runnable_blocks(), ids=lambda b: b.name)
def test_shell_example_runs_as_written(block: Block, service: Service) -> None:
    workdir = service.workdir / block.path.stem
    workdir.mkdir(exist_ok=True)
    for name in (".venv", "infra", ".gpuplan"):
        link = workdir / name
        if not link.exists():
            link.symlink_to(service.workdir / name)
    script = "set -euo pipefail\n" + fill_placeholders(block.code, service)
    proc = subprocess.Popen(
        ["bash", "-c", script],
        cwd=workdir,
        env=service.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=BLOCK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(
            f"{block.name} ran past {BLOCK_TIMEOUT_S} s\n--- stdout\n{stdout[-2000:]}\n--- stderr\n{stderr[-2000:]}"
        )
    assert proc.returncode == 0, (
        f"{block.name} exited {proc.returncode}\n--- stdout\n{stdout[-3000:]}\n--- stderr\n{stderr[-3000:]}"
    )
    missing = [text for text in block.expects if text not in stdout + stderr]
    assert not missing, (
        f"{block.name}: {missing} not in its output\n--- stdout\n{stdout[-3000:]}\n--- stderr\n{stderr[-2000:]}"
    )
