"""Admission: the only place that turns a proposal into an approved, persisted command (R1.6).

Order of checks: the identity envelope signed by ingress must verify and bind the proposal's
tenant, principal and operation id (R1.1); shadow runs are refused (R9.2); the action must be
on the versioned allowlist (R1.2) and its arguments satisfy the closed schema (R1.3); the
target must resolve inside the tenant at the expected revision (R1.4); the current policy
decides allow / require approval / deny, and the decision is persisted (R2.9). Then the
request hash is computed over the validated fields (R2.2), the payload is encrypted (R3.6),
and the command is admitted once (R4) — or persisted as a pending approval request (R2.8).
A target check that fails for an operation id the ledger already holds is answered from the
ledger (``replayed`` or ``conflict``): a redelivered proposal whose own command moved the
revision did run, and must not be told it was stale.
"""

from __future__ import annotations

import contextvars
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import asyncpg
from opentelemetry.trace import get_tracer

from agentledger import budgets, canonical, errors, faults, identity
from agentledger.approvals import quorum as quorum_mod
from agentledger.approvals import repository as approvals
from agentledger.budgets import rules as operator_budgets
from agentledger.contracts import admission as admission_contract
from agentledger.contracts import common, outcomes
from agentledger.contracts.proposals import ProposalV1
from agentledger.ledger import admitbatch, batchcommit, groupcommit, keys, repository
from agentledger.notify import outbox as notify_outbox
from agentledger.policy import allowlist as allowlist_mod
from agentledger.policy import cedar
from agentledger.policy import decision as decision_mod
from agentledger.policy import repository as policy_repo
from agentledger.resources import Resolver
from agentledger.telemetry import metrics as telemetry_metrics
from agentledger.telemetry import spans

AdmissionResultV1 = admission_contract.AdmissionResultV1

# How long a decision stays valid: an auto-approved command still queued after this is
# `expired` at dispatch, never executed on a stale decision (R2.6).
DEFAULT_DECISION_TTL = timedelta(minutes=15)
# How long a person has to decide, and how long an approved command stays dispatchable.
DEFAULT_APPROVAL_TTL = timedelta(hours=1)

tracer = get_tracer("agentledger.admission")


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class _Checked:
    spec: allowlist_mod.ActionSpec
    arguments: dict[str, Any]
    workflow_id: str | None


@dataclass(frozen=True)
class _Prepared:
    """A proposal past every check before the policy: what its transaction decides on."""

    proposal: ProposalV1
    checked: _Checked
    request_hash: bytes
    trace: common.TraceContext | None
    # The admission span's context: a batch's per-item spans are its children.
    context: contextvars.Context


@dataclass(frozen=True)
class _Batchable:
    """An allowed command the batch's one statement may admit (``admitbatch``)."""

    row: admitbatch.Allowed
    decision: decision_mod.Decision
    record: Callable[[repository.Conn], Awaitable[None]]


