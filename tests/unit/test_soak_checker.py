"""The soak's checker over synthetic histories: a clean one passes every invariant, and each
invariant catches the history that breaks it (each test fails if its check is removed)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from tests.soak import checker
from tests.soak.checker import Command, Contract, Explained, Snapshot

NOTE, REFUND, CONTACT = "crm.note.create", "billing.refund.create", "crm.contact.update"
CONTRACTS = {"crm": Contract("keyed", lookup=True), "billing": Contract("none", lookup=False)}


def _events(op: str, *types: str) -> dict[str, str]:
    return {f"{op}-e{i}": t for i, t in enumerate(types)}


def clean() -> tuple[list[dict[str, Any]], Snapshot]:
    """Three proposals: a note that succeeded, a refund held unknown after an attempt, a
    stale contact update sent back to review; a denied refund; one slot observation."""
    commands = {
        "n1": Command("n1", NOTE, "crm", "succeeded", "crm:note:1", None, 1),
        "r1": Command("r1", REFUND, "billing", "unknown", None, "answer lost", 1),
        "c1": Command("c1", CONTACT, "crm", "review_required", None, "precondition failed", 1),
    }
    ledger_audit = {
        "n1": _events("n1", "command.admitted", "command.claimed", "command.succeeded"),
        "r1": _events("r1", "approval.requested", "command.admitted", "command.claimed"),
        "c1": _events("c1", "approval.requested", "command.admitted", "command.claimed",
                      "command.review_required"),
    }
    history: list[dict[str, Any]] = [
        {"t": 0.1, "kind": "proposal", "operation_id": "n1", "action": NOTE, "acked": True},
        {"t": 0.2, "kind": "proposal", "operation_id": "r1", "action": REFUND, "acked": True},
        {"t": 0.3, "kind": "proposal", "operation_id": "c1", "action": CONTACT, "acked": True},
        {"t": 0.4, "kind": "proposal", "operation_id": "r2", "action": REFUND, "acked": True},
        {"t": 0.5, "kind": "proposal", "operation_id": "x1", "action": NOTE, "acked": True},
        {"t": 0.6, "kind": "admission", "operation_id": "x1", "status": "rejected"},
        {"t": 1.0, "kind": "decision", "operation_id": "r2", "approve": False, "result": "ok"},
        {"t": 1.1, "kind": "decision", "operation_id": "r1", "approve": True, "result": "ok"},
        {"t": 2.0, "kind": "state", "operation_id": "n1", "state": "pending"},
        {"t": 3.0, "kind": "state", "operation_id": "n1", "state": "succeeded"},
        {"t": 3.0, "kind": "state", "operation_id": "r1", "state": "unknown"},
        {"t": 3.0, "kind": "state", "operation_id": "c1", "state": "review_required"},
        # The slot confirmed past the snapshot's position, but the row owed then was swept.
        {"t": 4.0, "kind": "slot", "lsn": 100, "confirmed": 150,
         "before": [["command", "o1", "7"]], "after": []},
        # A row still owed, the slot behind the position where it was seen.
        {"t": 5.0, "kind": "slot", "lsn": 200, "confirmed": 150,
         "before": [["event", "o2", "8"]], "after": [["event", "o2", "8"]]},
    ]
    snap = Snapshot(
        commands=commands, contracts=CONTRACTS, effects={"n1": 1, "r1": 1},
        approvals={"r1": "approved", "c1": "approved", "r2": "denied"},
        published=frozenset(commands), ledger_audit=ledger_audit,
        topic_audit={op: frozenset(ids) for op, ids in ledger_audit.items()},
        explained={op: Explained(c.state, c.receipt, frozenset(ledger_audit[op]))
                   for op, c in commands.items()})
    return history, snap


def violations(history: list[dict[str, Any]], snap: Snapshot) -> dict[str, int]:
    return {f.name: f.violations for f in checker.check(history, snap) if f.violations}


def only(history: list[dict[str, Any]], snap: Snapshot, name: str) -> list[str]:
    """The examples of ``name``, asserting that no other invariant fired."""
    found = {f.name: f for f in checker.check(history, snap)}
    assert found[name].violations >= 1, found[name]
    others = {n: f.violations for n, f in found.items() if n != name and f.violations}
    assert others == {}, others
    return found[name].examples


def test_a_clean_history_violates_nothing() -> None:
    history, snap = clean()
    assert violations(history, snap) == {}
    assert [f.name for f in checker.check(history, snap)] == [
        "terminal_once", "proposals_answered", "effects_match", "unknown_allowed",
        "published", "audited", "slot_never_past_owed", "no_missing_dead_letters",
        "denied_never_admitted", "no_silent_contradiction"]


def _with_command(snap: Snapshot, cmd: Command, **extra: Any) -> Snapshot:
    return replace(snap, commands={**snap.commands, cmd.operation_id: cmd}, **extra)


@pytest.mark.parametrize("state,reason", [("dispatching", None), ("pending", None),
                                          ("unknown", None)])
def test_an_operation_that_never_settled(state: str, reason: str | None) -> None:
    history, snap = clean()
    snap = _with_command(snap, replace(snap.commands["r1"], state=state, reason=reason),
                         explained={**snap.explained, "r1": replace(snap.explained["r1"],
                                                                    state=state)})
    assert "r1" in only(history, snap, "terminal_once")[0]


def test_an_operation_seen_in_two_terminal_states() -> None:
    history, snap = clean()
    history.append({"t": 9.0, "kind": "state", "operation_id": "c1", "state": "failed"})
    assert "review_required, then failed" in only(history, snap, "terminal_once")[0]


def test_an_operation_that_left_its_terminal_state() -> None:
    history, snap = clean()
    history.append({"t": 9.0, "kind": "state", "operation_id": "n1", "state": "dispatching"})
    history.append({"t": 9.5, "kind": "state", "operation_id": "n1", "state": "succeeded"})
    assert "succeeded, then dispatching" in only(history, snap, "terminal_once")[0]


def test_an_acknowledged_proposal_that_vanished() -> None:
    history, snap = clean()
    history.append({"t": 9.0, "kind": "proposal", "operation_id": "lost", "action": NOTE,
                    "acked": True})
    history.append({"t": 9.1, "kind": "proposal", "operation_id": "never-acked", "action": NOTE,
                    "acked": False})
    [example] = only(history, snap, "proposals_answered")
    assert example.startswith("lost ")


@pytest.mark.parametrize("op,effects,wanted", [
    ("n1", 2, "succeeded with 2"),   # a duplicate effect
    ("n1", 0, "succeeded with 0"),   # an invented success
    ("r1", 2, "unknown with 2"),     # unknown, yet done twice
    ("zz", 1, "never admitted"),     # an effect no command accounts for
])
def test_provider_effects_that_do_not_match_the_ledger(op: str, effects: int, wanted: str) -> None:
    history, snap = clean()
    snap = replace(snap, effects={**snap.effects, op: effects})
    assert wanted in only(history, snap, "effects_match")[0]


def test_an_effect_of_a_command_decided_otherwise_is_never_silent() -> None:
    # Issue 37: the ledger says it did not happen, the provider holds it, nothing says so.
    history, snap = clean()
    snap = replace(snap, effects={**snap.effects, "c1": 1})
    [example] = only(history, snap, "no_silent_contradiction")
    assert "review_required" in example and "nothing says so" in example
    # Flagged by the ledger, on a provider that cannot fence: recorded, allowed.
    flagged = replace(snap.commands["c1"], contradicted=True)
    unfenced = {**snap.contracts, flagged.connector: replace(
        snap.contracts[flagged.connector], fencing=False)}
    allowed = replace(snap, commands={**snap.commands, "c1": flagged}, contracts=unfenced)
    assert all(f.violations == 0 for f in checker.check(history, allowed))
    assert checker.contradictions(allowed) == 1
    # The same on a provider that fences: its late call should have been refused.
    fenced = {**snap.contracts, flagged.connector: replace(
        snap.contracts[flagged.connector], fencing=True)}
    refused = replace(allowed, contracts=fenced)
    assert "whose provider fences" in only(history, refused, "no_silent_contradiction")[0]


def test_a_stray_provider_effect() -> None:
    history, snap = clean()
    snap = replace(snap, stray_effects=("note.created key=None effect=9",))
    assert "no operation accounts for" in only(history, snap, "effects_match")[0]


def test_unknown_on_a_connector_with_lookup_not_held_for_an_operator() -> None:
    history, snap = clean()
    cmd = Command("n2", NOTE, "crm", "unknown", None, "lookup failed", 2)
    snap = _with_command(snap, cmd, published=snap.published | {"n2"},
                         explained={**snap.explained, "n2": Explained("unknown", None, frozenset())})
    assert "not held for an operator" in only(history, snap, "unknown_allowed")[0]
    held = replace(cmd, reason="retry cap: 90 dispatch generations without a definitive answer")
    assert violations(history, _with_command(snap, held)) == {}


def test_unknown_without_any_attempt() -> None:
    history, snap = clean()
    snap = _with_command(snap, replace(snap.commands["r1"], attempts=0))
    assert "no attempt" in only(history, snap, "unknown_allowed")[0]


def test_an_admitted_command_never_published() -> None:
    history, snap = clean()
    snap = replace(snap, published=frozenset({"n1", "r1"}))
    assert "c1" in only(history, snap, "published")[0]


@pytest.mark.parametrize("op,drop", [("n1", "command.succeeded"), ("c1", "command.admitted")])
def test_a_terminal_command_without_its_audit_events(op: str, drop: str) -> None:
    history, snap = clean()
    events = {i: t for i, t in snap.ledger_audit[op].items() if t != drop}
    snap = replace(snap, ledger_audit={**snap.ledger_audit, op: events},
                   topic_audit={**snap.topic_audit, op: frozenset(events)},
                   explained={**snap.explained, op: replace(snap.explained[op],
                                                            event_ids=frozenset(events))})
    assert f"without a {drop}" in only(history, snap, "audited")[0]


def test_an_audit_event_that_never_reached_the_topic() -> None:
    history, snap = clean()
    snap = replace(snap, topic_audit={**snap.topic_audit, "n1": frozenset({"n1-e0"})})
    assert "never reached the audit topic" in only(history, snap, "audited")[0]


def test_an_audit_record_that_names_no_operation_reached_the_topic_but_is_flagged() -> None:
    # The soak's false alarm: a redelivered proposal's `proposal.rejected` event reached the
    # topic, but its record named no operation, and was counted as never published.
    history, snap = clean()
    kept = frozenset(snap.topic_audit["n1"] - {"n1-e0"})
    snap = replace(snap, topic_audit={**snap.topic_audit, "n1": kept, "": frozenset({"n1-e0"})})
    found = only(history, snap, "audited")
    assert len(found) == 1 and "do not name their operation" in found[0]


@pytest.mark.parametrize("said", [Explained("pending", None, frozenset()),
                                  Explained("succeeded", "crm:note:other", frozenset()),
                                  Explained("succeeded", "crm:note:1", frozenset({"n1-e0"}))])
def test_explain_disagrees_with_the_ledger(said: Explained) -> None:
    history, snap = clean()
    snap = replace(snap, explained={**snap.explained, "n1": said})
    assert "explain" in only(history, snap, "audited")[0]


def test_the_slot_confirmed_past_a_row_still_owed() -> None:
    history, snap = clean()
    history.append({"t": 9.0, "kind": "slot", "lsn": 300, "confirmed": 300,
                    "before": [["command", "o3", "9"], ["event", "o4", "9"]],
                    "after": [["command", "o3", "9"]]})
    assert "1 rows owed" in only(history, snap, "slot_never_past_owed")[0]


def test_a_row_replaced_by_a_new_version_is_not_owed_past_the_slot() -> None:
    # Same outbox id, another xmin: the requeue's new obligation, not the row seen before.
    history, snap = clean()
    history.append({"t": 9.0, "kind": "slot", "lsn": 300, "confirmed": 400,
                    "before": [["command", "o3", "9"]], "after": [["command", "o3", "12"]]})
    assert violations(history, snap) == {}


def test_an_exec_record_dead_lettered_as_missing() -> None:
    history, snap = clean()
    snap = replace(snap, missing_dead_letters=2)
    assert len(only(history, snap, "no_missing_dead_letters")) == 2


def test_a_denied_request_that_was_admitted() -> None:
    history, snap = clean()
    cmd = Command("r2", REFUND, "billing", "succeeded", "billing:refund:9", None, 1)
    events = _events("r2", "command.admitted", "command.succeeded")
    snap = _with_command(snap, cmd, effects={**snap.effects, "r2": 1}, published=snap.published
                         | {"r2"}, ledger_audit={**snap.ledger_audit, "r2": events},
                         topic_audit={**snap.topic_audit, "r2": frozenset(events)},
                         explained={**snap.explained, "r2": Explained(
                             "succeeded", "billing:refund:9", frozenset(events))})
    assert "r2" in only(history, snap, "denied_never_admitted")[0]
