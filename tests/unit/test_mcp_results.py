"""What an MCP tool call answers: what is known, and nothing more."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

import mcp_types as types
import pytest

from agentledger import client, errors
from agentledger.contracts import admission, outcomes
from agentledger.mcp import results

OP, TENANT, APPROVAL = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
KEY = "k-1"
CONSOLE = "https://console.example/"
NOW = datetime.now(UTC)


def answered(status: str, **fields: object) -> admission.AdmissionResultV1:
    return admission.AdmissionResultV1.model_validate(
        {"status": status, "tenant_id": TENANT, "operation_id": OP, "decided_at": NOW, **fields})


def resolved(answer: admission.AdmissionResultV1 | None,
             outcome: outcomes.Outcome | None = None) -> results.Answer:
    return results.from_resolution(client.Resolution(OP, answer, outcome), KEY, CONSOLE)


def test_success_carries_its_receipt() -> None:
    answer = resolved(answered("admitted", state="dispatching"),
                      outcomes.Succeeded(receipt="crm:note:1"))
    assert answer.structured() == {"status": "succeeded", "operation_id": str(OP),
                                   "idempotency_key": KEY, "receipt": "crm:note:1"}
    result = answer.to_result()
    assert result.is_error is False and result.structured_content == answer.structured()
    first = result.content[0]
    assert isinstance(first, types.TextContent) and "crm:note:1" in first.text
    second = result.content[1]
    assert isinstance(second, types.TextContent) and json.loads(second.text) == answer.structured()


def test_a_replay_with_a_recorded_outcome_answers_that_outcome() -> None:
    answer = resolved(answered("replayed", state="succeeded",
                               outcome={"state": "succeeded", "receipt": "crm:note:1"}),
                      outcomes.Succeeded(receipt="crm:note:1"))
    assert (answer.status, answer.receipt) == ("succeeded", "crm:note:1")


def test_unknown_never_reads_as_success() -> None:
    answer = resolved(answered("admitted", state="dispatching"), outcomes.Unknown(operation_id=OP))
    assert answer.status == "unknown" and answer.is_error and answer.receipt is None
    assert "may or may not have happened" in answer.text()
    assert "succeeded" not in answer.text()


def test_pending_approval_links_the_console() -> None:
    answer = resolved(answered("pending_approval", approval_id=APPROVAL))
    assert answer.structured() == {
        "status": "pending_approval", "operation_id": str(OP), "idempotency_key": KEY,
        "approval_id": str(APPROVAL),
        "approval_url": f"https://console.example/approvals/{APPROVAL}"}
    assert answer.is_error is False
    assert "agentledger_status" in answer.text() and "nothing has happened yet" in answer.text()


def test_admitted_without_an_outcome_is_in_progress() -> None:
    answer = resolved(answered("admitted", state="pending"))
    assert answer.status == "in_progress" and not answer.is_error
    assert str(OP) in answer.text()


@pytest.mark.parametrize(("status", "code"), [("rejected", "policy_denied"),
                                              ("conflict", "idempotency_conflict")])
def test_refusals_by_admission_carry_code_and_reason(status: str, code: str) -> None:
    answer = resolved(answered(status, reason_code=code, reason="not allowed"))
    assert answer.structured() == {"status": status, "operation_id": str(OP),
                                   "idempotency_key": KEY, "code": code, "reason": "not allowed"}
    assert answer.to_result().is_error is True


@pytest.mark.parametrize("outcome", [
    outcomes.Denied(reason="revoked"), outcomes.Expired(reason="approval expired"),
    outcomes.ReviewRequired(reason="record changed"), outcomes.Failed(reason="did not happen")])
def test_other_outcomes_are_errors_with_their_reason(outcome: outcomes.Outcome) -> None:
    answer = resolved(answered("admitted", state="dispatching"), outcome)
    assert answer.status == outcome.state and answer.is_error
    assert answer.reason == outcome.reason  # type: ignore[union-attr]


def test_an_invalid_input_is_refused_with_its_violations_and_no_operation() -> None:
    error = errors.InvalidArguments("bad input", violations=[
        {"path": "/body", "message": "missing"}])
    answer = results.from_error(error, OP, KEY)
    assert answer.structured() == {"status": "refused", "idempotency_key": KEY,
                                   "code": "invalid_arguments", "reason": "bad input",
                                   "violations": [{"path": "/body", "message": "missing"}]}
    assert "Nothing was proposed" in answer.text() and "/body: missing" in answer.text()


def test_an_ingress_refusal_keeps_ingress_code() -> None:
    answer = results.from_error(errors.ValidationFailed("ingress refused (422): x",
                                                        code="invalid_request"), OP, KEY)
    assert (answer.status, answer.code, answer.operation_id) == ("refused", "invalid_request", None)


def test_a_known_conflict_and_an_unreachable_ingress_keep_the_operation() -> None:
    conflict = results.from_error(errors.IdempotencyConflict("other content"), OP, KEY)
    assert (conflict.status, conflict.operation_id, conflict.code) == (
        "conflict", OP, "idempotency_conflict")
    down = results.from_error(errors.StorageError("ingress unavailable"), OP, KEY)
    assert (down.status, down.operation_id, down.is_error) == ("unavailable", OP, True)
    assert "same idempotency key" in down.text()


def test_not_found_says_nothing_about_the_operation() -> None:
    answer = results.Answer("not_found", OP)
    assert answer.structured() == {"status": "not_found", "operation_id": str(OP)}
    assert answer.is_error
