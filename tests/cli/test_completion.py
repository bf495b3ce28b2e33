"""Shell completion generated from the parser, and --help examples, through the installed console script."""

from __future__ import annotations

import subprocess

from tests.cli.test_console import gpuplan


def _complete(script: str, *words: str) -> list[str]:
    """What bash offers after ``words`` (the last is the word being completed)."""
    quoted = " ".join(f"'{w}'" for w in words)
    program = f"""{script}
COMP_WORDS=({quoted}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); COMPREPLY=(); _gpuplan
printf '%s\\n' "${{COMPREPLY[@]}}"
"""
    out = subprocess.run(["bash", "-c", program], capture_output=True, text=True, check=True).stdout
    return [w for w in out.splitlines() if w]


def test_bash_completes_commands_subcommands_flags_and_choices() -> None:
    made = gpuplan("completion", "bash")
    assert made.returncode == 0, made.stderr
    script = made.stdout
    assert "complete -o default -F _gpuplan gpuplan" in script
    assert _complete(script, "gpuplan", "est") == ["estimate"]
    assert "export" in _complete(script, "gpuplan", "e")
    assert _complete(script, "gpuplan", "estimate", "--meth") == ["--method"]
    assert _complete(script, "gpuplan", "estimate", "--method", "") == ["full", "lora", "qlora"]
    assert set(_complete(script, "gpuplan", "plans", "")) >= {"submit", "get"}
    assert "--wait" in _complete(script, "gpuplan", "plans", "submit", "--w")
    assert "--gpu" in _complete(script, "gpuplan", "estimate", "--model", "x", "--gpu")


def test_help_shows_examples_that_run() -> None:
    for command in (["estimate"], ["plans", "submit"], ["agent"], ["serve"], ["data", "upload"]):
        shown = gpuplan(*command, "--help")
        assert shown.returncode == 0 and "examples:" in shown.stdout, command
    example = gpuplan("estimate", "--model", "meta-llama/Llama-3.1-8B", "--method", "qlora", "--seq-len", "2048")
    assert example.returncode == 0, example.stderr
    assert gpuplan("completion", "fish").returncode == 2  # one readable line, like every bad argument
