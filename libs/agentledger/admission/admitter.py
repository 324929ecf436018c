"""The admitter: one proposal's way through admission, from its checks to its answer.

``Admitter.admit`` runs the checks before the policy (``checks``), hashes the validated
request and warms the tenant's data key, hands the prepared proposal to admission's
transaction (``transaction``, batched per tenant by ``batchcommit``) and turns what was
decided into the answer (``answers``). Two paths write in transactions of their own: a command
that requires approval is sealed in an approval request (``approvals.request``), and a
proposal whose target check failed is answered from the ledger when its operation id is
already held there — else its rejection is audited.
"""

from __future__ import annotations

import contextvars
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import asyncpg
from opentelemetry.trace import get_tracer

from agentledger import budgets, canonical, errors, identity
from agentledger.admission import answers, checks, transaction
from agentledger.approvals import quorum as quorum_mod
from agentledger.approvals import repository as approvals
from agentledger.budgets import rules as operator_budgets
from agentledger.contracts import common
from agentledger.contracts.proposals import ProposalV1
from agentledger.ledger import batchcommit, groupcommit, keys, repository
from agentledger.notify import outbox as notify_outbox
from agentledger.policy import allowlist as allowlist_mod
from agentledger.policy import decision as decision_mod
from agentledger.resources import Resolver
from agentledger.telemetry import metrics as telemetry_metrics
from agentledger.telemetry import spans

AdmissionResultV1 = answers.AdmissionResultV1

# How long a decision stays valid: an auto-approved command still queued after this is
# `expired` at dispatch, never executed on a stale decision (R2.6).
DEFAULT_DECISION_TTL = timedelta(minutes=15)
# How long a person has to decide, and how long an approved command stays dispatchable.
DEFAULT_APPROVAL_TTL = timedelta(hours=1)

tracer = get_tracer("agentledger.admission")


