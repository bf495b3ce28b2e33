"""Bad input a probe of every subcommand found printing a traceback or hanging: each is now one line and exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

GPUPLAN = Path(sys.executable).with_name("gpuplan")
REPO = Path(__file__).resolve().parents[2]


def _gpuplan(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPUPLAN_")}
    full = {**base, "PYTHONPATH": str(REPO), "GPUPLAN_HUB_CACHE_DIR": str(tmp_path / "hub"), **(env or {})}
    return subprocess.run(
        [str(GPUPLAN), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=full,
        cwd=tmp_path,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def _one_line(done: subprocess.CompletedProcess[str], needle: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], done.stderr[-2000:]


@pytest.mark.parametrize("flag", ["--plan", "--config"])
@pytest.mark.parametrize("kind", ["fifo", "/dev/zero"])
def test_a_plan_or_config_that_is_no_regular_file_is_one_line_not_a_hang(tmp_path: Path, flag: str, kind: str) -> None:
    # A FIFO blocked for ever waiting for a writer; /dev/zero was read until memory ran out.
    if kind == "fifo":
        os.mkfifo(tmp_path / "fifo")
    path = str(tmp_path / "fifo") if kind == "fifo" else kind
    _one_line(_gpuplan(tmp_path, "estimate", flag, path), f"{flag} {path}: not a regular file")


def test_a_plan_file_that_is_a_directory_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "plans").mkdir()
    _one_line(_gpuplan(tmp_path, "estimate", "--plan", "plans"), "--plan plans: not a regular file")


def test_a_bad_setting_read_by_the_hub_client_is_one_line_naming_it(tmp_path: Path) -> None:
    # A model id neither bundled nor cached reads the settings for the Hub's timeout: a pydantic traceback.
    done = _gpuplan(tmp_path, "estimate", "--model", "someone/not-bundled", env={"GPUPLAN_HUB_TIMEOUT_S": "abc"})
    _one_line(done, "gpuplan: error: GPUPLAN_HUB_TIMEOUT_S: ")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("data", "check", "ok.jsonl", "--names", "fifo"), "--names fifo: not a regular file"),
        (("data", "check", "ok.jsonl", "--names", "/dev/zero"), "--names /dev/zero: not a regular file"),
        (("plans", "get", "abc", "--api", "http://127.0.0.1:9", "--key-file", "fifo"), "--key-file: not a regular"),
        (
            ("plans", "get", "abc", "--api", "http://127.0.0.1:9", "--key-file", "/dev/zero"),
            "--key-file: not a regular",
        ),
    ],
    ids=["names-fifo", "names-dev-zero", "key-file-fifo", "key-file-dev-zero"],
)
def test_a_names_or_key_file_that_is_no_regular_file_is_one_line_not_a_hang(
    tmp_path: Path, args: tuple[str, ...], needle: str
) -> None:
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "ok.jsonl").write_text('{"text": "hello there"}\n', encoding="utf-8")
    done = _gpuplan(tmp_path, *args)
    _one_line(done, needle.replace("--key-file:", f"--key-file {args[-1]}:"))


LONG = "x" * 100_000


@pytest.mark.parametrize(
    ("args", "env", "needle"),
    [
        (("data", "upload", LONG, "--api", "http://127.0.0.1:9", "--key", "k"), {}, "file: no such file"),
        (("admin", "import-offers", LONG), {"GPUPLAN_DATABASE_URL": "sqlite:///db.sqlite"}, "import-offers: no file"),
        (("beat", "--check", "--schedule", LONG), {"GPUPLAN_REDIS_URL": "redis://127.0.0.1:9/0"}, "--schedule x"),
        (("agent", "--api", LONG, "--key", "k", "--once"), {}, "is not the http(s) URL of a service"),
        (("agent", "--api", "http://\x01", "--key", "k", "--once"), {}, "is not the http(s) URL of a service"),
    ],
    ids=["upload-long-name", "import-offers-long-name", "beat-schedule-long-name", "agent-api-long", "agent-api-ctrl"],
)
def test_a_path_or_url_the_system_refuses_is_one_line(
    tmp_path: Path, args: tuple[str, ...], env: dict[str, str], needle: str
) -> None:
    _one_line(_gpuplan(tmp_path, *args, env=env), needle)


@pytest.mark.parametrize(
    "args",
    [
        ("export", "--plan", "plan.json", "--format", "hf-trainer", "--gpu", "A100 80GB", "--out", ""),
        ("data", "check", "ok.jsonl", "--write-clean", ""),
        ("data", "check", "ok.jsonl", "--write-masked", " "),
    ],
    ids=["export-out", "write-clean", "write-masked"],
)
def test_an_empty_output_path_is_refused_not_ignored(tmp_path: Path, args: tuple[str, ...]) -> None:
    (tmp_path / "ok.jsonl").write_text('{"text": "hello there"}\n', encoding="utf-8")
    (tmp_path / "plan.json").write_text((REPO / "infra/examples/llama-3.1-8b-qlora.json").read_text(encoding="utf-8"))
    done = _gpuplan(tmp_path, *args)
    _one_line(done, f"{args[-2]}: no ")
    assert done.stdout == ""


def test_an_unknown_gpu_name_thousands_long_is_quoted_cut_short() -> None:
    # The error quoted a 100,000-character --gpu whole (and compared it with every card's name first).
    done = subprocess.run(
        [str(GPUPLAN), "estimate", "--model", "meta-llama/Llama-3.1-8B", "--method", "qlora", "--gpu", "x" * 100_000],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert len(done.stderr) < 2_000 and "unknown GPU 'xxx" in done.stderr and "…'" in done.stderr, done.stderr[:300]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (
            ("estimate", "--model", "meta-llama/Llama-3.1-8B", "--seq-len", "\uff11\uff10\uff12\uff14"),
            "--seq-len must be an integer",
        ),
        (("estimate", "--model", "meta-llama/Llama-3.1-8B", "--examples", "\u0663"), "--examples must be an integer"),
        (("estimate", "--model", "meta-llama/Llama-3.1-8B", "--examples", "1_000"), "--examples must be an integer"),
        (("estimate", "--model", "meta-llama/Llama-3.1-8B", "--epochs", "\uff11.\uff15"), "--epochs must be a number"),
        (("estimate", "--model", "meta-llama/Llama-3.1-8B", "--avg-tokens", "\u0663"), "--avg-tokens must be a number"),
        (("serve", "--port", "\uff18\uff10\uff10\uff10"), "--port must be an integer"),
        (("agent", "--api", "http://127.0.0.1:9", "--key", "k", "--once", "--job-pid", "\u0663"), "--job-pid must be"),
        (
            ("agent", "--api", "http://127.0.0.1:9", "--key", "k", "--once", "--interval", "\uff15"),
            "--interval must be",
        ),
    ],
    ids=[
        "seq-len-fullwidth",
        "examples-arabic-indic",
        "examples-underscore",
        "epochs",
        "avg-tokens",
        "port",
        "job-pid",
        "interval",
    ],
)
def test_a_number_flag_takes_ascii_digits_only(tmp_path: Path, args: tuple[str, ...], needle: str) -> None:
    # int() and float() read any Unicode decimal digit ('\uff11' full-width, '\u0663' Arabic-Indic) and '_' between
    # digits: such a flag was taken as the number, where the API's JSON reads ASCII digits alone (a fuzz).
    done = _gpuplan(tmp_path, *args)
    _one_line(done, needle)
    assert "(ASCII digits)" in done.stderr and done.stdout == ""
