from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.cli.main import main

EXAMPLE = Path(__file__).resolve().parents[2] / "infra" / "examples" / "llama-3.1-8b-qlora.json"


def test_export_writes_the_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    assert main(["export", "--plan", str(EXAMPLE), "--format", "hf-trainer", "--out", str(out)]) == 0
    assert {"train.py", "hf_args.json", "launch.sh"} <= {p.name for p in out.iterdir()}
    json.loads((out / "hf_args.json").read_text())
    compile((out / "train.py").read_text(), "train.py", "exec")
    assert "start with:" in capsys.readouterr().out


def test_export_for_a_given_card(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", "--plan", str(EXAMPLE), "--format", "accelerate", "--gpu", "a100-80gb"]) == 0
    assert "A100 80GB" in capsys.readouterr().out


def test_export_refusals_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", "--plan", str(EXAMPLE), "--format", "torchtune"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("gpuplan: error: framework:")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("keep me")
    assert main(["export", "--plan", str(EXAMPLE), "--format", "hf-trainer", "--out", str(tmp_path / "busy")]) == 2
    assert (tmp_path / "busy" / "x").read_text() == "keep me"
