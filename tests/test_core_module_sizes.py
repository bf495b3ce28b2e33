"""The estimator and the planner stay split by concern (issue 24, step 2): no module of either over about 500 lines.

A module that grows past the limit holds more than one concern; split it (docs/architecture.md, "The core's
layout", names what each module holds) rather than raise the limit.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORE = ("services/estimator", "services/planner")
# "About 500": a module may pass 500 by a docstring line or two; beyond this it has grown a concern.
MAX_LINES = 520


def test_no_estimator_or_planner_module_is_over_the_limit() -> None:
    sizes = {
        path.relative_to(ROOT).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
        for folder in CORE
        for path in sorted((ROOT / folder).rglob("*.py"))
    }
    assert len(sizes) > 40  # the packages were found
    over = {name: lines for name, lines in sizes.items() if lines > MAX_LINES}
    assert not over, f"split these modules by concern (at most {MAX_LINES} lines): {over}"
