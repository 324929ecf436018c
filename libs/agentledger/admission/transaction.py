"""Admission's transaction: the policy decides, and what it decides is written (R2.9, R4, R7).

One transaction per proposal (``decide_alone``) or per batch of one tenant's proposals
(``decide_batch``, run by ``batchcommit``): the principal read, Cedar, then a denial's
decision record, a command sealed for approval (written in its own transaction by the
admitter), or an allowed command admitted with its budget spend, outbox row, audit event and
decision — in one statement for every command of a batch that can take it (``admitbatch``),
per row for the rest. Spend and admission commit or roll back together, so the budget stays
exact.
"""

from __future__ import annotations

import contextvars
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol
from uuid import UUID

from opentelemetry.trace import get_tracer

from agentledger import budgets, canonical, errors, faults
from agentledger.admission import answers, checks
from agentledger.approvals import quorum as quorum_mod
from agentledger.budgets import rules as operator_budgets
from agentledger.contracts import common
from agentledger.contracts.proposals import ProposalV1
from agentledger.ledger import admitbatch, groupcommit, keys, repository
from agentledger.policy import allowlist as allowlist_mod
from agentledger.policy import cedar
from agentledger.policy import decision as decision_mod
from agentledger.policy import repository as policy_repo
from agentledger.telemetry import metrics as telemetry_metrics
from agentledger.telemetry import spans

# Admission's instrumentation scope, the one ``admitter``'s admission span has.
tracer = get_tracer("agentledger.admission")


class Settings(Protocol):
    """What the transaction decides under: the ``Admitter``'s fields, read at each use (a
    test swaps the rules of a running admitter)."""

    allowlist: allowlist_mod.Allowlist
    authorizer: decision_mod.Authorizer
    cipher: keys.PayloadCipher
    budget_limits: Mapping[budgets.Kind, int]
    budget_rules: operator_budgets.Budgets
    approval_rules: quorum_mod.ApprovalRules
    decision_ttl: timedelta
    approval_ttl: timedelta

    # Read-only here: mypy reads a dataclass field of a callable type as a read-only one.
    @property
    def clock(self) -> operator_budgets.Clock: ...


@dataclass(frozen=True)
class Prepared:
    """A proposal past every check before the policy: what its transaction decides on."""

    proposal: ProposalV1
    checked: checks.Checked
    request_hash: bytes
    trace: common.TraceContext | None
    # The admission span's context: a batch's per-item spans are its children.
    context: contextvars.Context


@dataclass(frozen=True)
class Batchable:
    """An allowed command the batch's one statement may admit (``admitbatch``)."""

    row: admitbatch.Allowed
    decision: decision_mod.Decision
    record: Callable[[repository.Conn], Awaitable[None]]


@dataclass(frozen=True)
class Decided:
    """What admission's transaction decided: refused, admitted, or sealed for approval."""

    decision: decision_mod.Decision
    record: Callable[[repository.Conn], Awaitable[None]]
    refused: errors.AgentLedgerError | None = None
    admitted: repository.AdmitResult | None = None
    pending: repository.NewCommand | None = None  # the command an approver must decide on
    charges: str | None = None  # the pending command's budget charges (JSON), reserved with it
    quorum: quorum_mod.Quorum = quorum_mod.ONE  # how many approvers the pending command needs


