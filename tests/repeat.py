"""Flake finder: run test tiers N times on one stack and tally every test's outcomes.

    make test-repeat N=5                                  # integration, e2e and chaos
    make test-repeat N=10 TIERS="tests/e2e tests/chaos"   # or any pytest paths

The stack is chosen once, as the suite chooses it (tests/stack.py: local processes started
if needed and stopped at the end only if this command started them), and every run reuses it
through AGENTLEDGER_DATABASE_URL / AGENTLEDGER_KAFKA_BOOTSTRAP. Each run is its own pytest process (fresh module
fixtures, fresh databases and topics) writing a JUnit XML report; the reports of every run
and the output of the failing ones stay in reports/repeat/ for diagnosis. The table lists,
per test, passes, failures and skips over the runs and the slowest duration; the exit code
is non-zero when any test failed in any run.

Written here rather than with pytest-repeat or pytest-flakefinder: both repeat tests inside
one session, where module-scoped fixtures (a whole pipeline of services) are shared across
repetitions, which hides exactly the start-up races this is meant to find.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from tests import stack as stack_mod

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "reports" / "repeat"
DEFAULT_TIERS = ["tests/integration", "tests/e2e", "tests/chaos"]


@dataclass
class Tally:
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    slowest: float = 0.0
    failed_runs: list[int] = field(default_factory=list)


def _cases(report: Path) -> list[ET.Element]:
    # Our own pytest's report of this run, not untrusted input.
    return list(ET.parse(report).iter("testcase"))  # noqa: S314


def tally(reports: list[Path], into: dict[str, Tally]) -> None:
    """Add the test cases of JUnit XML ``reports`` (run i = reports[i-1]) to ``into``."""
    for run, report in enumerate(reports, start=1):
        if not report.exists():
            continue
        for case in _cases(report):
            name = f"{case.get('classname', '')}::{case.get('name', '')}"
            t = into.setdefault(name, Tally())
            t.slowest = max(t.slowest, float(case.get("time") or 0))
            if case.find("failure") is not None or case.find("error") is not None:
                t.failed += 1
                t.failed_runs.append(run)
            elif case.find("skipped") is not None:
                t.skipped += 1
            else:
                t.passed += 1


def table(tallies: dict[str, Tally], runs: int) -> str:
    width = max([len(n) for n in tallies] + [4])
    lines = [f"{'test':<{width}}  {'pass':>4} {'fail':>4} {'skip':>4} {'slowest_s':>9}  failed in runs"]
    # Failures first, then the slowest: what needs a look is at the top.
    for name, t in sorted(tallies.items(), key=lambda kv: (-kv[1].failed, -kv[1].slowest)):
        runs_failed = ",".join(map(str, t.failed_runs))
        lines.append(f"{name:<{width}}  {t.passed:>4} {t.failed:>4} {t.skipped:>4} {t.slowest:>9.1f}  {runs_failed}")
    failed = sum(1 for t in tallies.values() if t.failed)
    lines.append(f"{len(tallies)} tests x {runs} runs: {failed} tests failed at least once")
    return "\n".join(lines)


def tier_seconds(reports: list[Path]) -> dict[str, float]:
    """Mean wall-clock seconds per tier (first path component under tests/) over the runs."""
    totals: dict[str, float] = defaultdict(float)
    n = 0
    for report in reports:
        if not report.exists():
            continue
        n += 1
        for case in _cases(report):
            tier = (case.get("classname") or "").split(".")[1:2] or ["?"]
            totals[tier[0]] += float(case.get("time") or 0)
    return {tier: total / max(n, 1) for tier, total in sorted(totals.items())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("paths", nargs="*", default=DEFAULT_TIERS)
    parser.add_argument("--pytest-args", default="", help="extra pytest arguments, one string")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")

    OUT.mkdir(parents=True, exist_ok=True)
    for old in OUT.glob("run-*"):
        old.unlink()
    reports: list[Path] = []
    # The suite's own choice of stack (given URLs, Docker, or the local processes, started if
    # needed and stopped after only if this started them), shared by every run.
    with stack_mod.choose() as chosen:
        env = {**os.environ, "AGENTLEDGER_DATABASE_URL": chosen.database_url,
               "AGENTLEDGER_KAFKA_BOOTSTRAP": chosen.kafka_bootstrap}
        for run in range(1, args.runs + 1):
            report, log = OUT / f"run-{run}.xml", OUT / f"run-{run}.log"
            began = time.monotonic()
            with log.open("wb") as out:
                rc = subprocess.run(
                    [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                     f"--junitxml={report}", *args.pytest_args.split(), *args.paths],
                    cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
            reports.append(report)
            summary = log.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
            print(f"run {run}/{args.runs}: rc={rc} in {time.monotonic() - began:.0f} s: {summary[0]}",
                  flush=True)
            if rc == 0:
                log.unlink()  # keep the output of failing runs only
    tallies: dict[str, Tally] = {}
    tally(reports, tallies)
    print(table(tallies, args.runs))
    print("mean seconds per tier and run: " + ", ".join(f"{k} {v:.0f}" for k, v in tier_seconds(reports).items()))
    print(f"reports: {OUT.relative_to(ROOT)}/run-*.xml (and run-*.log of failing runs)")
    return 1 if any(t.failed for t in tallies.values()) or not tallies else 0


if __name__ == "__main__":
    sys.exit(main())
