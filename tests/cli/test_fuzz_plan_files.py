"""A plan file a bounded fuzzing pass of the console command found answered with Python's own advice: an integer
literal past Python's 4,300-digit limit. It is one line naming the field, and exit 2."""

from __future__ import annotations

from pathlib import Path

from tests.cli.test_bad_input_probe import _gpuplan, _one_line


def test_an_integer_literal_past_pythons_digit_limit_names_its_field(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text('{"model": {"name": "meta-llama/Llama-3.1-8B"}, "seq_len": 1' + "0" * 5000 + "}")
    done = _gpuplan(tmp_path, "estimate", "--plan", str(plan))
    _one_line(done, "seq_len: integer too large")
    assert "sys." not in done.stderr, done.stderr