@dataclass(frozen=True)
class Transaction:
    """Decides prepared proposals in admission's transaction. One per ``Admitter``."""

    settings: Settings
    # Runs a lone proposal's transaction (its deadlock retries, its COMMIT).
    group: groupcommit.GroupCommit

    async def decide_alone(self, prep: Prepared) -> Decided:
        """One proposal's transaction, per row: its principal read, Cedar, its writes (a
        deadlock victim runs again, bounded, as ``groupcommit`` runs a unit alone)."""

        async def decide(conn: repository.Conn) -> Decided:
            # One transaction decides and, when allowed, spends the budget, admits and
            # records the decision: the budget stays exact (spend and admission commit or
            # roll back together) and a refusal's audit event commits with nothing else.
            proposal = prep.proposal
            async with repository.transaction(conn, proposal.tenant_id) as tx:
                decision = await self._authorize(tx, prep)
                decided = await self._decide_in(tx, prep, decision)
                assert isinstance(decided, Decided)
                await faults.point("admission.before_commit")
                return decided

        # Alone, not grouped: a lone proposal is one transaction anyway (one batch of a
        # tenant is in its transaction at a time), and one whose batch fell back must meet its
        # failure once, not again in a group.
        return await self.group.run_alone(decide)

    async def decide_batch(self, tx: repository.Conn, preps: Sequence[Prepared]
                           ) -> list[Decided]:
        """The transaction of a batch of one tenant's proposals (``batchcommit``): one
        statement reads every principal (before Cedar, as per row), one admits every allowed
        command that is new and has budget room; the rest (a denial's record, a replay, a
        budget without room for the batch, the operator's budgets) take the per-row
        statements inside the same transaction."""
        tenant_id = preps[0].proposal.tenant_id
        found = await policy_repo.lookup_principals(
            tx, tenant_id, (p.proposal.principal_id for p in preps))
        out: list[Decided | None] = [None] * len(preps)
        allowed: dict[UUID, tuple[int, Batchable]] = {}
        again: list[tuple[int, Batchable]] = []  # a key twice in the batch: after the first
        for i, prep in enumerate(preps):
            decision = prep.context.run(
                self._authorize_known, found.get(prep.proposal.principal_id), prep)
            decided = await self._decide_in(tx, prep, decision, batchable=True)
            if not isinstance(decided, Batchable):
                out[i] = decided
            elif prep.proposal.operation_id in allowed:
                again.append((i, decided))
            else:
                allowed[prep.proposal.operation_id] = (i, decided)
        if allowed:
            results = await admitbatch.admit_allowed_batch(
                tx, tenant_id, [b.row for _, b in allowed.values()],
                tool_call_limit=self.settings.budget_limits.get("tool_calls"))
            for (i, b), answer in zip(allowed.values(), results, strict=True):
                if answer is not None:
                    out[i] = Decided(b.decision, b.record, admitted=answer)
                else:  # a replay, a conflict, no budget room for the batch: per row
                    again.append((i, b))
        for i, b in sorted(again, key=lambda pair: pair[0]):
            out[i] = await self._admit_row(tx, preps[i], b)
        await faults.point("admission.before_commit")
        return [d for d in out if d is not None]

    async def _decide_in(self, tx: repository.Conn, prep: Prepared,
                         decision: decision_mod.Decision, *, batchable: bool = False,
                         ) -> Decided | Batchable:
        """What the decision means inside the proposal's transaction: a denial recorded, a
        command sealed for approval, or admitted (``batchable``: an allowed command the
        batch's statement can admit is handed back instead)."""
        settings = self.settings
        proposal, spec, arguments = prep.proposal, prep.checked.spec, prep.checked.arguments

        async def record(tx: repository.Conn) -> None:
            await policy_repo.record_decision(
                tx, decision, tenant_id=proposal.tenant_id,
                principal_id=proposal.principal_id, action=spec.name,
                resource_id=proposal.target, operation_id=proposal.operation_id)

        if decision.effect == "deny":
            await record(tx)
            return Decided(decision, record, refused=errors.PolicyDenied(decision.reason))
        ciphertext, key_version = await settings.cipher.encrypt(
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
            allowlist_version=settings.allowlist.version,
            expires_at=answers.now() + (
                settings.approval_ttl if approval else settings.decision_ttl),
            payload_ciphertext=ciphertext, payload_key_version=key_version,
            traceparent=trace.traceparent if trace else None,
            tracestate=trace.tracestate if trace else None)
        charges = self._charges(prep)
        if approval:
            return Decided(decision, record, pending=command, charges=charges,
                           quorum=settings.approval_rules.quorum(spec.name, arguments))
        workflow_id = prep.checked.workflow_id
        if batchable and charges is None and not set(settings.budget_limits) - {"tool_calls"}:
            budgeted = workflow_id is not None and "tool_calls" in settings.budget_limits
            return Batchable(admitbatch.Allowed(
                command, workflow_id if budgeted else None, answers.proposal_audit(proposal, spec),
                json.dumps(list(getattr(decision, "reasons", ()))), decision.reason),
                decision, record)
        found = await self._admit_allowed(
            tx, proposal, spec, workflow_id, command, decision, record, charges)
        if isinstance(found, errors.BudgetExhausted):
            return Decided(decision, record, refused=found)
        return Decided(decision, record, admitted=found)

    async def _admit_row(self, tx: repository.Conn, prep: Prepared, b: Batchable
                         ) -> Decided:
        """The per-row general path for a command the batch's statement wrote nothing for."""
        found = await self._admit_allowed(
            tx, prep.proposal, prep.checked.spec, prep.checked.workflow_id, b.row.command,
            b.decision, b.record, None, fast=False)
        if isinstance(found, errors.BudgetExhausted):
            return Decided(b.decision, b.record, refused=found)
        return Decided(b.decision, b.record, admitted=found)

    def _authorize_known(self, found: cedar.Principal | None, prep: Prepared
                         ) -> decision_mod.Decision:
        """:meth:`_authorize` with the principal read by the batch's one statement."""
        proposal, spec = prep.proposal, prep.checked.spec
        with spans.span(tracer, "authorization", attributes={spans.STAGE: "admission"}) as authz:
            decision = self.settings.authorizer.authorize_known(
                found, tenant_id=proposal.tenant_id, principal_id=proposal.principal_id,
                action=spec, resource_id=proposal.target, arguments=prep.checked.arguments)
            authz.set_attributes({spans.EFFECT: decision.effect,
                                  spans.POLICY_VERSION: decision.policy_version})
        telemetry_metrics.authorizations.add(1, stage="admission", outcome=decision.effect)
        return decision

    async def _authorize(self, tx: repository.Conn, prep: Prepared) -> decision_mod.Decision:
        proposal, spec = prep.proposal, prep.checked.spec
        with spans.span(tracer, "authorization", attributes={spans.STAGE: "admission"}) as authz:
            decision = await self.settings.authorizer.authorize(
                tx, tenant_id=proposal.tenant_id, principal_id=proposal.principal_id,
                action=spec, resource_id=proposal.target, arguments=prep.checked.arguments,
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
        budget_limits = self.settings.budget_limits
        budgeted = workflow_id is not None and "tool_calls" in budget_limits
        if fast and not set(budget_limits) - {"tool_calls"}:
            one = await repository.admit_allowed(
                tx, command, workflow_id=workflow_id if budgeted else None,
                tool_call_limit=budget_limits.get("tool_calls") if budgeted else None,
                audit=answers.proposal_audit(proposal, spec),
                decision_reasons=json.dumps(list(getattr(decision, "reasons", ()))),
                decision_reason=decision.reason, charges=charges)
            if isinstance(one, repository.BudgetRefused):
                return answers.budget_refusal(one.budget)
            if one is not None:
                return one
        reservation = None
        if workflow_id is not None and "tool_calls" in budget_limits:
            await budgets.open_in(tx, proposal.tenant_id, workflow_id, budget_limits, None)
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
                return answers.budget_refusal(refused.budget)
        result = await repository.admit_in(
            tx, command, audit=answers.proposal_audit(proposal, spec))
        await record(tx)
        if reservation is not None:
            await budgets.settle_in(tx, reservation, 1 if result.status == "admitted" else None)
        return result

    def _charges(self, prep: Prepared) -> str | None:
        """The operator's budgets this command falls under, as the ledger charges them."""
        rules = self.settings.budget_rules
        if not rules.budgets:
            return None
        proposal, checked = prep.proposal, prep.checked
        usage = proposal.usage
        return operator_budgets.charges_json(rules.charges(
            action=checked.spec.name, arguments=checked.arguments,
            principal_id=proposal.principal_id, run_id=checked.workflow_id,
            tokens=usage.prompt_tokens + usage.completion_tokens if usage else 0,
            now=self.settings.clock()))
