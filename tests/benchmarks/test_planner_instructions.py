"""benchmarks/planner/instructions.py counts a plan's instructions under Valgrind: its reading of cachegrind's
output, its refusals of bad arguments, and the counted process itself (run here without Valgrind)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

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


def test_functions_prints_where_one_plans_bytecodes_go(capsys: pytest.CaptureFixture[str]) -> None:
    assert instructions.main(["--functions", "3", "--only", "llama-3.1-8b_lora"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("llama-3.1-8b_lora@generated_5000: ") and lines[0].endswith(" bytecodes in one plan")
    assert len(lines) == 4 and all("bytecodes" in line and "calls" in line for line in lines[1:])


def test_bytecodes_add_up_and_the_tracer_before_is_put_back() -> None:
    def before(frame: object, event: str, arg: object) -> None:
        return None

    previous = sys.gettrace()
    sys.settrace(before)
    try:
        total, rows = instructions.bytecodes_by_function("llama-3.1-8b_lora")
        assert sys.gettrace() is before
    finally:
        sys.settrace(previous)
    assert rows[0][1] >= rows[1][1] >= rows[-1][1] > 0 and sum(count for _, count, _ in rows) == total
    assert any(where.endswith(" plan_setups") for where, _, _ in rows)


def test_without_valgrind_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(instructions.shutil, "which", lambda name: None)
    assert instructions.main(["--only", "llama-3.1-8b_lora"]) == 2
    assert capsys.readouterr().err.strip() == "valgrind is not installed (apt-get install -y valgrind)"


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_counts_a_plans_instructions_under_valgrind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(instructions, "RESULTS", tmp_path)
    assert instructions.main(["--only", "llama-3.1-8b_lora", "--plans", "1"]) == 0
    rows = json.loads((tmp_path / "planner_instructions.json").read_text(encoding="utf-8"))
    counted = rows["llama-3.1-8b_lora@generated_5000"]["instructions_per_plan"]
    assert 10_000_000 < counted < 2_000_000_000  # a plan is tens to hundreds of millions of instructions
    assert rows["_machine"]["hash_seed"] == 0 and rows["_machine"]["blas_threads"] == 1
