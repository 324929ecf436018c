"""The command's fields are defined once (``ledger.NewCommand``) and built from what holds them."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from agentledger.contracts import common, outcomes
from agentledger.ledger import repository


def _command() -> repository.NewCommand:
    return repository.NewCommand(
        tenant_id=uuid.uuid4(), operation_id=uuid.uuid4(), request_hash=b"\x01" * 32,
        principal_id="user:alice", action="crm.note.create", connector="crm",
        resource_id="cust-1", expected_revision="r-3", decision_id=uuid.uuid4(),
        policy_version="cedar/sha256:p", allowlist_version="sha256:a",
        expires_at=datetime.now(UTC) + timedelta(hours=1), payload_ciphertext=b"sealed",
        payload_key_version=2, traceparent="00-" + "a" * 32 + "-" + "b" * 16 + "-01")


def test_a_stored_request_becomes_its_command_under_the_approvers_decision() -> None:
    pending = _command()
    # Anything naming the fields (a stored approval request) holds the command; extra
    # attributes of the holder (its state, risk, ...) are not part of it.
    holder = SimpleNamespace(**{f.name: getattr(pending, f.name)
                                for f in dataclasses.fields(pending)}, risk="high")
    decision = uuid.uuid4()
    approved = repository.NewCommand.of(holder, decision_id=decision, policy_version="v2")
    assert approved == dataclasses.replace(pending, decision_id=decision, policy_version="v2")


def test_a_change_naming_no_field_is_refused() -> None:
    with pytest.raises(TypeError):
        repository.NewCommand.of(_command(), decison_id=uuid.uuid4())


def test_the_command_is_frozen_and_has_no_instance_dict() -> None:
    command = _command()
    with pytest.raises(dataclasses.FrozenInstanceError):
        command.action = "other"  # type: ignore[misc]
    assert not hasattr(command, "__dict__")


def test_reasons_are_cut_to_the_named_limit_everywhere_they_are_kept() -> None:
    long = "x" * (common.REASON_MAX + 40)
    cut = common.reason_text(long)
    # Cut to the bound, and what was cut named by a digest of the whole (issue 38): two
    # reasons that differ only past the bound stay different.
    assert len(cut) == common.REASON_MAX and cut.startswith("x" * 400)
    assert "sha256:" in cut and cut != common.reason_text(long + "y")
    assert common.reason_text("short") == "short"
    payload = outcomes.event_payload(uuid.uuid4(), uuid.uuid4(), "denied", None, long)
    assert payload is not None and len(payload["outcome"]["reason"]) == common.REASON_MAX


@pytest.mark.parametrize("raw", ["a\x00b", "\ud800x", "line\nbreak\r\t", "\x1b[31mred", "\x85"])
def test_a_reason_from_outside_is_made_storable(raw: str) -> None:
    kept = common.reason_text(raw)
    assert common.UNSTORABLE.search(kept) is None
    assert not any(ord(c) < 0x20 or 0x7f <= ord(c) <= 0x9f for c in kept), kept
    kept.encode("utf-8")  # no lone surrogate left


@pytest.mark.parametrize("raw", ["", "   ", "\x00", "r" * 600, "ok\x00", 42, None])
def test_a_receipt_from_outside_is_storable_bounded_and_never_empty(raw: object) -> None:
    kept = outcomes.receipt_text(raw, "op-1")
    assert 1 <= len(kept) <= outcomes.RECEIPT_MAX
    assert common.UNSTORABLE.search(kept) is None
    outcomes.Succeeded(receipt=kept)  # the contract takes it
    if isinstance(raw, str) and not raw.strip("\x00 "):
        assert "op-1" in kept  # a provider that named nothing: the key, said so


def test_one_mapping_from_a_recorded_state_to_its_outcome() -> None:
    op = uuid.uuid4()
    assert outcomes.of_state(op, "pending", None, "pending") is None
    assert outcomes.of_state(op, "dispatching", None, "dispatching") is None
    assert outcomes.of_state(op, "unknown", None, "x") == outcomes.Unknown(operation_id=op)
    assert outcomes.of_state(op, "succeeded", "r-1", "x") == outcomes.Succeeded(receipt="r-1")
    assert outcomes.of_state(op, "failed", None, "gone") == outcomes.Failed(reason="gone")
