"""The flake finder's tally (tests/repeat.py): outcomes per test over runs, failures first."""

from __future__ import annotations

from pathlib import Path

from tests import repeat


def _junit(path: Path, cases: list[tuple[str, str, float]]) -> Path:
    body = []
    for name, outcome, seconds in cases:
        inner = {"passed": "", "failed": "<failure message='x'/>", "error": "<error message='x'/>",
                 "skipped": "<skipped message='x'/>"}[outcome]
        body.append(f'<testcase classname="tests.e2e.test_x" name="{name}" time="{seconds}">{inner}</testcase>')
    path.write_text(f'<testsuites><testsuite name="pytest">{"".join(body)}</testsuite></testsuites>')
    return path


def test_tally_counts_each_outcome_per_test_and_keeps_the_slowest(tmp_path: Path) -> None:
    runs = [_junit(tmp_path / "1.xml", [("a", "passed", 1.0), ("b", "passed", 2.0), ("c", "skipped", 0)]),
            _junit(tmp_path / "2.xml", [("a", "failed", 3.5), ("b", "passed", 1.0), ("c", "skipped", 0)]),
            _junit(tmp_path / "3.xml", [("a", "error", 0.5), ("b", "passed", 1.5), ("c", "skipped", 0)]),
            tmp_path / "missing.xml"]  # a run that died before writing its report counts nothing
    tallies: dict[str, repeat.Tally] = {}
    repeat.tally(runs, tallies)
    a, b, c = (tallies[f"tests.e2e.test_x::{n}"] for n in "abc")
    assert (a.passed, a.failed, a.skipped, a.slowest, a.failed_runs) == (1, 2, 0, 3.5, [2, 3])
    assert (b.passed, b.failed, b.slowest) == (3, 0, 2.0)
    assert (c.passed, c.skipped) == (0, 3)
    lines = repeat.table(tallies, 3).splitlines()
    assert "test_x::a" in lines[1]  # failures first
    assert lines[-1] == "3 tests x 3 runs: 1 tests failed at least once"
    assert repeat.tier_seconds(runs) == {"e2e": (3.0 + 4.5 + 2.0) / 3}
