"""A two-minute soak (tests/soak, issue 19 §4) under `make chaos`, so the soak cannot rot
between long runs: its own private stack, the mixed load, the fault scheduler, the checker.
The checker itself is unit-tested in tests/unit/test_soak_checker.py (plain `make test`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.soak import runner

MINUTES = 2.0


@pytest.mark.chaos_full
def test_a_two_minute_soak_violates_no_invariant(tmp_path: Path) -> None:
    code = runner.run(MINUTES, seed=19, out=tmp_path)
    found = json.loads((tmp_path / "soak.json").read_text())
    summary = {name: r for name, r in found["invariants"].items() if r["violations"]}
    assert code == 0 and found["ok"], (summary, found["operations"], found["faults"],
                                       found["errors"], found.get("service_logs"))
    # The soak did something: load through faults, every kind of outcome the mix makes.
    assert found["faults"]["injected"] >= 2, found["faults"]
    assert found["operations"]["by_final_state"].get("succeeded", 0) >= 20, found["operations"]
    assert (tmp_path / "soak.png").stat().st_size > 0
