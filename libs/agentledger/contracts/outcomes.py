"""``agent.outcomes.v1``: what is known to have happened to a command (R6.6).

The outcome is a union discriminated on ``state`` so a reader must handle every case,
``unknown`` included: a timeout is not a rollback (R6.1).
"""

import json
from datetime import UTC, datetime
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import Field, StringConstraints, TypeAdapter

from agentledger.contracts import common

# A provider's receipt as the ledger keeps it (``agent_command.provider_receipt``).
RECEIPT_MAX = 512
Receipt = Annotated[str, StringConstraints(min_length=1, max_length=RECEIPT_MAX)]


def receipt_text(value: object, key: str) -> str:
    """A provider's receipt as the ledger can store it: storable and bounded
    (``common.storable_text``), and never empty — a provider that confirmed an effect without
    naming it gets the idempotency key ``key`` as its receipt, and says so (issue 38 §2)."""
    text = common.storable_text(value, RECEIPT_MAX).strip()
    if text.strip("\ufffd "):
        return text
    return common.storable_text(f"key:{key} (the provider named no receipt)", RECEIPT_MAX)


class Succeeded(common.Contract):
    """The provider confirmed the effect; ``receipt`` is its reference for it."""

    state: Literal["succeeded"] = "succeeded"
    receipt: Receipt


class Denied(common.Contract):
    """Policy or the provider refused the command; nothing happened."""

    state: Literal["denied"] = "denied"
    reason: common.Reason


class Expired(common.Contract):
    """The authorization (a person's approval, or the policy's own allow) expired before
    dispatch; nothing happened."""

    state: Literal["expired"] = "expired"
    reason: common.Reason


class Unknown(common.Contract):
    """No definitive answer (lost response, no lookup): reconciliation must decide."""

    state: Literal["unknown"] = "unknown"
    operation_id: common.OperationId


class ReviewRequired(common.Contract):
    """The precondition failed (the record changed): a new proposal and decision are needed.

    The condition is never dropped to retry (R2.7).
    """

    state: Literal["review_required"] = "review_required"
    reason: common.Reason


class Failed(common.Contract):
    """An operator's reconciliation established that the effect did not happen."""

    state: Literal["failed"] = "failed"
    reason: common.Reason


Outcome = Annotated[
    Succeeded | Denied | Expired | Unknown | ReviewRequired | Failed,
    Field(discriminator="state"),
]
OUTCOME: TypeAdapter[Outcome] = TypeAdapter(Outcome)
"""Parses any outcome: ``OUTCOME.validate_python(d)`` / ``OUTCOME.validate_json(b)``."""


class OutcomeEventV1(common.Contract):
    """An outcome recorded in the ledger, published through the outbox."""

    tenant_id: common.TenantId
    operation_id: common.OperationId
    outcome: Outcome
    recorded_at: common.Timestamp


def of_state(operation_id: UUID, state: str, receipt: str | None, reason: str) -> Outcome | None:
    """The outcome a recorded ledger state stands for; None while the command is in flight
    (``pending``, ``dispatching``). The one mapping from a state to its outcome: the outbox's
    event and a replay's answer both use it.

    Raises:
        pydantic.ValidationError: ``succeeded`` without a receipt (never a success without one).
    """
    if state == "succeeded":
        return Succeeded(receipt=receipt or "")
    if state == "denied":
        return Denied(reason=reason)
    if state == "expired":
        return Expired(reason=reason)
    if state == "unknown":
        return Unknown(operation_id=operation_id)
    if state == "review_required":
        return ReviewRequired(reason=reason)
    if state == "failed":
        return Failed(reason=reason)
    return None


def event_payload(
    tenant_id: UUID, operation_id: UUID, state: str, receipt: str | None, reason: str | None
) -> dict[str, Any] | None:
    """The ``agent.outcomes.v1`` payload for a recorded ledger state; None for non-outcomes.

    Raises:
        pydantic.ValidationError: ``succeeded`` without a receipt (never a success without one).
    """
    outcome = of_state(operation_id, state, receipt, common.reason_text(reason or state))
    if outcome is None:
        return None
    event = OutcomeEventV1(tenant_id=tenant_id, operation_id=operation_id, outcome=outcome,
                           recorded_at=datetime.now(UTC))
    parsed: dict[str, Any] = json.loads(event.model_dump_json(by_alias=True))
    return parsed