@dataclass(frozen=True)
class _Decided:
    """What admission's transaction decided: refused, admitted, or sealed for approval."""

    decision: decision_mod.Decision
    record: Callable[[repository.Conn], Awaitable[None]]
    refused: errors.AgentLedgerError | None = None
    admitted: repository.AdmitResult | None = None
    pending: repository.NewCommand | None = None  # the command an approver must decide on
    charges: str | None = None  # the pending command's budget charges (JSON), reserved with it
    quorum: quorum_mod.Quorum = quorum_mod.ONE  # how many approvers the pending command needs


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
    _group: groupcommit.GroupCommit = field(init=False, repr=False)
    batches: batchcommit.BatchCommit[_Prepared, _Decided] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._group = self.group or groupcommit.GroupCommit(self.pool)
        self.batches = batchcommit.BatchCommit(
            self.pool, body=self._decide_batch, alone=self._decide_alone,
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
            workflow_id = self._verify_identity(proposal)
        except errors.IdentityRejected as exc:
            # Unverified: nothing is written, not even an audit event under a claimed tenant.
            return AdmissionResultV1.refused(exc, decided_at=_now(), **base)
        try:
            checked = await self._check(proposal, workflow_id)
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
            return AdmissionResultV1.refused(exc, decided_at=_now(), **base)
        spec, arguments = checked.spec, checked.arguments
        spans.annotate(connector=spec.connector)
        request_hash = canonical.request_hash(
            tenant_id=proposal.tenant_id, principal_id=proposal.principal_id,
            action=spec.name, target=proposal.target, arguments=arguments,
            expected_revision=proposal.expected_revision)
        if not self.cipher.holds(proposal.tenant_id):
            # The tenant's data key, fetched (and cached) before the transaction when cold,
            # so encrypting inside it is CPU only.
            async with self.pool.acquire() as conn:
                await self.cipher.warm(conn, proposal.tenant_id)

        prep = _Prepared(proposal, checked, request_hash, trace, contextvars.copy_context())
        decided = await self.batches.run(proposal.tenant_id, prep)
        base |= {"decision_id": decided.decision.decision_id,
                 "policy_version": decided.decision.policy_version}
        if decided.refused is not None:
            return AdmissionResultV1.refused(decided.refused, decided_at=_now(), **base)
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
            return _conflict(base)
        return AdmissionResultV1(
            **base, status=admitted.status, state=admitted.recorded.state,
            outcome=recorded_outcome(admitted.recorded, proposal), decided_at=_now())

    async def _decide_alone(self, prep: _Prepared) -> _Decided:
        """One proposal's transaction, per row: its principal read, Cedar, its writes (a
        deadlock victim runs again, bounded, as ``groupcommit`` runs a unit alone)."""

        async def decide(conn: repository.Conn) -> _Decided:
            # One transaction decides and, when allowed, spends the budget, admits and
            # records the decision: the budget stays exact (spend and admission commit or
            # roll back together) and a refusal's audit event commits with nothing else.
            proposal = prep.proposal
            async with repository.transaction(conn, proposal.tenant_id) as tx:
                decision = await self._authorize(tx, proposal, prep.checked.spec,
                                                 prep.checked.arguments)
                decided = await self._decide_in(tx, prep, decision)
                assert isinstance(decided, _Decided)
                await faults.point("admission.before_commit")
                return decided

        # Alone, not grouped: a lone proposal is one transaction anyway (one batch of a
        # tenant is in its transaction at a time), and one whose batch fell back must meet its
        # failure once, not again in a group.
        return await self._group.run_alone(decide)

    async def _decide_batch(self, tx: repository.Conn, preps: Sequence[_Prepared]
                            ) -> list[_Decided]:
        """The transaction of a batch of one tenant's proposals (``batchcommit``): one
        statement reads every principal (before Cedar, as per row), one admits every allowed
        command that is new and has budget room; the rest (a denial's record, a replay, a
        budget without room for the batch, the operator's budgets) take the per-row
        statements inside the same transaction."""
        tenant_id = preps[0].proposal.tenant_id
        found = await policy_repo.lookup_principals(
            tx, tenant_id, (p.proposal.principal_id for p in preps))
        out: list[_Decided | None] = [None] * len(preps)
        allowed: dict[UUID, tuple[int, _Batchable]] = {}
        again: list[tuple[int, _Batchable]] = []  # a key twice in the batch: after the first
        for i, prep in enumerate(preps):
            decision = prep.context.run(
                self._authorize_known, found.get(prep.proposal.principal_id), prep)
            decided = await self._decide_in(tx, prep, decision, batchable=True)
            if not isinstance(decided, _Batchable):
                out[i] = decided
            elif prep.proposal.operation_id in allowed:
                again.append((i, decided))
            else:
                allowed[prep.proposal.operation_id] = (i, decided)
        if allowed:
            answers = await admitbatch.admit_allowed_batch(
                tx, tenant_id, [b.row for _, b in allowed.values()],
                tool_call_limit=self.budget_limits.get("tool_calls"))
            for (i, b), answer in zip(allowed.values(), answers, strict=True):
                if answer is not None:
                    out[i] = _Decided(b.decision, b.record, admitted=answer)
                else:  # a replay, a conflict, no budget room for the batch: per row
                    again.append((i, b))
        for i, b in sorted(again, key=lambda pair: pair[0]):
            out[i] = await self._admit_row(tx, preps[i], b)
        await faults.point("admission.before_commit")
        return [d for d in out if d is not None]

    async def _decide_in(self, tx: repository.Conn, prep: _Prepared,
                         decision: decision_mod.Decision, *, batchable: bool = False,
                         ) -> _Decided | _Batchable:
        """What the decision means inside the proposal's transaction: a denial recorded, a
        command sealed for approval, or admitted (``batchable``: an allowed command the
        batch's statement can admit is handed back instead)."""
        proposal, spec, arguments = prep.proposal, prep.checked.spec, prep.checked.arguments

        async def record(tx: repository.Conn) -> None:
            await policy_repo.record_decision(
                tx, decision, tenant_id=proposal.tenant_id,
                principal_id=proposal.principal_id, action=spec.name,
                resource_id=proposal.target, operation_id=proposal.operation_id)

        if decision.effect == "deny":
            await record(tx)
            return _Decided(decision, record, refused=errors.PolicyDenied(decision.reason))
        ciphertext, key_version = await self.cipher.encrypt(
            tx, proposal.tenant_id, proposal.operation_id, canonical.canonical_bytes(arguments))
        approval = decision.effect != "allow"  # require_approval
        trace = prep.trace
        # The command, built once: admitted now, or held by the approval request.
        command = repository.NewCommand(
            tenant_id=proposal.tenant_id, operation_id=proposal.operation_id,
            request_hash=prep.request_hash, principal_id=proposal.principal_id,
            action=spec.name, connector=spec.connector, resource_id=proposal.target,
            expected_revision=proposal.expected_revision,
            decision_id=decision.decision_id, policy_version=decision.policy_version,
            allowlist_version=self.allowlist.version,
            expires_at=_now() + (self.approval_ttl if approval else self.decision_ttl),
            payload_ciphertext=ciphertext, payload_key_version=key_version,
            traceparent=trace.traceparent if trace else None,
            tracestate=trace.tracestate if trace else None)
        charges = self._charges(proposal, spec, prep.checked)
        if approval:
            return _Decided(decision, record, pending=command, charges=charges,
                            quorum=self.approval_rules.quorum(spec.name, arguments))
        workflow_id = prep.checked.workflow_id
        if batchable and charges is None and not set(self.budget_limits) - {"tool_calls"}:
            budgeted = workflow_id is not None and "tool_calls" in self.budget_limits
            return _Batchable(admitbatch.Allowed(
                command, workflow_id if budgeted else None, _proposal_audit(proposal, spec),
                json.dumps(list(getattr(decision, "reasons", ()))), decision.reason),
                decision, record)
        found = await self._admit_allowed(
            tx, proposal, spec, workflow_id, command, decision, record, charges)
        if isinstance(found, errors.BudgetExhausted):
            return _Decided(decision, record, refused=found)
        return _Decided(decision, record, admitted=found)

    async def _admit_row(self, tx: repository.Conn, prep: _Prepared, b: _Batchable
                         ) -> _Decided:
        """The per-row general path for a command the batch's statement wrote nothing for."""
        found = await self._admit_allowed(
            tx, prep.proposal, prep.checked.spec, prep.checked.workflow_id, b.row.command,
            b.decision, b.record, None, fast=False)
        if isinstance(found, errors.BudgetExhausted):
            return _Decided(b.decision, b.record, refused=found)
        return _Decided(b.decision, b.record, admitted=found)

    def _authorize_known(self, found: cedar.Principal | None, prep: _Prepared
                         ) -> decision_mod.Decision:
        """:meth:`_authorize` with the principal read by the batch's one statement."""
        proposal, spec = prep.proposal, prep.checked.spec
        with spans.span(tracer, "authorization", attributes={spans.STAGE: "admission"}) as authz:
            decision = self.authorizer.authorize_known(
                found, tenant_id=proposal.tenant_id, principal_id=proposal.principal_id,
                action=spec, resource_id=proposal.target, arguments=prep.checked.arguments)
            authz.set_attributes({spans.EFFECT: decision.effect,
                                  spans.POLICY_VERSION: decision.policy_version})
        telemetry_metrics.authorizations.add(1, stage="admission", outcome=decision.effect)
        return decision

    async def _authorize(
        self, tx: repository.Conn, proposal: ProposalV1, spec: allowlist_mod.ActionSpec,
        arguments: dict[str, Any],
    ) -> decision_mod.Decision:
        with spans.span(tracer, "authorization", attributes={spans.STAGE: "admission"}) as authz:
            decision = await self.authorizer.authorize(
                tx, tenant_id=proposal.tenant_id, principal_id=proposal.principal_id,
                action=spec, resource_id=proposal.target, arguments=arguments,
                in_transaction=True)
            authz.set_attributes({spans.EFFECT: decision.effect,
                                  spans.POLICY_VERSION: decision.policy_version})
        telemetry_metrics.authorizations.add(1, stage="admission", outcome=decision.effect)
        return decision

    async def _admit_allowed(
        self, tx: repository.Conn, proposal: ProposalV1, spec: allowlist_mod.ActionSpec,
        workflow_id: str | None, command: repository.NewCommand,
        decision: decision_mod.Decision,
        record: Callable[[repository.Conn], Awaitable[None]], charges: str | None = None,
        *, fast: bool = True,
    ) -> repository.AdmitResult | errors.BudgetExhausted:
        """Inside the caller's transaction: spend one tool call of the request's budget
        (R7.2) and admit, with the decision, in one statement (issue 41); a replay, a
        conflict or a budget without room take the general path: reserve, admit, record the
        decision, and spend the tool call only on the first admission (a replay or conflict
        releases it). ``fast=False``: straight to the general path (the batch's statement
        already wrote nothing for this command)."""
        budgeted = workflow_id is not None and "tool_calls" in self.budget_limits
        if fast and not set(self.budget_limits) - {"tool_calls"}:
            one = await repository.admit_allowed(
                tx, command, workflow_id=workflow_id if budgeted else None,
                tool_call_limit=self.budget_limits.get("tool_calls") if budgeted else None,
                audit=_proposal_audit(proposal, spec),
                decision_reasons=json.dumps(list(getattr(decision, "reasons", ()))),
                decision_reason=decision.reason, charges=charges)
            if isinstance(one, repository.BudgetRefused):
                return budget_refusal(one.budget)
            if one is not None:
                return one
        reservation = None
        if workflow_id is not None and "tool_calls" in self.budget_limits:
            await budgets.open_in(tx, proposal.tenant_id, workflow_id, self.budget_limits, None)
            reserved = await budgets.reserve_in(
                tx, proposal.tenant_id, workflow_id, "tool_calls", 1,
                operation_id=proposal.operation_id)
            if isinstance(reserved, errors.BudgetExhausted):
                if not await repository.is_recorded(tx, proposal.tenant_id,
                                                    proposal.operation_id):
                    return reserved  # its audit event commits; nothing else was written
                # A redelivered proposal whose command was admitted (and its tool call
                # spent) earlier: answered as the replay (or conflict) it is, spending nothing.
            else:
                reservation = reserved
        if charges is not None and not await repository.is_recorded(
                tx, proposal.tenant_id, proposal.operation_id):
            refused = await repository.charge_budgets(
                tx, proposal.tenant_id, proposal.operation_id, charges)
            if refused is not None:
                if reservation is not None:
                    await budgets.settle_in(tx, reservation, None)
                return budget_refusal(refused.budget)
        result = await repository.admit_in(tx, command, audit=_proposal_audit(proposal, spec))
        await record(tx)
        if reservation is not None:
            await budgets.settle_in(tx, reservation, 1 if result.status == "admitted" else None)
        return result

    def _charges(self, proposal: ProposalV1, spec: allowlist_mod.ActionSpec,
                 checked: _Checked) -> str | None:
        """The operator's budgets this command falls under, as the ledger charges them."""
        if not self.budget_rules.budgets:
            return None
        usage = proposal.usage
        return operator_budgets.charges_json(self.budget_rules.charges(
            action=spec.name, arguments=checked.arguments, principal_id=proposal.principal_id,
            run_id=checked.workflow_id,
            tokens=usage.prompt_tokens + usage.completion_tokens if usage else 0,
            now=self.clock()))

    async def check(self, proposal: ProposalV1) -> tuple[allowlist_mod.ActionSpec, dict[str, Any]]:
        """Every check before the policy, writing nothing (for evaluation runs, R9.2).

        Raises:
            IdentityRejected, ValidationFailed (incl. UnknownAction, InvalidArguments,
            ResourceNotFound, StaleRevision), ShadowRefused.
        """
        checked = await self._check(proposal, self._verify_identity(proposal))
        return checked.spec, checked.arguments

    def _verify_identity(self, proposal: ProposalV1) -> str | None:
        """The envelope must verify and bind tenant, principal and operation (R1.1).

        Returns the request id it names (the workflow of budgets), or None when identity is
        bound some other way (library use without envelope keys).
        """
        if self.envelope_keys is None:
            return None
        if proposal.identity is None:
            raise errors.IdentityRejected("the proposal carries no identity envelope")
        found = identity.verify_envelope(proposal.identity, self.envelope_keys)
        identity.check_bound(found, tenant_id=proposal.tenant_id,
                             principal_id=proposal.principal_id,
                             operation_id=proposal.operation_id)
        if found.binding.kind == "proposal":
            # A gateway's proposal: exactly the content ingress accepted (issue 17 §6).
            try:
                bound = identity.proposal_binding(
                    tenant_id=proposal.tenant_id, principal_id=proposal.principal_id,
                    action=proposal.action, target=proposal.target,
                    arguments=proposal.arguments, expected_revision=proposal.expected_revision)
            except errors.ValidationFailed as exc:
                raise errors.IdentityRejected(
                    "the proposal differs from the content its envelope was issued for") from exc
            identity.check_content(found, bound)
        elif proposal.proposal_id != identity.planned_proposal_id(found.request_id):
            # A planner's proposal carries its request's envelope: the one proposal planned
            # from that request, whose content approvals bind to its id (``approvals.request``).
            raise errors.IdentityRejected(
                "the proposal is not the one planned from its envelope's request")
        return str(found.request_id)

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
                audit={**_proposal_audit(proposal, spec),
                       "answered_from": "ledger, before the target check"})
        if found is None:
            return None
        if found.status == "conflict":
            return _conflict(base)
        return AdmissionResultV1(
            **base, status="replayed", state=found.recorded.state,
            outcome=recorded_outcome(found.recorded, proposal), decided_at=_now())

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

    async def _check(self, proposal: ProposalV1, workflow_id: str | None) -> _Checked:
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
                violations=[{"path": "/arguments/customer_id", "message": "must equal target"}])
        resource = await self.resolver.resolve(proposal.tenant_id, spec.connector, proposal.target)
        if spec.requires_revision and resource.revision != proposal.expected_revision:
            raise errors.StaleRevision(
                "the target changed since it was read; plan again on the current record")
        return _Checked(spec, arguments, workflow_id)

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
        ), also=record, audit=_proposal_audit(proposal, spec),
            routed=router.requested if (router := self.notifications) else None)
        if requested.status == "budget_refused":
            assert requested.refused_by is not None
            return AdmissionResultV1.refused(budget_refusal(requested.refused_by),
                                             decided_at=_now(), **base)
        if requested.status == "replayed_envelope":
            exc = errors.IdentityRejected(
                "this proposal id was already requested with other content: a replayed "
                "envelope; nothing was changed")
            await self._audit_rejection(proposal, exc)
            return AdmissionResultV1.refused(exc, decided_at=_now(), **base)
        if requested.status == "conflict":
            return _conflict(base)
        if requested.status == "admitted":
            assert requested.recorded is not None
            return AdmissionResultV1(
                **base, status="replayed", state=requested.recorded.state,
                outcome=recorded_outcome(requested.recorded, proposal), decided_at=_now())
        assert requested.approval is not None
        return AdmissionResultV1(**base, status="pending_approval",
                                 approval_id=requested.approval.approval_id, decided_at=_now())


