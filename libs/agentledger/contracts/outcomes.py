"""``agent.outcomes.v1``: what is known to have happened to a command (R6.6).

The outcome is a union discriminated on ``state`` so a reader must handle every case,
``unknown`` included: a timeout is not a rollback (R6.1).
"""

from typing import Annotated, Literal

from pydantic import Field, StringConstraints, TypeAdapter

from agentledger.contracts import common

Receipt = Annotated[str, StringConstraints(min_length=1, max_length=512)]


class Succeeded(common.Contract):
    """The provider confirmed the effect; ``receipt`` is its reference for it."""

    state: Literal["succeeded"] = "succeeded"
    receipt: Receipt


class Denied(common.Contract):
    """Policy or the provider refused the command; nothing happened."""

    state: Literal["denied"] = "denied"
    reason: common.Reason


class Expired(common.Contract):
    """The approval expired before dispatch; nothing happened."""

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
