"""The closed hierarchy of agentledger errors.

Every error has a stable ``code`` and says whether retrying the same operation can help
(``retryable``). Message handlers map errors to broker actions in one place:
retryable → redeliver, otherwise → dead-letter queue + ack.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = ["AccessDenied", "AgentLedgerError", "AnswersUndelivered", "ApprovalExpired",
           "ApprovalMismatch", "ApprovalNotFound", "AttemptMayStillAct", "BrokerUnavailable",
           "BudgetExhausted", "CommandNotFound", "ConfigurationError", "DataRejected",
           "DecodeError", "DecryptionFailed", "DeliveryFailed", "DeliveryStalled",
           "EvidenceInvalid", "EvidencePending",
           "IdempotencyConflict", "IdentityRejected", "InvalidArguments", "InvalidTransition",
           "MigrationError", "NarrowingRefused", "NotAnOperator", "NotInLedgerYet",
           "NotVisibleYet", "PayloadPurged",
           "PoisonMessage", "PolicyDenied", "PrincipalNotFound", "PublicationMissing",
           "ReceiptContradicted", "ReceiptUnverifiable", "RelayError", "ReplicationLost",
           "ResourceNotFound", "ShadowRefused", "SlotMissing", "StaleClaim", "StaleRevision",
           "StorageError", "TenantNotSet", "UnknownAction", "ValidationFailed"]


class AgentLedgerError(Exception):
    """An agentledger operation failed."""

    code: ClassVar[str] = "agentledger_error"
    retryable: ClassVar[bool] = False

    def __init__(self, message: str | None = None, **details: object) -> None:
        self.message = message or (type(self).__doc__ or "").strip().splitlines()[0]
        self.details = details
        super().__init__(self.message)

    def to_dict(self) -> dict[str, object]:
        """A JSON-friendly form for result topics and HTTP bodies."""
        return {"code": self.code, "message": self.message, "retryable": self.retryable,
                **({"details": self.details} if self.details else {})}


class StorageError(AgentLedgerError):
    """The database could not complete the operation."""

    code = "storage_error"
    retryable = True


class NotInLedgerYet(StorageError):
    """A record names a command whose transaction is committed but not yet visible (a commit
    waiting for a synchronous standby): retryable, for a bounded time (issue 18)."""

    code = "not_in_ledger_yet"


class AnswersUndelivered(AgentLedgerError):
    """Kafka did not acknowledge every answer of a batch: no record of the batch is acked,
    and the batch is redelivered (its handlers are idempotent)."""

    code = "answers_undelivered"
    retryable = True


class AttemptMayStillAct(AgentLedgerError):
    """An attempt that may have reached the provider is still within its longest call time:
    declaring an outcome now could contradict what it does next (issue 18 §1)."""

    code = "attempt_may_still_act"


class MigrationError(AgentLedgerError):
    """The database schema could not be brought up to date."""

    code = "migration_error"


class ConfigurationError(AgentLedgerError):
    """The operator's configuration cannot be used as given (a connector that is not
    installed, a factory that fails, an action no connector declares): fix it and restart."""

    code = "configuration_error"


class ValidationFailed(AgentLedgerError):
    """The input does not satisfy its contract."""

    code = "validation_failed"


class PoisonMessage(ValidationFailed):
    """A message could not be parsed; it goes to the dead-letter topic and is acked."""

    code = "poison_message"


# --- authority boundary (R1) -------------------------------------------------------------


class UnknownAction(ValidationFailed):
    """The action is not on the allowlist."""

    code = "unknown_action"


class InvalidArguments(ValidationFailed):
    """The arguments do not satisfy the action's closed schema."""

    code = "invalid_arguments"


class ResourceNotFound(ValidationFailed):
    """The target resource does not exist in this tenant."""

    # Deliberately the same answer for "missing" and "belongs to another tenant" (R1.4).
    code = "resource_not_found"


class IdentityRejected(AgentLedgerError):
    """The identity of the caller could not be verified."""

    code = "identity_rejected"


class PolicyDenied(AgentLedgerError):
    """The current policy does not permit this command."""

    code = "policy_denied"


class NotAnOperator(PolicyDenied):
    """The session's principal is not a current operator of this tenant (a directory entry
    holding an operating role, not revoked): operator commands are refused (issue 18 §3)."""

    code = "not_an_operator"


class PrincipalNotFound(AgentLedgerError):
    """The principal directory of this tenant has no such principal."""

    code = "principal_not_found"


# --- ledger (R3, R4, R5) -----------------------------------------------------------------


class IdempotencyConflict(AgentLedgerError):
    """The operation id is already bound to a different request (HTTP 409)."""

    code = "idempotency_conflict"


class CommandNotFound(AgentLedgerError):
    """No command with this operation id exists for this tenant."""

    code = "command_not_found"


class TenantNotSet(AgentLedgerError):
    """A tenant-scoped query ran without a tenant bound to the transaction."""

    code = "tenant_not_set"


class StaleClaim(AgentLedgerError):
    """The claim was taken over by another worker; this worker may not finalize."""

    code = "stale_claim"