def budget_refusal(budget: str) -> errors.BudgetExhausted:
    """The refusal naming the operator's budget that had no room (issue 42)."""
    return errors.BudgetExhausted(
        f"budget {budget!r} has no room for this command; nothing was admitted")


def _conflict(base: dict[str, Any]) -> AdmissionResultV1:
    """The answer to a proposal whose operation id holds a different request."""
    return AdmissionResultV1.refused(errors.IdempotencyConflict(
        "operation id already bound to a different request; nothing was changed",
    ), decided_at=_now(), **base)


def _proposal_audit(proposal: ProposalV1, spec: allowlist_mod.ActionSpec) -> dict[str, Any]:
    """What the audit keeps of a proposal: who planned it on which evidence — hashes and
    sources only, never the evidence text, the prompt or the payload (R8.5)."""
    return {"proposal_id": str(proposal.proposal_id), "planner": proposal.planner.name,
            "model": proposal.planner.model, "risk": spec.risk,
            "evidence": [{"ref": e.ref, "source": e.source, "sha256": e.sha256,
                          "fetched_at": e.fetched_at.isoformat()} for e in proposal.evidence],
            "usage": proposal.usage.model_dump() if proposal.usage else None}


def recorded_outcome(
    recorded: repository.Recorded, proposal: ProposalV1
) -> outcomes.Outcome | None:
    """The outcome a replay returns: what the ledger recorded, or None while in flight."""
    return outcomes.of_state(proposal.operation_id, recorded.state, recorded.provider_receipt,
                             recorded.outcome_reason or recorded.state)
