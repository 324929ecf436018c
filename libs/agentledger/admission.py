"""Admission: the only place that turns a proposal into an approved, persisted command (R1.6).

Order of checks: shadow runs are refused; the action must be on the versioned allowlist; the
arguments must satisfy its closed schema; the target must resolve inside the tenant at the
expected revision; the policy must allow it. Only then is the request hash computed over the
validated fields, the payload encrypted, and the command admitted once into the ledger and
outbox in one transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import asyncpg

from agentledger import canonical, errors
from agentledger.contracts import admission as admission_contract
from agentledger.contracts import common, outcomes
from agentledger.contracts.proposals import ProposalV1
from agentledger.ledger import keys, repository
from agentledger.policy import allowlist as allowlist_mod
from agentledger.policy import decision as decision_mod
from agentledger.resources import Resolver

AdmissionResultV1 = admission_contract.AdmissionResultV1

# How long an admitted command stays dispatchable; a command still queued after this is
# `expired` at dispatch, never executed on a stale decision (R2.6).
DEFAULT_DECISION_TTL = timedelta(minutes=15)


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass
class Admitter:
    """Admits proposals. One per process; safe for concurrent use."""

    pool: asyncpg.Pool
    allowlist: allowlist_mod.Allowlist
    resolver: Resolver
    policy: decision_mod.Policy
    cipher: keys.PayloadCipher
    decision_ttl: timedelta = DEFAULT_DECISION_TTL

    async def admit(
        self, proposal: ProposalV1, *, trace: common.TraceContext | None = None
    ) -> AdmissionResultV1:
        """Check and admit one proposal.

        Returns:
            ``admitted``, ``replayed`` (with the recorded state and outcome), ``conflict`` or
            ``rejected`` (with the error's code and message). Nothing is written for a
            rejection; a conflict is audited and changes nothing.

        Raises:
            StorageError: a retryable database failure; the caller redelivers.
        """
        base = {"proposal_id": proposal.proposal_id, "tenant_id": proposal.tenant_id,
                "operation_id": proposal.operation_id,
                "allowlist_version": self.allowlist.version}
        try:
            command = await self._check(proposal)
        except errors.ValidationFailed as exc:
            return AdmissionResultV1.refused(exc, decided_at=_now(), **base)
        except (errors.PolicyDenied, errors.ShadowRefused) as exc:
            return AdmissionResultV1.refused(exc, decided_at=_now(), **base)
        spec, arguments, decision = command
        request_hash = canonical.request_hash(
            tenant_id=proposal.tenant_id, principal_id=proposal.principal_id,
            action=spec.name, target=proposal.target, arguments=arguments,
            expected_revision=proposal.expected_revision,
        )
        async with self.pool.acquire() as conn:
            ciphertext, key_version = await self.cipher.encrypt(
                conn, proposal.tenant_id, proposal.operation_id,
                canonical.canonical_bytes(arguments),
            )
            result = await repository.admit(conn, repository.NewCommand(
                tenant_id=proposal.tenant_id, operation_id=proposal.operation_id,
                request_hash=request_hash, principal_id=proposal.principal_id,
                action=spec.name, connector=spec.connector, resource_id=proposal.target,
                expected_revision=proposal.expected_revision,
                decision_id=decision.decision_id, policy_version=decision.policy_version,
                allowlist_version=self.allowlist.version,
                expires_at=_now() + self.decision_ttl,
                payload_ciphertext=ciphertext, payload_key_version=key_version,
                traceparent=trace.traceparent if trace else None,
                tracestate=trace.tracestate if trace else None,
            ), audit={"proposal_id": str(proposal.proposal_id),
                      "planner": proposal.planner.name, "risk": spec.risk})
        if result.status == "conflict":
            return AdmissionResultV1.refused(errors.IdempotencyConflict(
                "operation id already bound to a different request; nothing was changed",
            ), decided_at=_now(), **base)
        return AdmissionResultV1(
            **base, status=result.status, state=result.recorded.state,
            outcome=recorded_outcome(result.recorded, proposal), decided_at=_now(),
        )

    async def _check(
        self, proposal: ProposalV1
    ) -> tuple[allowlist_mod.ActionSpec, dict[str, object], decision_mod.Decision]:
        if proposal.shadow:
            raise errors.ShadowRefused("shadow proposals are recorded, never admitted")
        spec = self.allowlist.get(proposal.action)
        arguments = spec.validate(proposal.arguments)
        spec.check_revision(proposal.expected_revision)
        named = arguments.get("customer_id")
        if named is not None and named != proposal.target:
            # The model must not aim at one record and write to another.
            raise errors.InvalidArguments(
                "arguments name a different customer than the proposal's target",
                violations=[{"path": "/arguments/customer_id", "message": "must equal target"}],
            )
        resource = await self.resolver.resolve(proposal.tenant_id, spec.connector, proposal.target)
        if spec.requires_revision and resource.revision != proposal.expected_revision:
            raise errors.StaleRevision(
                "the target changed since it was read; plan again on the current record"
            )
        decision = self.policy.decide(
            tenant_id=proposal.tenant_id, principal_id=proposal.principal_id, action=spec,
            resource_id=proposal.target,
        )
        if decision.effect == "deny":
            raise errors.PolicyDenied(decision.reason, policy_version=decision.policy_version)
        return spec, arguments, decision


def recorded_outcome(
    recorded: repository.Recorded, proposal: ProposalV1
) -> outcomes.Outcome | None:
    """The outcome a replay returns: what the ledger recorded, or None while in flight."""
    state, reason = recorded.state, recorded.outcome_reason or recorded.state
    if state == "succeeded":
        return outcomes.Succeeded(receipt=recorded.provider_receipt or "")
    if state == "denied":
        return outcomes.Denied(reason=reason)
    if state == "expired":
        return outcomes.Expired(reason=reason)
    if state == "unknown":
        return outcomes.Unknown(operation_id=proposal.operation_id)
    if state == "review_required":
        return outcomes.ReviewRequired(reason=reason)
    if state == "failed":
        return outcomes.Failed(reason=reason)
    return None
