"""The soak report's arithmetic: how each proposal ended, throughput per 10 s bucket."""

from __future__ import annotations

from typing import Any

from tests.soak import report
from tests.soak.checker import Command, Snapshot

HISTORY: list[dict[str, Any]] = [
    {"t": 1.0, "kind": "proposal", "operation_id": "a", "action": "n", "acked": True},
    {"t": 2.0, "kind": "proposal", "operation_id": "b", "action": "c", "acked": True},
    {"t": 3.0, "kind": "proposal", "operation_id": "c", "action": "r", "acked": True},
    {"t": 4.0, "kind": "proposal", "operation_id": "d", "action": "r", "acked": False},
    {"t": 5.0, "kind": "admission", "operation_id": "b", "status": "rejected",
     "reason_code": "stale_revision"},
    {"t": 12.0, "kind": "state", "operation_id": "a", "state": "succeeded"},
    {"t": 25.0, "kind": "proposal", "operation_id": "e", "action": "n", "acked": True},
]


def test_each_proposal_ends_as_a_state_a_refusal_a_decision_or_nothing() -> None:
    snap = Snapshot(commands={"a": Command("a", "n", "crm", "succeeded")}, contracts={},
                    effects={}, approvals={"c": "denied"})
    assert report.outcomes(HISTORY, snap) == {
        "a": ("n", "succeeded"), "b": ("c", "rejected:stale_revision"),
        "c": ("r", "approval denied"), "d": ("r", "not acknowledged"), "e": ("n", "no answer")}


def test_throughput_counts_acknowledged_proposals_and_terminal_states_per_bucket() -> None:
    starts, acked, done = report.throughput(HISTORY)
    assert (starts, acked, done) == ([0, 10, 20], [3, 0, 1], [0, 1, 0])


def test_a_soak_whose_load_died_is_not_ok_even_with_every_invariant_held() -> None:
    snap = Snapshot(commands={}, contracts={}, effects={}, approvals={})
    fields: dict[str, Any] = {"minutes": 1.0, "seed": 1, "history": HISTORY, "snap": snap,
                              "findings": [], "settled": True, "errors": [], "seconds": 60.0}
    assert report.summary(**fields)["ok"] is True
    died = report.summary(**fields, load_intact=False)
    assert (died["ok"], died["load_intact"]) == (False, False)


def test_recovery_times_the_commands_a_fault_caught_until_the_last_is_terminal_again() -> None:
    history: list[dict[str, Any]] = [
        {"t": 1.0, "kind": "state", "operation_id": "a", "state": "pending"},
        {"t": 1.5, "kind": "state", "operation_id": "b", "state": "dispatching"},
        {"t": 2.0, "kind": "state", "operation_id": "c", "state": "succeeded"},  # done before
        {"t": 3.0, "kind": "fault", "phase": "struck", "fault": "kill:relay"},
        {"t": 4.0, "kind": "state", "operation_id": "e", "state": "pending"},  # during
        {"t": 5.0, "kind": "state", "operation_id": "e", "state": "succeeded"},
        {"t": 10.0, "kind": "fault", "phase": "healed", "fault": "kill:relay"},
        {"t": 11.0, "kind": "state", "operation_id": "d", "state": "pending"},  # after the heal
        {"t": 12.0, "kind": "state", "operation_id": "a", "state": "succeeded"},
        {"t": 14.5, "kind": "state", "operation_id": "b", "state": "unknown"},  # in doubt: done
        {"t": 20.0, "kind": "fault", "phase": "struck", "fault": "kill:relay"},
        {"t": 21.0, "kind": "fault", "phase": "healed", "fault": "kill:relay"},  # d never ends
        {"t": 29.0, "kind": "fault", "phase": "struck", "fault": "broker:stop"},
        {"t": 30.0, "kind": "fault", "phase": "healed", "fault": "broker:stop"},
    ]
    assert report.recovery(history) == {
        "broker:stop": {"instances": 1, "commands_caught_max": 1,
                        "seconds_after_heal_max": None,
                        "seconds_after_heal_median": None, "never": 1},
        "kill:relay": {"instances": 2, "commands_caught_max": 3,
                       "seconds_after_heal_max": 4.5,
                       "seconds_after_heal_median": 4.5, "never": 1},
    }
