"""Message models reject unknown fields, over-long strings and loose types (SPEC §0, R1.3)."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from agentledger import errors, sql
from agentledger.contracts import (
    admission,
    commands,
    common,
    dlq,
    exec,
    outcomes,
    proposals,
    topics,
)
from agentledger.kafka import handling

NOW = datetime(2026, 1, 1, tzinfo=UTC)
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def proposal(**overrides: Any) -> dict[str, Any]:
    """A valid proposal as a gateway would send it: plain JSON types."""
    return {
        "schema": "agentledger.proposal.v1",
        "proposal_id": str(uuid.uuid4()),
        "tenant_id": str(uuid.uuid4()),
        "principal_id": "user:alice@example.com",
        "operation_id": str(uuid.uuid4()),
        "action": "crm.note.create",
        "arguments": {"customer_id": "c1", "body": "hello"},
        "target": "c1",
        "planner": {"name": "rules", "model": None},
        "created_at": NOW.isoformat(),
        **overrides,
    }


def command(**overrides: Any) -> dict[str, Any]:
    return {
        "tenant_id": str(uuid.uuid4()),
        "operation_id": str(uuid.uuid4()),
        "principal_id": "user:1",
        "action": "crm.note.create",
        "connector": "crm",
        "resource_id": "c1",
        "payload": {"customer_id": "c1", "body": "hello"},
        "request_hash": "ab" * 32,
        "authorization_decision_id": str(uuid.uuid4()),
        "policy_version": "policy-1",
        "allowlist_version": "sha256:" + "0" * 64,
        "expires_at": (NOW + timedelta(hours=1)).isoformat(),
        **overrides,
    }


# --- proposals ----------------------------------------------------------------------------


def test_proposal_parses_from_dict_and_json_and_round_trips() -> None:
    raw = proposal(expected_revision='W/"7"', evidence_refs=["doc:1"], shadow=True)
    parsed = proposals.ProposalV1.model_validate(raw)
    assert parsed.schema_ == "agentledger.proposal.v1"
    assert proposals.ProposalV1.model_validate_json(json.dumps(raw)) == parsed
    dumped = parsed.model_dump(mode="json")
    assert dumped["schema"] == "agentledger.proposal.v1"
    assert proposals.ProposalV1.model_validate_json(parsed.model_dump_json()) == parsed


@pytest.mark.parametrize("extra", [{"surprise": 1}, {"planner": {"name": "x", "temp": 1}}])
def test_proposal_unknown_fields_are_rejected(extra: dict[str, Any]) -> None:
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        proposals.ProposalV1.model_validate(proposal(**extra))


@pytest.mark.parametrize(
    "overrides",
    [
        {"principal_id": "u" * 129},
        {"principal_id": "has space"},
        {"action": "a." + "b" * 63},
        {"action": "Crm.Note"},
        {"action": "nodot"},
        {"target": "t" * 129},
        {"expected_revision": "r" * 65},
        {"expected_revision": ""},
        {"evidence_refs": ["e"] * 33},
        {"evidence_refs": ["e" * 257]},
        {"identity": "i" * 4097},
        {"planner": {"name": "n" * 65}},
        {"arguments": {"k" * 65: 1}},
        {"arguments": {"body": "x" * 40_000}},
        {"arguments": {f"k{i}": i for i in range(65)}},
        {"schema": "agentledger.proposal.v2"},
        {"created_at": "2026-01-01T00:00:00"},  # naive: ambiguous across services
        {"tenant_id": "acme"},
    ],
)
def test_proposal_bounds_are_enforced(overrides: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        proposals.ProposalV1.model_validate(proposal(**overrides))


@pytest.mark.parametrize("overrides", [{"shadow": "true"}, {"shadow": 1}, {"principal_id": 5}])
def test_proposal_types_are_strict(overrides: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        proposals.ProposalV1.model_validate(proposal(**overrides))


def test_proposal_is_frozen() -> None:
    parsed = proposals.ProposalV1.model_validate(proposal())
    with pytest.raises(ValidationError):
        parsed.target = "other"  # type: ignore[misc]


# --- commands -----------------------------------------------------------------------------


def test_command_parses_and_knows_its_expiry() -> None:
    cmd = commands.ApprovedCommand.model_validate(command())
    assert not cmd.is_expired(NOW)
    assert cmd.is_expired(NOW + timedelta(hours=2))


@pytest.mark.parametrize(
    "overrides",
    [
        {"request_hash": "AB" * 32},
        {"request_hash": "ab" * 31},
        {"connector": "CRM"},
        {"policy_version": "p" * 129},
        {"payload": {"x": "y" * 40_000}},
        {"unexpected": True},
    ],
)
def test_command_bounds_are_enforced(overrides: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        commands.ApprovedCommand.model_validate(command(**overrides))


def test_command_states() -> None:
    assert commands.COMMAND_STATES == {
        "pending", "dispatching", "succeeded", "denied", "expired", "unknown",
        "review_required", "failed"}
    assert "unknown" not in commands.TERMINAL_STATES
    assert commands.TERMINAL_STATES < commands.COMMAND_STATES


_REPO = Path(__file__).resolve().parents[2]


def _quoted(text: str) -> set[str]:
    return set(re.findall(r"'([a-z_]+)'", re.sub(r"--[^\n]*", "", text)))


def test_sql_state_lists_agree_with_the_one_definition() -> None:
    """The SQL spells the states out (a CHECK, retention's filter); they must be these."""
    checks = [m.group(1) for f in sorted((_REPO / "migrations").glob("*.sql"))
              for m in re.finditer(r"agent_command_state_check CHECK \(state IN \((.*?)\)\);",
                                   f.read_text(), re.S)]
    assert checks and _quoted(checks[-1]) == commands.COMMAND_STATES
    purge = sql.load(_REPO / "libs/agentledger/ledger/queries.sql")["purge_payloads"]
    found = re.search(r"state IN \((.*?)\)", purge)
    assert found is not None and _quoted(found.group(1)) == commands.TERMINAL_STATES


# --- outcomes -----------------------------------------------------------------------------

OUTCOMES: list[outcomes.Outcome] = [
    outcomes.Succeeded(receipt="note_123"),
    outcomes.Denied(reason="policy"),
    outcomes.Expired(reason="approval expired"),
    outcomes.Unknown(operation_id=uuid.uuid4()),
    outcomes.ReviewRequired(reason="revision changed"),
    outcomes.Failed(reason="operator: provider has no record"),
]


@pytest.mark.parametrize("outcome", OUTCOMES, ids=lambda o: o.state)
def test_outcome_union_round_trips(outcome: outcomes.Outcome) -> None:
    as_json = outcomes.OUTCOME.dump_json(outcome)
    assert outcomes.OUTCOME.validate_json(as_json) == outcome
    as_dict = outcomes.OUTCOME.dump_python(outcome, mode="json")
    assert type(outcomes.OUTCOME.validate_python(as_dict)) is type(outcome)
    event = outcomes.OutcomeEventV1(tenant_id=uuid.uuid4(), operation_id=uuid.uuid4(),
                                    outcome=outcome, recorded_at=NOW)
    assert outcomes.OutcomeEventV1.model_validate_json(event.model_dump_json()) == event


@pytest.mark.parametrize(
    "raw",
    [
        {"state": "succeeded"},
        {"state": "succeeded", "receipt": "r", "reason": "x"},
        {"state": "rolled_back", "reason": "x"},
        {"state": "denied", "reason": "r" * 2001},
        {"state": "unknown", "operation_id": "not-a-uuid"},
    ],
)
def test_outcome_union_rejects_bad_shapes(raw: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        outcomes.OUTCOME.validate_python(raw)


# --- admission results --------------------------------------------------------------------


def test_admission_result_admitted_and_replayed() -> None:
    ids = {"tenant_id": uuid.uuid4(), "operation_id": uuid.uuid4()}
    admitted = admission.AdmissionResultV1(status="admitted", state="pending", decided_at=NOW,
                                           allowlist_version="sha256:" + "0" * 64, **ids)
    replayed = admission.AdmissionResultV1(
        status="replayed", state="succeeded", outcome=outcomes.Succeeded(receipt="r"),
        decided_at=NOW, **ids)
    for result in (admitted, replayed):
        assert admission.AdmissionResultV1.model_validate_json(result.model_dump_json()) == result
    with pytest.raises(ValidationError, match="needs tenant_id"):
        admission.AdmissionResultV1(status="admitted", decided_at=NOW)


def test_admission_result_from_errors() -> None:
    conflict = admission.AdmissionResultV1.refused(
        errors.IdempotencyConflict(), tenant_id=uuid.uuid4(), operation_id=uuid.uuid4(),
        decided_at=NOW)
    assert (conflict.status, conflict.reason_code) == ("conflict", "idempotency_conflict")
    rejected = admission.AdmissionResultV1.refused(errors.PoisonMessage(), decided_at=NOW)
    assert rejected.status == "rejected"
    assert rejected.proposal_id is None
    with pytest.raises(ValidationError, match="needs reason_code"):
        admission.AdmissionResultV1(status="rejected", decided_at=NOW)
    with pytest.raises(ValidationError):
        admission.AdmissionResultV1.refused(errors.PoisonMessage(), decided_at=NOW, state="bogus")


# --- exec requests ------------------------------------------------------------------------


def test_exec_request_carries_only_ids() -> None:
    req = exec.ExecRequestV1(tenant_id=uuid.uuid4(), operation_id=uuid.uuid4())
    assert set(req.model_dump()) == {"tenant_id", "operation_id", "type"}
    with pytest.raises(ValidationError):
        exec.ExecRequestV1.model_validate({**req.model_dump(mode="json"), "payload": {"x": 1}})
    with pytest.raises(ValidationError):
        exec.ExecRequestV1.model_validate({**req.model_dump(mode="json"), "type": "command.run"})


# --- dead letters -------------------------------------------------------------------------


def test_dead_letter_keeps_text_keys_and_raw_values() -> None:
    record = dlq.DeadLetterV1.from_raw(
        topic=topics.PROPOSALS, partition=3, offset=42, key=b"tenant-1", value=b"\xff{not json",
        error=errors.PoisonMessage("not JSON"), failed_at=NOW)
    assert (record.key, record.key_encoding) == ("tenant-1", "utf8")
    assert record.value_bytes() == b"\xff{not json"
    assert (record.error_code, record.reason) == ("poison_message", "not JSON")
    assert dlq.DeadLetterV1.model_validate_json(record.model_dump_json()) == record


def test_dead_letter_encodes_binary_keys_losslessly_and_bounds_everything() -> None:
    key = bytes(range(256))
    value = b"v" * (dlq.MAX_VALUE_BYTES + 10)
    record = dlq.DeadLetterV1.from_raw(
        topic=topics.PROPOSALS, partition=0, offset=0, key=key, value=value,
        error=errors.PoisonMessage("r" * 5000), failed_at=NOW)
    assert record.key_encoding == "base64"
    assert record.key_bytes() == key
    assert not record.key_truncated
    assert record.value_truncated
    assert record.value_size == len(value)
    assert record.value_bytes() == value[: dlq.MAX_VALUE_BYTES]
    assert len(record.reason) == dlq.MAX_REASON_CHARS

    huge_key = b"\xff" * 1000
    cut = dlq.DeadLetterV1.from_raw(
        topic=topics.PROPOSALS, partition=0, offset=0, key=huge_key, value=None,
        error=errors.PoisonMessage(), failed_at=NOW)
    assert cut.key_truncated
    assert cut.key is not None
    assert len(cut.key) <= dlq.MAX_KEY_CHARS
    assert huge_key.startswith(cut.key_bytes() or b"")
    assert (cut.value_b64, cut.value_size) == ("", 0)


def test_dead_letter_rejects_oversized_fields() -> None:
    good = dlq.DeadLetterV1.from_raw(
        topic="t.v1", partition=0, offset=0, key=None, value=b"", error=errors.PoisonMessage(),
        failed_at=NOW).model_dump(mode="json")
    too_big = base64.b64encode(b"x" * (dlq.MAX_VALUE_BYTES + 3)).decode()
    for bad in ({"value_b64": too_big}, {"key": "k" * 513}, {"reason": "r" * 2001},
                {"offset": -1}, {"source_topic": "bad topic"}):
        with pytest.raises(ValidationError):
            dlq.DeadLetterV1.model_validate({**good, **bad})


# --- trace context ------------------------------------------------------------------------


def test_trace_context_accepts_w3c_and_round_trips_headers() -> None:
    ctx = common.TraceContext(traceparent=TRACEPARENT, tracestate="rojo=00f067aa0ba902b7,a@b=x")
    headers = ctx.to_headers()
    assert common.TraceContext.from_headers(headers) == ctx
    assert common.TraceContext.from_headers({"other": b"x"}) is None


@pytest.mark.parametrize(
    "fields",
    [
        {"traceparent": "00-" + "0" * 32 + "-00f067aa0ba902b7-01"},
        {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-" + "0" * 16 + "-01"},
        {"traceparent": "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
        {"traceparent": TRACEPARENT.upper()},
        {"traceparent": TRACEPARENT + "-extra"},
        {"traceparent": TRACEPARENT, "tracestate": "Bad Key=1"},
        {"traceparent": TRACEPARENT, "tracestate": ",".join(f"k{i}=v" for i in range(33))},
    ],
)
def test_trace_context_rejects_malformed(fields: dict[str, str]) -> None:
    with pytest.raises(ValidationError):
        common.TraceContext(**fields)


# --- topics -------------------------------------------------------------------------------


def test_topic_helpers() -> None:
    assert topics.PROPOSALS == "agent.proposals.v1"
    assert topics.OUTCOMES == "agent.outcomes.v1"
    assert topics.ADMISSIONS == "agent.admissions.v1"
    assert topics.exec_topic("crm") == "exec.crm.v1"
    assert topics.dlq_topic("agent.proposals.v1") == "agent.proposals.dlq.v1"
    assert topics.PROPOSALS_DLQ == "agent.proposals.dlq.v1"
    assert topics.dlq_topic(topics.exec_topic("billing")) == "exec.billing.dlq.v1"
    for bad in ("agent.proposals", "agent.proposals.dlq.v1", ""):
        with pytest.raises(ValueError):
            topics.dlq_topic(bad)
    for bad in ("CRM", "crm.v2", "", "x" * 40):
        with pytest.raises(ValueError):
            topics.exec_topic(bad)


def test_exec_request_carries_admitted_or_requeued_only() -> None:
    import uuid as _uuid

    from agentledger.contracts.exec import ExecRequestV1

    ids = {"tenant_id": str(_uuid.uuid4()), "operation_id": str(_uuid.uuid4())}
    for kind in ("command.admitted", "command.requeued"):
        assert ExecRequestV1.model_validate_json(json.dumps({**ids, "type": kind})).type == kind
    with pytest.raises(ValidationError):
        ExecRequestV1.model_validate_json(json.dumps({**ids, "type": "command.delete_everything"}))


# --- text the ledger cannot store (issue 17) -------------------------------------------------

FREE_TEXT: list[tuple[str, Any]] = [  # where a caller's text lands in a proposal
    ("planner.name", lambda t: {"planner": {"name": "p" + t}}),
    ("planner.model", lambda t: {"planner": {"name": "rules", "model": "m" + t}}),
    ("arguments.body", lambda t: {"arguments": {"customer_id": "c1", "body": t}}),
    ("arguments key", lambda t: {"arguments": {"customer_id": "c1", "body" + t: "x"}}),
    ("nested argument", lambda t: {"arguments": {"customer_id": "c1", "changes": {"a": [t]}}}),
    ("evidence_refs", lambda t: {"evidence_refs": ["r" + t]}),
    ("evidence.excerpt", lambda t: {"evidence": [{"ref": "E1", "source": "crm:c1", "sha256": "0" * 64,
                                                  "fetched_at": NOW.isoformat(), "excerpt": t}]}),
    ("evidence.source", lambda t: {"evidence": [{"ref": "E1", "source": "s" + t, "sha256": "0" * 64,
                                                 "fetched_at": NOW.isoformat(), "excerpt": ""}]}),
]


@pytest.mark.parametrize(("where", "mutate"), FREE_TEXT, ids=[w for w, _ in FREE_TEXT])
def test_a_nul_anywhere_in_a_proposal_is_a_validation_error_naming_no_value(where: str, mutate: Any) -> None:
    raw = json.dumps(proposal(**mutate("secret\u0000")))
    with pytest.raises(ValidationError) as refused:
        proposals.ProposalV1.model_validate_json(raw)
    poison = handling.classify(refused.value)  # what the DLQ record and the log carry
    assert poison.code == "poison_message" and not poison.retryable
    assert "U+0000" in poison.message and "secret" not in poison.message


@given(st.text(max_size=50))
@settings(max_examples=300, deadline=None)
def test_whatever_text_a_proposal_accepts_the_ledger_can_store(text: str) -> None:
    for _, mutate in FREE_TEXT:
        try:
            accepted = proposals.ProposalV1.model_validate_json(json.dumps(proposal(**mutate(text))))
        except ValidationError:
            continue
        for value in _strings(accepted.model_dump(mode="json", by_alias=True)):
            assert "\x00" not in value
            value.encode("utf-8")  # raises on a lone surrogate


def _strings(value: Any) -> Iterator[str]:
    """Every string of a JSON-like value, keys included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def test_a_dead_letter_of_a_nul_key_and_reason_still_builds() -> None:
    record = dlq.DeadLetterV1.from_raw(
        topic="agent.proposals.v1", partition=0, offset=7, key=b"tenant\x00x", value=b'{"a":"\\u0000"}',
        error=errors.PoisonMessage("bad \x00 input"), failed_at=NOW)
    assert (record.key_encoding, record.key_bytes()) == ("base64", b"tenant\x00x")
    assert "\x00" not in record.reason


def test_a_dead_letter_of_a_payload_topic_keeps_coordinates_and_digest_never_the_bytes() -> None:
    # Issue 17 §5: DLQs are kept for 30 days; a proposal's arguments must not rest there.
    value = b'{"arguments": {"body": "SECRET-MARKER"}}'
    record = dlq.DeadLetterV1.from_raw(topic="agent.proposals.v1", partition=2, offset=41, key=b"t",
                                       value=value, error=errors.PoisonMessage("bad"),
                                       failed_at=datetime.now(UTC), keep_value=False)
    assert (record.value_b64, record.value_kept, record.value_size) == ("", False, len(value))
    assert record.value_sha256 == hashlib.sha256(value).hexdigest()
    assert b"SECRET-MARKER" not in record.model_dump_json().encode()
    kept = dlq.DeadLetterV1.from_raw(topic="exec.crm.v1", partition=0, offset=1, key=None, value=value,
                                     error=errors.PoisonMessage("bad"), failed_at=datetime.now(UTC))
    assert kept.value_kept and kept.value_bytes() == value and kept.value_sha256 == record.value_sha256
