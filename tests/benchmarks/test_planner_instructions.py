"""benchmarks/planner/instructions.py counts a plan's instructions under Valgrind: its reading of cachegrind's
output, its refusals of bad arguments, and the counted process itself (run here without Valgrind)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from benchmarks.planner import instructions


def test_reads_the_instruction_count_cachegrind_prints() -> None:
    output = (
        "==7740== Cachegrind, a high-precision tracing profiler\n==7740== \n==7740== I   refs:      1,936,932,768\n"
    )
    assert instructions.instructions(output) == 1_936_932_768
    with pytest.raises(ValueError):
        instructions.instructions("==1== no count here")


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--plans", "0"], "--plans: at least 1"),
        (["--only", "llama-3.1-8b_full,gpt-9"], "--only: not plans of run.py: gpt-9"),
        (["--child", "gpt-9"], "--child: not a plan of run.py"),
    ],
)
def test_bad_arguments_get_one_line_and_exit_2(args: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert instructions.main(args) == 2
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1


def test_the_counted_process_plans_and_exits_0() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.planner.instructions", "--child", "llama-3.1-8b_lora", "--plans", "1"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
