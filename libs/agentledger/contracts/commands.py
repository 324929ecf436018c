"""The approved command: the only thing an executor ever dispatches (R1.6, R2.1-R2.5).

Admission builds it from a validated proposal and a policy decision, persists it, and from
then on it is frozen; executors load it from the ledger, never from a message.
"""

from datetime import datetime
from typing import Final, Literal, get_args

from pydantic import field_validator

from agentledger.contracts import common

# The one definition of the command's states: the ledger's tables, its SQL (the state CHECK,
# retention's terminal filter), the dispatcher and the reconciler all refer to these, and
# tests/unit/test_contracts.py checks that the SQL lists agree with them.

# States the command never leaves. ``unknown`` is not one: it waits for reconciliation (R6.6).
TerminalState = Literal["succeeded", "denied", "expired", "review_required", "failed"]
CommandState = Literal["pending", "dispatching", "unknown", TerminalState]
TERMINAL_STATES: Final[frozenset[str]] = frozenset(get_args(TerminalState))
COMMAND_STATES: Final[frozenset[str]] = frozenset(get_args(CommandState))


class ApprovedCommand(common.Contract):
    """A command admitted for dispatch, bound to its request hash and policy decision.

    Attributes:
        connector: The connector that executes the action (from the allowlist).
        resource_id: The target, resolved inside the tenant (R1.4).
        payload: The validated arguments sent to the connector.
        request_hash: Hex SHA-256 of the canonical bound fields (``canonical.request_hash``).
        expected_revision: The precondition sent as If-Match (R2.7), when the action needs one.
        authorization_decision_id: The persisted policy/approval decision (R2.3, R2.9).
        policy_version: The policy the decision was taken under.
        allowlist_version: The allowlist the action was checked against (R1.2).
        expires_at: After this instant the command must not be dispatched (R2.6).
    """

    tenant_id: common.TenantId
    operation_id: common.OperationId
    principal_id: common.PrincipalId
    action: common.ActionName
    connector: common.ConnectorName
    resource_id: common.ResourceId
    payload: common.Arguments
    request_hash: common.HashHex
    expected_revision: common.Revision | None = None
    authorization_decision_id: common.Uuid
    policy_version: common.VersionTag
    allowlist_version: common.VersionTag
    expires_at: common.Timestamp

    @field_validator("payload")
    @classmethod
    def _bounded_payload(cls, value: dict[str, object]) -> dict[str, object]:
        common.check_json_size(value)
        return value

    def is_expired(self, now: datetime) -> bool:
        """Whether the approval no longer covers a dispatch at ``now``."""
        return now >= self.expires_at
