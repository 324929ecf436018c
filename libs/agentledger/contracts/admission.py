"""``agent.admissions.v1``: admission's answer to a proposal, for the gateway."""

from typing import Literal, Self

from pydantic import model_validator

from agentledger import errors
from agentledger.contracts import commands, common, outcomes

AdmissionStatus = Literal["admitted", "replayed", "conflict", "rejected", "pending_approval"]


class AdmissionResultV1(common.Contract):
    """The result of admitting one proposal.

    Attributes:
        proposal_id: ``None`` when the message could not be parsed far enough to know it.
        status: ``admitted`` (new command), ``replayed`` (same key and hash: the recorded
            state, R3.3), ``conflict`` (same key, different hash, R3.4), ``rejected``.
        state: The command's current state, for admitted and replayed proposals.
        outcome: The recorded outcome, when a replayed command already has one.
        reason_code: The ``errors.AgentLedgerError.code`` for conflicts and rejections.
        reason: Its human-readable message.
        allowlist_version: The allowlist the action was checked against (R1.2).
        approval_id: For ``pending_approval``: the request a person must decide (R2.8).
        decision_id: The persisted policy decision, when policy was asked (R2.9).
        policy_version: The version of the policy that decided.
    """

    proposal_id: common.Uuid | None = None
    tenant_id: common.TenantId | None = None
    operation_id: common.OperationId | None = None
    status: AdmissionStatus
    state: commands.CommandState | None = None
    outcome: outcomes.Outcome | None = None
    reason_code: common.ErrorCode | None = None
    reason: common.Reason | None = None
    allowlist_version: common.VersionTag | None = None
    approval_id: common.Uuid | None = None
    decision_id: common.Uuid | None = None
    policy_version: common.VersionTag | None = None
    decided_at: common.Timestamp

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.status in ("admitted", "replayed"):
            if self.tenant_id is None or self.operation_id is None or self.state is None:
                raise ValueError(f"{self.status} needs tenant_id, operation_id and state")
            if self.reason_code is not None:
                raise ValueError(f"{self.status} carries no reason_code")
        elif self.status == "pending_approval":
            if self.approval_id is None or self.tenant_id is None or self.operation_id is None:
                raise ValueError("pending_approval needs approval_id, tenant_id and operation_id")
        elif self.reason_code is None or self.reason is None:
            raise ValueError(f"{self.status} needs reason_code and reason")
        return self

    @classmethod
    def refused(cls, error: errors.AgentLedgerError, **fields: object) -> Self:
        """A ``conflict`` (for ``IdempotencyConflict``) or ``rejected`` result for an error.

        Args:
            error: The error that stopped admission; its code and message become the reason.
            **fields: The other fields (``decided_at``, ids when known, ...).
        """
        status = "conflict" if isinstance(error, errors.IdempotencyConflict) else "rejected"
        return cls.model_validate({
            **fields, "status": status, "reason_code": error.code,
            "reason": error.message[:2000] or error.code,
        })