class InvalidTransition(AgentLedgerError):
    """The command is not in a state that allows this transition."""

    code = "invalid_transition"


class ReceiptContradicted(ValidationFailed):
    """The provider's lookup contradicts the resolution (it finds no effect, another receipt,
    or an effect the resolution denies): nothing is recorded (issue 18 §3)."""

    code = "receipt_contradicted"


class ReceiptUnverifiable(AgentLedgerError):
    """The provider's lookup could not answer (no answer, no lookup credential, a key the
    provider may have forgotten): the resolution is refused unless the operator records it as
    unchecked explicitly."""

    # Retryable: the provider may answer later; an explicit unchecked record is the other way.
    code = "receipt_unverifiable"
    retryable = True


# --- payload encryption (R3.6) -------------------------------------------------------------


class DecryptionFailed(AgentLedgerError):
    """A payload could not be decrypted (wrong key, tampered, or moved to another row)."""

    code = "decryption_failed"


class EvidenceInvalid(AgentLedgerError):
    """Evidence does not verify: a receipt, a checkpoint or a tenant's log was altered, or is
    signed by a key the verifier does not trust. ``details["field"]`` names where."""

    code = "evidence_invalid"

    @property
    def field(self) -> str:
        """Where verification failed: a JSON path in a receipt, or a log position."""
        return str(self.details.get("field", ""))


class EvidencePending(AgentLedgerError):
    """The evidence asked for is not under a signed checkpoint yet: the notary has not
    sequenced it (it runs every few seconds), or no notary runs."""

    code = "evidence_pending"
    retryable = True


class PayloadPurged(AgentLedgerError):
    """The payload was purged by the retention policy; only its hash remains."""

    code = "payload_purged"


class AccessDenied(StorageError):
    """The database refused the statement for this role or tenant (privileges or row security)."""

    code = "access_denied"
    retryable = False


class DataRejected(StorageError):
    """The database refused the data itself (a data or integrity constraint error)."""

    # Not retryable: SQLSTATE classes 22 and 23 are properties of the statement and its
    # values; redelivering the same message fails the same way forever (a stalled partition).
    code = "data_rejected"
    retryable = False


class StaleRevision(ValidationFailed):
    """The target changed since the proposal was made: a new proposal is needed (R2.5)."""

    code = "stale_revision"


class ShadowRefused(AgentLedgerError):
    """A shadow proposal is recorded for comparison and never admitted or dispatched (R9.2)."""

    code = "shadow_refused"


# --- budgets (R7) --------------------------------------------------------------------------


class BudgetExhausted(AgentLedgerError):
    """The workflow's budget cannot cover this step: nothing new is scheduled (R7.3)."""

    # Not retryable: the model cannot negotiate another attempt; only a new budget helps.
    code = "budget_exhausted"


# --- approvals (R2) ------------------------------------------------------------------------


class ApprovalNotFound(AgentLedgerError):
    """No such approval request in this tenant."""

    code = "approval_not_found"


class ApprovalExpired(AgentLedgerError):
    """The approval request expired; a new proposal and a new decision are needed."""

    code = "approval_expired"


class ApprovalMismatch(ValidationFailed):
    """The approver was shown another command than the one pending: nothing was decided."""

    code = "approval_mismatch"


class NarrowingRefused(ValidationFailed):
    """The edit is not a narrowing the action declares (a larger amount, an added item, a
    change to a field that may not narrow): nothing was changed."""

    code = "narrowing_refused"


# --- relay (R3.5, R8.2) --------------------------------------------------------------------


class RelayError(AgentLedgerError):
    """The relay cannot go on with this session."""

    code = "relay_error"
    retryable = True


class NotVisibleYet(RelayError):
    """A streamed transaction is still invisible to other sessions after the bounded wait.

    Retryable: the session restarts from the slot and streams (and waits for) it again;
    nothing of it was published or swept.
    """

    code = "relay_not_visible"


class DecodeError(RelayError):
    """A logical replication message could not be decoded."""

    # Not retryable: the same WAL decodes the same way on every attempt.
    code = "relay_decode_error"
    retryable = False


class SlotMissing(RelayError):
    """The replication slot does not exist and the relay may not create it."""

    # An operator decides: a silently re-created slot would skip every change made while
    # it was missing.
    code = "relay_slot_missing"
    retryable = False


class PublicationMissing(RelayError):
    """The publication of the outbox tables is missing or incomplete (run the migrations)."""

    code = "relay_publication_missing"
    retryable = False


class DeliveryFailed(RelayError):
    """Kafka refused or timed out a record; the session restarts from the slot."""

    code = "relay_delivery_failed"


class DeliveryStalled(DeliveryFailed):
    """Records were in flight and no delivery report came for too long.

    The producer is replaced and the session restarts from the slot: a stuck producer
    (seen after a broker restart) otherwise holds every record until its message timeout.
    """

    code = "relay_delivery_stalled"


class ReplicationLost(RelayError):
    """The replication connection or the database went away."""

    code = "relay_replication_lost"


class BrokerUnavailable(RelayError):
    """Kafka could not create or describe a destination topic."""

    code = "relay_broker_unavailable"