@dataclass
class Admitter:
    """Admits proposals. One per process; safe for concurrent use."""

    pool: asyncpg.Pool
    allowlist: allowlist_mod.Allowlist
    resolver: Resolver
    authorizer: decision_mod.Authorizer
    cipher: keys.PayloadCipher
    # Ingress's public keys; None only where identity is bound some other way (library tests).
    envelope_keys: identity.KeySet | None = None
    # Per-request budget opened on first use (R7): e.g. {"tool_calls": 10}.
    budget_limits: Mapping[budgets.Kind, int] = field(default_factory=dict)
    # The operator's budgets over runs, principals and tenants in time and money (issue 42).
    budget_rules: operator_budgets.Budgets = field(default_factory=operator_budgets.Budgets)
    # The clock that puts a command in its budget window (calendar UTC hour/day). The seam
    # tests move to the next day instead of sleeping; services use the system clock.
    clock: operator_budgets.Clock = operator_budgets.system_clock
    # The operator's N-of-M approval rules (issue 42): who, and how many, must approve.
    approval_rules: quorum_mod.ApprovalRules = field(default_factory=quorum_mod.ApprovalRules.empty)
    # Who a pending request is routed to (issue 42): its notifications are written with it;
    # built from ``approval_rules`` when first needed (tests swap the rules after creation).
    _router: tuple[quorum_mod.ApprovalRules, notify_outbox.Router | None] | None = field(
        init=False, repr=False, default=None)
    decision_ttl: timedelta = DEFAULT_DECISION_TTL
    approval_ttl: timedelta = DEFAULT_APPROVAL_TTL
    # Admission transactions of one tenant that overlap share one COMMIT (group commit);
    # None: one over ``pool`` with the default bounds.
    group: groupcommit.GroupCommit | None = None
    # Admission transactions of one tenant that overlap are ONE transaction with one
    # principal read and one admitting statement for all of them (issue 41 §2); a lone
    # proposal, and each of a batch that fell back, takes the per-row path (``group``).
    batch_size: int = batchcommit.MAX_BATCH
    _transaction: transaction.Transaction = field(init=False, repr=False)
    batches: batchcommit.BatchCommit[transaction.Prepared, transaction.Decided] = field(
        init=False, repr=False)

    def __post_init__(self) -> None:
        self._transaction = transaction.Transaction(
            self, self.group or groupcommit.GroupCommit(self.pool))
        self.batches = batchcommit.BatchCommit(
            self.pool, body=self._transaction.decide_batch, alone=self._transaction.decide_alone,
            max_batch=self.batch_size)

    @property
    def notifications(self) -> notify_outbox.Router | None:
        """The router of ``approval_rules`` (None: the file routes nowhere)."""
        if self._router is None or self._router[0] is not self.approval_rules:
            self._router = (self.approval_rules, notify_outbox.Router.of(self.approval_rules))
        return self._router[1]

    async def admit(
        self, proposal: ProposalV1, *, trace: common.TraceContext | None = None
    ) -> AdmissionResultV1:
        """Check and admit one proposal.

        Returns:
            ``admitted``, ``replayed`` (with the recorded state and outcome),
            ``pending_approval`` (a person must decide), ``conflict`` or ``rejected`` (with
            the error's code and message). A rejection writes no command; a policy denial
            writes its decision record, a conflict its audit event.

        Raises:
            StorageError: a retryable database or resolver failure; the caller redelivers.
        """
        # The admission span covers the checks, the policy decision and the admit transaction;
        # it continues the proposal's context (FastStream's process span, when there is one).
        parent = spans.parent(trace.traceparent, trace.tracestate) if trace else None
        with spans.span(tracer, "admission", context=parent, attributes={
                spans.OPERATION_ID: str(proposal.operation_id), spans.ACTION: proposal.action,
                spans.STAGE: "admission"}) as span:
            result = await self._admit(proposal, trace)
            span.set_attribute(spans.OUTCOME, result.status)
            if result.state is not None:
                span.set_attribute(spans.STATE, result.state)
            if result.reason_code is not None:
                span.set_attribute(spans.ERROR_TYPE, result.reason_code)
        telemetry_metrics.admissions.add(1, outcome=result.status, action=telemetry_metrics.bounded(
            proposal.action, self.allowlist.actions))
        return result

    async def _admit(
        self, proposal: ProposalV1, trace: common.TraceContext | None
    ) -> AdmissionResultV1:
        base: dict[str, Any] = {
            "proposal_id": proposal.proposal_id, "tenant_id": proposal.tenant_id,
            "operation_id": proposal.operation_id, "allowlist_version": self.allowlist.version}
        try:
            verified = checks.verify_identity(proposal, self.envelope_keys)
        except errors.IdentityRejected as exc:
            # Unverified: nothing is written, not even an audit event under a claimed tenant.
            return AdmissionResultV1.refused(exc, decided_at=answers.now(), **base)
        try:
            checked = await checks.check_proposal(
                proposal, verified.workflow_id, allowlist=self.allowlist, resolver=self.resolver)
        except (errors.ValidationFailed, errors.ShadowRefused) as exc:
            if isinstance(exc, errors.StaleRevision | errors.ResourceNotFound):
                # The target check failed — perhaps because this proposal's own command
                # already ran (it moved the revision, or removed the target) and this is a
                # redelivery. Asked only here, off the hot path: the ledger answers first.
                known = await self._answer_from_ledger(proposal, base)
                if known is not None:
                    return known
            # The identity is verified: the attempt is audited in its tenant (R1.5, R8.4) —
            # nothing else is written.
            await self._audit_rejection(proposal, exc)
            return AdmissionResultV1.refused(exc, decided_at=answers.now(), **base)
        spec = checked.spec
        spans.annotate(connector=spec.connector)
        request_hash = checks.request_hash(proposal, checked, verified)
        if not self.cipher.holds(proposal.tenant_id):
            # The tenant's data key, fetched (and cached) before the transaction when cold,
            # so encrypting inside it is CPU only.
            async with self.pool.acquire() as conn:
                await self.cipher.warm(conn, proposal.tenant_id)

        prep = transaction.Prepared(
            proposal, checked, request_hash, trace, contextvars.copy_context())
        decided = await self.batches.run(proposal.tenant_id, prep)
        base |= {"decision_id": decided.decision.decision_id,
                 "policy_version": decided.decision.policy_version}
        if decided.refused is not None:
            return AdmissionResultV1.refused(decided.refused, decided_at=answers.now(), **base)
        admitted = decided.admitted
        if admitted is None:
            # Approval required: its own transaction (approvals.request), where the request,
            # its decision and audit commit together.
            assert decided.pending is not None
            async with self.pool.acquire() as conn:
                return await self._request_approval(
                    conn, proposal, spec, decided.pending, decided.record, base,
                    decided.charges, decided.quorum)
        if admitted.status == "conflict":
            return answers.conflict(base)
        return AdmissionResultV1(
            **base, status=admitted.status, state=admitted.recorded.state,
            outcome=answers.recorded_outcome(admitted.recorded, proposal), decided_at=answers.now())

    async def check(self, proposal: ProposalV1) -> tuple[allowlist_mod.ActionSpec, dict[str, Any]]:
        """Every check before the policy, writing nothing (for evaluation runs, R9.2).

        Raises:
            IdentityRejected, ValidationFailed (incl. UnknownAction, InvalidArguments,
            ResourceNotFound, StaleRevision), ShadowRefused.
        """
        checked = await checks.check_proposal(
            proposal, checks.verify_identity(proposal, self.envelope_keys).workflow_id,
            allowlist=self.allowlist, resolver=self.resolver)
        return checked.spec, checked.arguments

    async def _answer_from_ledger(
        self, proposal: ProposalV1, base: dict[str, Any]
    ) -> AdmissionResultV1 | None:
        """The answer for a proposal whose operation id already holds a command, or None.

        A redelivered proposal (its first delivery's batch failed on the database after the
        command was admitted, or approved later) finds the target moved by its own command:
        it is the ``replayed`` answer with the recorded state and outcome — or a
        ``conflict`` when the content differs — audited as the normal path audits them, not
        a ``stale_revision`` rejection that would tell the agent its command did not run.
        """
        spec = self.allowlist.get(proposal.action)
        request_hash = canonical.request_hash(
            tenant_id=proposal.tenant_id, principal_id=proposal.principal_id,
            action=spec.name, target=proposal.target,
            arguments=spec.validate(proposal.arguments),
            expected_revision=proposal.expected_revision)
        async with self.pool.acquire() as conn, \
                repository.transaction(conn, proposal.tenant_id) as tx:
            found = await repository.replay_in(
                tx, tenant_id=proposal.tenant_id, operation_id=proposal.operation_id,
                principal_id=proposal.principal_id, request_hash=request_hash,
                audit={**answers.proposal_audit(proposal, spec),
                       "answered_from": "ledger, before the target check"})
        if found is None:
            return None
        if found.status == "conflict":
            return answers.conflict(base)
        return AdmissionResultV1(
            **base, status="replayed", state=found.recorded.state,
            outcome=answers.recorded_outcome(found.recorded, proposal), decided_at=answers.now())

    async def _audit_rejection(
        self, proposal: ProposalV1, error: errors.AgentLedgerError
    ) -> None:
        async with self.pool.acquire() as conn, \
                repository.transaction(conn, proposal.tenant_id) as tx:
            await repository.append_event(
                tx, tenant_id=proposal.tenant_id, operation_id=proposal.operation_id,
                family="audit", type="proposal.rejected",
                payload={"operation_id": str(proposal.operation_id),
                         "proposal_id": str(proposal.proposal_id),
                         "principal_id": proposal.principal_id, "action": proposal.action,
                         "target": proposal.target, "code": error.code,
                         "planner": proposal.planner.name, "model": proposal.planner.model})

    async def _request_approval(
        self, conn: repository.Conn, proposal: ProposalV1, spec: allowlist_mod.ActionSpec,
        command: repository.NewCommand, record: Any, base: dict[str, Any],
        charges: str | None = None, quorum: quorum_mod.Quorum = quorum_mod.ONE,
    ) -> AdmissionResultV1:
        # Evidence excerpts are business data the planner read: encrypted at rest like the
        # payload (R3.6); the row keeps refs, sources and digests in the clear.
        full = [e.model_dump(mode="json") for e in proposal.evidence]
        sealed: tuple[bytes, int] | tuple[None, None] = (None, None)
        if full:
            sealed = await self.cipher.encrypt(
                conn, proposal.tenant_id, approvals.evidence_aad(proposal.operation_id),
                json.dumps(full).encode())
        requested = await approvals.request(conn, approvals.NewApproval(
            command=command, proposal_id=proposal.proposal_id, risk=spec.risk,
            evidence=[{k: v for k, v in e.items() if k != "excerpt"} for e in full],
            evidence_ciphertext=sealed[0], evidence_key_version=sealed[1], charges=charges,
            quorum=quorum,
        ), also=record, audit=answers.proposal_audit(proposal, spec),
            routed=router.requested if (router := self.notifications) else None)
        if requested.status == "budget_refused":
            assert requested.refused_by is not None
            return AdmissionResultV1.refused(answers.budget_refusal(requested.refused_by),
                                             decided_at=answers.now(), **base)
        if requested.status == "replayed_envelope":
            exc = errors.IdentityRejected(
                "this proposal id was already requested with other content: a replayed "
                "envelope; nothing was changed")
            await self._audit_rejection(proposal, exc)
            return AdmissionResultV1.refused(exc, decided_at=answers.now(), **base)
        if requested.status == "conflict":
            return answers.conflict(base)
        if requested.status == "admitted":
            assert requested.recorded is not None
            return AdmissionResultV1(
                **base, status="replayed", state=requested.recorded.state,
                outcome=answers.recorded_outcome(requested.recorded, proposal),
                decided_at=answers.now())
        assert requested.approval is not None
        return AdmissionResultV1(**base, status="pending_approval",
                                 approval_id=requested.approval.approval_id,
                                 decided_at=answers.now())
