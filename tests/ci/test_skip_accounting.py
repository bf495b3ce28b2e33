"""CI fails on a skip that is not on the allow-list (tests/conftest.py ALLOWED_SKIPS)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"
ROOT = CONFTEST.parents[1]

TESTS = """
import pytest

def test_runs() -> None:
    assert True

def test_needs_a_package() -> None:
    pytest.importorskip("gpuplan_no_such_package")

@pytest.mark.parametrize("n", [1, 2])
def test_skips_itself(n: int) -> None:
    pytest.skip("not here")

@pytest.mark.xfail(reason="known")
def test_expected_failure() -> None:
    raise AssertionError
"""


def _pytest(tmp_path: Path, allowed: dict[str, str], **env: str) -> subprocess.CompletedProcess[str]:
    conftest = CONFTEST.read_text(encoding="utf-8")
    marker = "ALLOWED_SKIPS: dict[str, str] = {}"
    assert marker in conftest
    (tmp_path / "conftest.py").write_text(conftest.replace(marker, f"ALLOWED_SKIPS: dict[str, str] = {allowed!r}"))
    (tmp_path / "test_sample.py").write_text(TESTS)
    clean = {k: v for k, v in os.environ.items() if k not in ("CI", "GPUPLAN_REQUIRE_SERVICES")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**clean, "PYTHONPATH": str(ROOT), **env},
        timeout=120,
    )


def test_skips_pass_outside_ci(tmp_path: Path) -> None:
    result = _pytest(tmp_path, {})
    assert result.returncode == 0, result.stdout
    assert "3 skipped" in result.stdout and "unexpected skips" not in result.stdout


@pytest.mark.parametrize("env", [{"CI": "true"}, {"GPUPLAN_REQUIRE_SERVICES": "1"}])
def test_an_unlisted_skip_fails_under_ci(tmp_path: Path, env: dict[str, str]) -> None:
    result = _pytest(tmp_path, {"test_sample.py::test_skips_itself": "listed"}, **env)
    assert result.returncode == 1, result.stdout
    section = result.stdout.split("unexpected skips", 1)[1]
    assert "test_sample.py::test_needs_a_package: could not import 'gpuplan_no_such_package'" in section
    assert "test_skips_itself" not in section and "test_expected_failure" not in section
    assert "skip accounting: 2 allowed skip(s), 1 unexpected" in result.stdout


def test_listed_skips_pass_under_ci(tmp_path: Path) -> None:
    allowed = {"test_sample.py::test_skips_itself[1]": "one", "test_sample.py::test_needs_a_package": "why"}
    result = _pytest(tmp_path, allowed, CI="true")
    assert result.returncode == 1 and "test_sample.py::test_skips_itself[2]: not here" in result.stdout
    allowed["test_sample.py::test_skips_itself"] = "all parametrizations"
    assert _pytest(tmp_path, allowed, CI="true").returncode == 0
